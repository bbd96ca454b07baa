// The event log of one job, for `tessera watch`: one event per committed round, notes
// (retries, rejected updates), and a final event when the job ends. Thread-safe; watchers
// block in WaitAfter for at most its timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

class JobEvents {
 public:
  void Publish(v1::JobEvent event);
  void End();  // the job reached a final state; watchers drain and return
  // Events after the first `seen`, waiting up to `timeout` for one. *ended is set once the
  // log is closed and everything has been returned.
  std::vector<v1::JobEvent> WaitAfter(size_t seen, std::chrono::milliseconds timeout, bool* ended);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::JobEvent> events_;
  bool ended_ = false;
};

}  // namespace tessera::server
