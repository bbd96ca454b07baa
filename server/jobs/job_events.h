// The event log of one job, for `tessera watch`: one event per committed round, notes
// (retries, rejected updates), and a final event when the job ends.
//
// Watchers are pushed to, not polled: Subscribe() registers a callback that Publish() and
// End() call after each change, and the watcher reads what is new with Since(). Nothing
// blocks. Thread-safe.
//
// Bounded: the log keeps its last `capacity` events (every committed round is in the state
// store as well, which is where a watch starts from). Events are numbered from 0 in the order
// published, and a watcher keeps the number of the next one it wants; one that fell more than
// `capacity` events behind skips forward to the oldest kept, and Since() tells it how many it
// missed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

class JobEvents {
 public:
  static constexpr size_t kDefaultCapacity = 1000;
  explicit JobEvents(size_t capacity = kDefaultCapacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  void Publish(v1::JobEvent event);
  void End();  // the job reached a final state; watchers drain and finish

  // The kept events numbered `seen` and after. *ended is set once the log is closed and
  // everything has been returned. *missed (when given) is set to how many events from `seen`
  // on were dropped before they could be returned; the watcher's next `seen` is
  // seen + *missed + the events returned.
  std::vector<v1::JobEvent> Since(size_t seen, bool* ended, size_t* missed = nullptr);
  // Events published so far, and how many of them are kept.
  size_t published() const;
  size_t kept() const;
  size_t capacity() const { return capacity_; }

  // `changed` is called after every Publish() and End(), on the publishing thread, without
  // the log's lock held (so it may call Since()); it must not block. It may still be called
  // once or twice just after Unsubscribe() returns, and must then do nothing harmful
  // (capture a weak_ptr, not a raw pointer). Returns the id for Unsubscribe().
  uint64_t Subscribe(std::function<void()> changed);
  void Unsubscribe(uint64_t id);

 private:
  void NotifyWatchers();

  const size_t capacity_;
  mutable std::mutex mu_;  // guards everything below; never held while calling a watcher
  std::deque<v1::JobEvent> events_;  // the last capacity_ events
  size_t first_ = 0;                 // the number of events_.front()
  bool ended_ = false;
  std::map<uint64_t, std::function<void()>> watchers_;
  uint64_t next_watcher_ = 1;
};

}  // namespace tessera::server
