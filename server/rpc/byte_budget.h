// A budget of bytes that uploads take before they allocate their buffers, so that the
// coordinator's memory stays flat however many workers upload at once: an upload whose
// tensors do not fit waits, holding no thread and reading nothing (gRPC's flow control then
// holds the worker back), until earlier uploads release theirs. Waiters are served in order.
// A request larger than the whole budget is granted alone, once nothing else is held.
//
// Thread-safe. Callbacks run on the thread that made room (Acquire's or Release's caller),
// never under the budget's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

namespace tessera::server {

class ByteBudget {
 public:
  explicit ByteBudget(uint64_t capacity) : capacity_(capacity) {}

  // Calls `granted` once `bytes` are taken: at once when they fit, else later.
  void Acquire(uint64_t bytes, std::function<void()> granted);
  // Takes `bytes` at once, whether they fit or not: for bytes already received whole (an
  // inline update), held only while they are folded. Released as any others.
  void Take(uint64_t bytes);
  void Release(uint64_t bytes);

  uint64_t capacity() const { return capacity_; }
  uint64_t in_use() const;
  size_t waiting() const;

 private:
  struct Waiter {
    uint64_t bytes;
    std::function<void()> granted;
  };
  bool FitsLocked(uint64_t bytes) const { return held_ == 0 || held_ + bytes <= capacity_; }

  const uint64_t capacity_;
  mutable std::mutex mu_;
  uint64_t held_ = 0;
  std::deque<Waiter> waiters_;
};

}  // namespace tessera::server
