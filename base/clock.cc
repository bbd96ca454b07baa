#include "base/clock.h"

#include <algorithm>

namespace tessera {
namespace {

class Steady final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline,
                 const std::function<bool()>& done) const override {
    if (deadline == TimePoint::max()) {
      cv.wait(lock, done);
      return true;
    }
    return cv.wait_until(lock, deadline, done);
  }
};

}  // namespace

const Clock& SteadyClock() {
  static const Steady clock;
  return clock;
}

Clock::TimePoint ManualClock::Now() const {
  std::lock_guard<std::mutex> guard(mu_);
  return now_;
}

bool ManualClock::WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline,
                            const std::function<bool()>& done) const {
  while (true) {
    Waiter waiter{lock.mutex(), &cv, deadline};
    {
      std::lock_guard<std::mutex> guard(mu_);
      waiters_.push_back(&waiter);
      changed_.notify_all();
    }
    // Registered before the first look at the time: an Advance() from here on either is seen
    // by that look or notifies `cv` under `lock`'s mutex once this thread sleeps.
    while (!done() && Now() < deadline) cv.wait(lock);
    {
      std::lock_guard<std::mutex> guard(mu_);
      waiter.leaving = true;
      changed_.notify_all();
    }
    // An Advance() may hold a pointer to `waiter` and be about to take `lock`'s mutex: let
    // it go, and leave once no Advance() holds the pointer (none takes it from now on).
    lock.unlock();
    {
      std::unique_lock<std::mutex> guard(mu_);
      changed_.wait(guard, [&] { return waiter.pins == 0; });
      waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &waiter));
      changed_.notify_all();
    }
    lock.lock();
    if (done()) return true;
    if (Now() >= deadline) return false;
  }
}

void ManualClock::Advance(std::chrono::nanoseconds by) {
  std::vector<Waiter*> waiting;
  {
    std::lock_guard<std::mutex> guard(mu_);
    now_ += std::max(by, std::chrono::nanoseconds(0));
    for (Waiter* waiter : waiters_) {
      if (waiter->leaving) continue;
      ++waiter->pins;
      waiting.push_back(waiter);
    }
    changed_.notify_all();
  }
  // Each waiter's own mutex, so that a waiter between its look at the time and its sleep
  // cannot miss the notification. A pinned waiter stays in WaitUntil until it is unpinned.
  for (Waiter* waiter : waiting) {
    std::lock_guard<std::mutex> guard(*waiter->mutex);
    waiter->cv->notify_all();
  }
  std::lock_guard<std::mutex> guard(mu_);
  for (Waiter* waiter : waiting) --waiter->pins;
  changed_.notify_all();
}

size_t ManualClock::AsleepLocked() const {
  return static_cast<size_t>(std::count_if(waiters_.begin(), waiters_.end(), [this](const Waiter* w) {
    return !w->leaving && w->deadline > now_;
  }));
}

bool ManualClock::AwaitWaiters(size_t count, std::chrono::milliseconds limit) const {
  std::unique_lock<std::mutex> guard(mu_);
  return changed_.wait_for(guard, limit, [&] { return AsleepLocked() == count; });
}

size_t ManualClock::waiters() const {
  std::lock_guard<std::mutex> guard(mu_);
  return AsleepLocked();
}

std::optional<Clock::TimePoint> ManualClock::NextDeadline() const {
  std::lock_guard<std::mutex> guard(mu_);
  std::optional<TimePoint> next;
  for (const Waiter* w : waiters_) {
    if (w->leaving || w->deadline <= now_ || w->deadline == TimePoint::max()) continue;
    if (!next || w->deadline < *next) next = w->deadline;
  }
  return next;
}

}  // namespace tessera
