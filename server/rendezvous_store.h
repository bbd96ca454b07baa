// The key-value store the coordinator serves to site cohorts for their rendezvous: members
// publish their addresses and ids under the round's prefix and wait for each other's.
// Entries live in memory; a round's keys are dropped when the round closes.
//
// Thread-safe. GetAsync blocks no thread: its callback
// runs on the thread that sets the key, or on the store's one timer thread at the deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace tessera::server {

class RendezvousStore {
 public:
  using GetCallback = std::function<void(Result<std::string>)>;

  RendezvousStore() = default;
  ~RendezvousStore();

  void Set(const std::string& key, std::string value);
  // The value of `key`, waiting up to `timeout` for it to be set, without a waiting thread:
  // `done` is called exactly once, with the value, with
  // DeadlineExceeded after `timeout`, or with Unavailable at Shutdown(). Never under the
  // store's lock, possibly before GetAsync returns.
  void GetAsync(const std::string& key, std::chrono::milliseconds timeout, GetCallback done);
  // Fails every pending GetAsync (the coordinator is stopping) and stops the timer thread.
  void Shutdown();
  // Adds `delta` to the counter at `key` (0 when unset); refuses a value that is not a
  // counter, and an overflow.
  Result<int64_t> Add(const std::string& key, int64_t delta);
  void ClearPrefix(const std::string& prefix);
  size_t size() const;

 private:
  struct Waiter {
    std::string key;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
    GetCallback done;
  };
  // Removes the waiters for `key` (under the lock), to be called after it is released.
  std::vector<Waiter> TakeWaitersLocked(const std::string& key);
  void TimerLoop();

  mutable std::mutex mu_;
  std::condition_variable timer_cv_;  // the timer thread
  std::map<std::string, std::string> values_;
  std::multimap<std::string, Waiter> waiters_;  // by key
  std::thread timer_;                           // started with the first waiter
  bool shutdown_ = false;
};

}  // namespace tessera::server
