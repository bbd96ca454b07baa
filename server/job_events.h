// The event log of one job, for `tessera watch`: one event per committed round, notes
// (retries, rejected updates), and a final event when the job ends.
//
// Watchers are pushed to, not polled: Subscribe() registers a callback that Publish() and
// End() call after each change, and the watcher reads what is new with Since(). Nothing
// blocks. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

class JobEvents {
 public:
  void Publish(v1::JobEvent event);
  void End();  // the job reached a final state; watchers drain and finish

  // Events after the first `seen`. *ended is set once the log is closed and everything has
  // been returned.
  std::vector<v1::JobEvent> Since(size_t seen, bool* ended);

  // `changed` is called after every Publish() and End(), on the publishing thread, without
  // the log's lock held (so it may call Since()); it must not block. It may still be called
  // once or twice just after Unsubscribe() returns, and must then do nothing harmful
  // (capture a weak_ptr, not a raw pointer). Returns the id for Unsubscribe().
  uint64_t Subscribe(std::function<void()> changed);
  void Unsubscribe(uint64_t id);

 private:
  void NotifyWatchers();

  std::mutex mu_;  // guards everything below; never held while calling a watcher
  std::vector<v1::JobEvent> events_;
  bool ended_ = false;
  std::map<uint64_t, std::function<void()>> watchers_;
  uint64_t next_watcher_ = 1;
};

}  // namespace tessera::server
