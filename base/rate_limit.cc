#include "base/rate_limit.h"

namespace tessera {

bool LogRateLimiter::Allow(Clock::time_point now, uint64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_ || now - window_start_ >= window_) {
    started_ = true;
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++held_back_;
    return false;
  }
  ++in_window_;
  *suppressed = held_back_;
  held_back_ = 0;
  return true;
}

}  // namespace tessera
