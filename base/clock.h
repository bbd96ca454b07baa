// Time as the coordinator's parts read it, behind an interface so that tests can move it by
// hand instead of sleeping: SteadyClock() in the daemons, a ManualClock in tests.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>

namespace tessera {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

// std::chrono::steady_clock.
const Clock& SteadyClock();

// Stands still until Advance(); starts at the steady clock's reading when made.
class ManualClock final : public Clock {
 public:
  ManualClock() : now_(std::chrono::steady_clock::now().time_since_epoch().count()) {}
  TimePoint Now() const override { return TimePoint(TimePoint::duration(now_.load())); }
  void Advance(std::chrono::nanoseconds by) { now_.fetch_add(by.count()); }

 private:
  std::atomic<TimePoint::rep> now_;
};

}  // namespace tessera
