// Deadline-aware client selection: a round takes the clients expected to report soonest,
// over-selected, so that it closes when its clients_per_round fastest have reported instead
// of waiting for a slow device until the deadline (Bonawitz et al. 2019, "Towards Federated
// Learning at Scale": select 130% of the target, close at the target).
//
// What it knows of a client is the time it took in the job's committed rounds
// (ClientHistory, server/selection/client_history.h: the upper median of its last five, lower bounds
// for the rounds it was dropped from unreported).
//
// Ranking: clients never timed first (each is tried, in an order drawn from the seed, the
// round and the attempt), then those whose expected time fits spec.round_deadline_ms, then
// those that do not; within each, by expected time, equal times in the drawn order.
// wire::SelectionCount of the first are taken. Reproducible from (seed, round, attempt) and
// the rounds observed. A client expected to be slow is tried again only when the faster
// ones do not fill the selection.
//
// Not thread-safe: the job's thread owns it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/selection/client_history.h"
#include "server/selection/selection.h"

namespace tessera::server {

class DeadlineSelection final : public SelectionPolicy {
 public:
  std::vector<Client> Choose(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                             uint32_t attempt) override;
  void Observe(const v1::RoundRecord& record, const v1::JobSpec& spec) override { history_.Observe(record, spec); }
  bool LearnsFromRounds() const override { return true; }
  ClientHistory* learned() override { return &history_; }

  const ClientHistory& history() const { return history_; }

 private:
  ClientHistory history_;
};

}  // namespace tessera::server
