// One thread that runs callbacks at given times: the simulated clients' heartbeats, join
// retries and simulated compute. A thousand clients need one of these, not a thousand
// sleeping threads.
//
// Thread-safe. Callbacks run on the queue's thread, one at a time, in time order; they must
// not block (they start asynchronous calls and return). A callback may schedule another.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace tessera::loadgen {

class TimerQueue {
 public:
  using Clock = std::chrono::steady_clock;

  TimerQueue();   // starts the thread
  ~TimerQueue();  // Stop()
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `callback` at `when` (at once if it has passed). Dropped after Stop().
  void At(Clock::time_point when, std::function<void()> callback);
  void After(std::chrono::milliseconds delay, std::function<void()> callback);
  // Drops the callbacks not yet run and joins the thread; a callback running now finishes
  // first. Idempotent. Must not be called from a callback.
  void Stop();

 private:
  struct Entry {
    Clock::time_point when;
    uint64_t sequence;  // keeps callbacks due at the same time in the order they were added
    std::function<void()> callback;
    bool operator>(const Entry& other) const {
      return when != other.when ? when > other.when : sequence > other.sequence;
    }
  };
  void Loop();

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> entries_;
  uint64_t next_sequence_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera::loadgen
