// Utility-guided client selection after Oort (Lai, Zhu, Madhyastha, Chowdhury, "Oort:
// Efficient Federated Learning via Guided Participant Selection", OSDI 2021): a round takes the
// clients whose updates are expected to help the model most per unit of round time.
//
// From the job's committed rounds (ClientHistory, server/selection/client_history.h), a client's score
// for round R is
//   statistical utility  samples x train loss of its last accepted update (Oort's
//                        |B| sqrt(mean loss^2), with the mean train loss the worker reports
//                        standing for the root mean square), scaled to [0, 1] over the
//                        candidates that have one (all 1 when they are equal; 0 for a
//                        client timed but never accepted),
//   + staleness bonus    sqrt(0.1 ln R / L), L the last round it was selected in (Oort's
//                        temporal uncertainty: a client left out for long comes back),
//   x system penalty     (deadline / expected time)^alpha when its expected time exceeds
//                        spec.round_deadline_ms, alpha = spec.selection.straggler_penalty
//                        (default 2, Oort's).
// Ranking: clients never timed first (explored, in an order drawn from the seed, the round and
// the attempt), then by score, highest first, equal scores in the drawn order;
// wire::SelectionCount of the first are taken. Oort samples its exploited clients among those
// near the cutoff and explores a decaying share; this ranking is deterministic instead, so
// that a round's clients are reproducible from (seed, round, attempt) and the rounds observed.
//
// Not thread-safe: the job's thread owns it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "server/selection/client_history.h"
#include "server/selection/selection.h"

namespace tessera::server {

class UtilitySelection final : public SelectionPolicy {
 public:
  std::vector<Client> Choose(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                             uint32_t attempt) override;
  void Observe(const v1::RoundRecord& record, const v1::JobSpec& spec) override { history_.Observe(record, spec); }
  bool LearnsFromRounds() const override { return true; }
  ClientHistory* learned() override { return &history_; }

  // The score of each timed candidate for `round`, by seat (never-timed ones are absent).
  std::map<std::string, double> Scores(const std::vector<Client>& candidates, const v1::JobSpec& spec,
                                       uint32_t round) const;
  const ClientHistory& history() const { return history_; }

 private:
  ClientHistory history_;
};

}  // namespace tessera::server
