// A round's deadline as the coordinator gives it (TrainTask.deadline_unix_ms, on its clock),
// turned into time left on this worker.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tessera::worker {

// This worker's clock in Unix milliseconds, as deadlines are compared with it.
inline int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// From `now_unix_ms` (this worker's clock) to `deadline_unix_ms`: zero once it has passed, and
// at most 2^40 ms (about 35 years). Both in int64 milliseconds, so that a deadline from any
// coordinator (INT64_MAX included) is a time far off on the steady clock, never a count of
// nanoseconds wrapped into the past. The caller handles a deadline of 0 or less (none).
inline std::chrono::milliseconds TimeLeftUntil(int64_t deadline_unix_ms, int64_t now_unix_ms) {
  const int64_t left_ms = deadline_unix_ms > now_unix_ms ? deadline_unix_ms - now_unix_ms : 0;
  return std::chrono::milliseconds(std::min<int64_t>(left_ms, int64_t{1} << 40));
}

}  // namespace tessera::worker
