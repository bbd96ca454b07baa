// What the worker logs while it cannot join the coordinator (WorkerAgent::Run, worker/agent.h).
// A join that fails is tried again after a backoff, for ever: a coordinator that is down and a
// TLS handshake that fails both come back UNAVAILABLE, and the worker cannot tell them apart
// by their code. It can by gRPC's message, which names the TLS problem ("Ssl handshake failed:
// ... certificate verify failed", "Peer name HOST is not in peer certificate"): such a failure
// is logged with a hint at the flags to check.
// Repeats are rate-limited: a failure is said when it starts or its kind changes (its code, or
// a failed handshake against any other failure), then at most once per kRepeatEvery, with the
// count of tries since it was last said.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace tessera::worker {

// For a join's failure whose message shows a failed TLS handshake: what to check (the worker's
// CA, the name the coordinator's certificate carries). Empty for any other failure.
std::string TlsHandshakeHint(const Status& failure);

class JoinRetryLog {
 public:
  static constexpr std::chrono::seconds kRepeatEvery{60};
  using Clock = std::chrono::steady_clock;

  // The line to log for a join that failed with `failure` at `now`, tried again in `wait_ms`;
  // nothing when the same failure was said less than kRepeatEvery ago.
  std::optional<std::string> Failed(const Status& failure, uint32_t wait_ms, Clock::time_point now);
  // A join succeeded: the next failure is said whatever it is.
  void Joined();

 private:
  std::optional<std::string> last_kind_;  // of the failure said last; none since the last join
  Clock::time_point last_said_{};
  uint64_t unsaid_ = 0;  // failed tries since the last line
};

}  // namespace tessera::worker
