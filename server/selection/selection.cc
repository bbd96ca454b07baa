#include "server/selection/selection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "proto/job_mapping.h"
#include "server/selection/deadline_selection.h"
#include "server/selection/utility_selection.h"

namespace tessera::server {

std::map<std::string, Client> GroupClients(const WorkerRegistry& registry) {
  std::map<std::string, Client> clients;
  for (const std::string& worker : registry.ReadyWorkers()) {
    const std::string cohort = registry.Cohort(worker);
    const std::string seat = cohort.empty() ? worker : "cohort:" + cohort;
    Client& client = clients[seat];
    client.seat = seat;
    client.cohort = cohort;
    client.members.push_back(worker);  // ReadyWorkers is sorted
  }
  return clients;
}

Status SeatTable::Load() {
  ASSIGN_OR_RETURN(auto seats, store_->LoadSeats(job_id_));
  for (const auto& [seat, party] : seats) seats_[seat] = party;
  return Status::Ok();
}

Result<std::vector<Client>> SeatTable::Seat(std::map<std::string, Client> clients, uint32_t parties) {
  if (parties == 0) parties = static_cast<uint32_t>(seats_.size() + clients.size());
  std::vector<bool> taken(parties, false);
  for (const auto& [seat, party] : seats_) {
    if (party < parties) taken[party] = true;
  }
  std::vector<Client> seated;
  for (auto& [seat, client] : clients) {
    auto it = seats_.find(seat);
    if (it == seats_.end()) {  // a new client takes the lowest free party
      auto free = std::find(taken.begin(), taken.end(), false);
      if (free == taken.end()) continue;
      const uint32_t party = static_cast<uint32_t>(free - taken.begin());
      *free = true;
      RETURN_IF_ERROR(store_->SaveSeat(job_id_, seat, party));
      it = seats_.emplace(seat, party).first;
      spdlog::info("job {}: {} takes party {}", job_id_, seat, party);
    }
    client.party = it->second;
    seated.push_back(std::move(client));
  }
  return seated;
}

std::unique_ptr<SelectionPolicy> CreateSelectionPolicy(const v1::JobSpec& spec) {
  const std::string policy = wire::SelectionPolicy(spec);
  if (policy == "deadline") return std::make_unique<DeadlineSelection>();
  if (policy == "utility") return std::make_unique<UtilitySelection>();
  return std::make_unique<RandomSelection>();
}

std::string SeatOf(const v1::WorkerRoundReport& report) {
  return report.cohort().empty() ? report.worker_id() : "cohort:" + report.cohort();
}

std::vector<Client> DrawnOrder(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                               uint32_t attempt) {
  std::mt19937_64 rng(spec.seed() * 1000003ull + round * 131ull + attempt);
  std::shuffle(candidates.begin(), candidates.end(), rng);
  return candidates;
}

std::vector<Client> TakeFirst(std::vector<Client> ranked, const v1::JobSpec& spec) {
  ranked.resize(wire::SelectionCount(spec, ranked.size()));
  std::sort(ranked.begin(), ranked.end(), [](const Client& a, const Client& b) { return a.seat < b.seat; });
  return ranked;
}

std::vector<Client> RandomSelection::Choose(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                                            uint32_t attempt) {
  return TakeFirst(DrawnOrder(std::move(candidates), spec, round, attempt), spec);
}

}  // namespace tessera::server
