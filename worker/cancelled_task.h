// What a cancel from the coordinator (v1::CancelTask) covers, as the worker's agent and its
// client both read it.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::worker {

// A task the coordinator cancelled, by (job, round, attempt). Attempt 0 (from a coordinator
// that does not send it) covers every attempt of the round; round 0 (which no task has) says
// the whole job ended (JobRunner::Finish), and covers every task of it, whatever attempt it
// gives: the worker lets go of the job's data at its end, and no task of it trains on.
struct CancelledTask {
  std::string job;
  uint32_t round = 0;
  uint32_t attempt = 0;
  bool Covers(const std::string& j, uint32_t r, uint32_t a) const {
    return job == j && (round == 0 || (round == r && (attempt == 0 || attempt == a)));
  }
};

}  // namespace tessera::worker
