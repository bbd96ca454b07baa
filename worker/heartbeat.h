// How often the worker beats (WorkerAgent::RunSession, worker/agent.h), from what its
// coordinator's JoinResponse says.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera::worker {

// The range of a coordinator's --heartbeat-interval-ms, which it tells each worker at join.
inline constexpr uint32_t kMinHeartbeatIntervalMs = 50;
inline constexpr uint32_t kMaxHeartbeatIntervalMs = 60000;
// The beat of a coordinator that gives no interval.
inline constexpr uint32_t kDefaultHeartbeatIntervalMs = 1000;

// The beat interval the worker keeps for a coordinator that asked for `interval_ms` and drops a
// worker silent for `timeout_ms` (either 0: not given). The interval asked for, within the
// range a coordinator's flag allows; but where it is not below the timeout (a coordinator of
// another version, or a broken one), half the timeout, so that the worker is not dropped
// between two beats. Never below kMinHeartbeatIntervalMs, whatever the timeout.
inline uint32_t HeartbeatIntervalMs(uint32_t interval_ms, uint32_t timeout_ms) {
  uint32_t beat = interval_ms == 0 ? kDefaultHeartbeatIntervalMs
                                   : std::clamp(interval_ms, kMinHeartbeatIntervalMs, kMaxHeartbeatIntervalMs);
  if (timeout_ms > 0 && beat >= timeout_ms) beat = std::max(timeout_ms / 2, kMinHeartbeatIntervalMs);
  return beat;
}

}  // namespace tessera::worker
