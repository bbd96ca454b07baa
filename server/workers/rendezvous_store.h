// The key-value store the coordinator serves to site cohorts for their rendezvous: members
// publish their addresses and ids under the round's prefix and wait for each other's.
// Entries live in memory; a round's keys are dropped when the round closes, and a job's when
// it ends. Keys are written only under a prefix that is open: a round opens its prefix
// (Open) before its tasks go out, and ClearPrefix closes it with its keys, in one step under
// the store's lock, so that a write admitted just before the round closed cannot land after
// its keys were dropped and stay until the job ends.
//
// Bounded (RendezvousLimits): a key's and a value's size, the keys and bytes under one
// cohort's round prefix ("rendezvous/JOB/ROUND/ATTEMPT/COHORT/", a key's first five
// segments), and the keys and bytes of the whole store. A write past a limit is refused with
// RESOURCE_EXHAUSTED (INVALID_ARGUMENT for an oversized key or value) naming the limit, and
// changes nothing. Bytes are a key's length plus its value's.
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
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace tessera::server {

struct RendezvousLimits {
  size_t max_key_bytes = 512;
  size_t max_value_bytes = 64 << 10;     // an address list or a communicator id is far less
  size_t max_keys_per_prefix = 4096;     // per cohort's round prefix
  size_t max_bytes_per_prefix = 4 << 20;
  size_t max_keys = 65536;               // the whole store
  size_t max_bytes = 64 << 20;
  // The longest a StoreGet waits for its key (a longer wait_ms is cut to it).
  std::chrono::milliseconds max_wait{10000};

  // Each value within its range; the error names the field, the range and the value.
  Status Validate() const;
};

class RendezvousStore {
 public:
  using GetCallback = std::function<void(Result<std::string>)>;

  explicit RendezvousStore(RendezvousLimits limits = {}) : limits_(limits) {}
  ~RendezvousStore();

  const RendezvousLimits& limits() const { return limits_; }
  // The quota scope of `key`: its first five '/'-separated segments with the trailing '/',
  // or the whole key when it has fewer.
  static std::string PrefixOf(const std::string& key);

  // Lets keys under `prefix` ("rendezvous/JOB/ROUND/ATTEMPT/", or a cohort's prefix below
  // it) be written, until a ClearPrefix that covers it.
  void Open(const std::string& prefix);
  // FAILED_PRECONDITION, changing nothing, for a key under no open prefix.
  Status Set(const std::string& key, std::string value);
  // The value of `key`, waiting up to `timeout` for it to be set, without a waiting thread:
  // `done` is called exactly once, with the value, with
  // DeadlineExceeded after `timeout`, with FailedPrecondition when a ClearPrefix drops its
  // key's round, or with Unavailable at Shutdown(). Never under the
  // store's lock, possibly before GetAsync returns. Returns the wait's id for CancelGet, or
  // 0 when `done` was called at once.
  uint64_t GetAsync(const std::string& key, std::chrono::milliseconds timeout, GetCallback done);
  // Ends the wait `id` for `key` (its caller went away): true when it was still waiting, and
  // then its `done` is never called; false when `done` has been called or is being called.
  bool CancelGet(const std::string& key, uint64_t id);
  // Fails every pending GetAsync (the coordinator is stopping) and stops the timer thread.
  void Shutdown();
  // Adds `delta` to the counter at `key` (0 when unset); refuses a value that is not a
  // counter, and an overflow.
  Result<int64_t> Add(const std::string& key, int64_t delta);
  // Drops the keys under `prefix` and closes the open prefixes under it; a GetAsync waiting
  // for a key under it ends at once with FAILED_PRECONDITION (no write can answer it now).
  void ClearPrefix(const std::string& prefix);
  size_t size() const;
  size_t bytes() const;

 private:
  struct Waiter {
    uint64_t id = 0;
    std::string key;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
    GetCallback done;
  };
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  // Removes the waiters for `key` (under the lock), to be called after it is released.
  std::vector<Waiter> TakeWaitersLocked(const std::string& key);
  // Checks that `key` may hold `value_bytes` (replacing its value, if set) within every
  // limit, and accounts for it.
  Status ReserveLocked(const std::string& key, size_t value_bytes);
  void ForgetLocked(const std::string& key, size_t value_bytes);
  // FAILED_PRECONDITION unless an open prefix holds `key`.
  Status CheckOpenLocked(const std::string& key) const;
  void TimerLoop();

  const RendezvousLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, Usage> usage_;  // by prefix (PrefixOf)
  Usage total_;
  std::condition_variable timer_cv_;  // the timer thread
  std::map<std::string, std::string> values_;
  std::set<std::string> open_;  // prefixes of the rounds (or async tasks) in progress
  std::multimap<std::string, Waiter> waiters_;  // by key
  uint64_t next_waiter_ = 1;
  std::thread timer_;                           // started with the first waiter
  bool shutdown_ = false;
};

}  // namespace tessera::server
