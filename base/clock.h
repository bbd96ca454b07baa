// Time as the coordinator's parts read it and wait on it, behind an interface so that tests
// move it by hand instead of sleeping: SteadyClock() in the daemons, a ManualClock in tests.
//
// Waits go through the clock too (WaitUntil), so that a wait with a deadline ends when a
// ManualClock is advanced past it, and never sleeps real time on its own.
//
// Thread-safe. A clock must outlive everything that reads it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace tessera {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;

  virtual TimePoint Now() const = 0;

  // Waits on `cv` as std::condition_variable::wait_until(lock, deadline, done) does, with
  // `deadline` read on this clock: returns once done() is true (true) or this clock has
  // reached `deadline` (false, done() still false). `lock` holds `cv`'s mutex on entry and on
  // return; done() is called with it held. Whoever makes done() true changes its state under
  // that mutex (or takes the mutex after the change) and notifies `cv`.
  // TimePoint::max() waits without a deadline.
  virtual bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline,
                         const std::function<bool()>& done) const = 0;
};

// The milliseconds from `start` to `end`, as round records and latencies count them.
inline double MillisBetween(Clock::TimePoint start, Clock::TimePoint end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

// std::chrono::steady_clock; WaitUntil is the condition variable's own wait_until.
const Clock& SteadyClock();

// Stands still until Advance(); starts at the steady clock's reading when made.
//
// A thread in WaitUntil sleeps (no polling, no real-time timeout) until its `done` is
// notified or Advance() moves the clock to its deadline. Advance() wakes every waiter by
// taking the waiter's mutex and notifying its condition variable, so it must not be called
// with such a mutex held. A waiter leaves WaitUntil only once no Advance() is about to
// notify it; to that end it releases its lock for a moment before returning (as a spurious
// wake-up would), and done() and the deadline are looked at again after it takes the lock
// back.
class ManualClock final : public Clock {
 public:
  ManualClock() : now_(std::chrono::steady_clock::now()) {}

  TimePoint Now() const override;
  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline,
                 const std::function<bool()>& done) const override;

  // Moves the clock forward by `by` (not negative) and wakes the threads waiting on it.
  void Advance(std::chrono::nanoseconds by);

  // For tests that must know that a thread has reached its wait before they move time:
  // blocks, for at most `limit` of real time, until exactly `count` threads are asleep on
  // this clock (in WaitUntil, with a deadline still ahead: a waiter whose deadline an
  // Advance() passed is not counted until it waits again); returns whether they are.
  bool AwaitWaiters(size_t count, std::chrono::milliseconds limit) const;
  size_t waiters() const;  // counted as AwaitWaiters counts them
  // The earliest deadline of the threads AwaitWaiters counts; nullopt when none waits (or
  // none has a deadline).
  std::optional<TimePoint> NextDeadline() const;

 private:
  struct Waiter {
    std::mutex* mutex;
    std::condition_variable* cv;
    TimePoint deadline;
    bool leaving = false;  // on its way out: not counted, not notified
    int pins = 0;          // Advance() calls about to notify it
  };

  mutable std::mutex mu_;  // guards the fields below; never held while taking a waiter's mutex
  mutable std::condition_variable changed_;  // waiters_, their pins or now_ changed
  TimePoint now_;
  mutable std::vector<Waiter*> waiters_;

  size_t AsleepLocked() const;  // the waiters AwaitWaiters counts (mu_ held)
};

}  // namespace tessera
