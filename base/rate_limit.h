// A budget for repeated log lines: a worker retrying a wrong token every 200 ms, or a scanner
// trying sessions, costs a few lines a minute, and the line that is let through says how many
// were held back.
//
// Thread-safe. Time is passed in, so tests need no clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace tessera {

class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // At most `burst` events are let through per `window`.
  LogRateLimiter(uint32_t burst, Clock::duration window) : burst_(burst), window_(window) {}

  // True when this event may be logged; then *suppressed is how many events were held back
  // since the last one let through (0 when none), for the line to say so.
  bool Allow(Clock::time_point now, uint64_t* suppressed);
  bool Allow(uint64_t* suppressed) { return Allow(Clock::now(), suppressed); }

 private:
  const uint32_t burst_;
  const Clock::duration window_;
  std::mutex mu_;
  Clock::time_point window_start_{};
  uint32_t in_window_ = 0;
  uint64_t held_back_ = 0;
  bool started_ = false;
};

// The end of a line let through after `suppressed` were held back: " (N more WHAT were not
// logged)", or nothing when none were.
inline std::string HeldBackNote(uint64_t suppressed, std::string_view what) {
  if (suppressed == 0) return "";
  return " (" + std::to_string(suppressed) + " more " + std::string(what) + " were not logged)";
}

}  // namespace tessera
