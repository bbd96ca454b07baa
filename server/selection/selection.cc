#include "server/selection/selection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <string_view>

#include "base/escape.h"
#include "base/names.h"
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

namespace {

// A seat GroupClients can give: a worker's name, or "cohort:" and a cohort's.
bool IsSeat(std::string_view seat) {
  constexpr std::string_view kCohort = "cohort:";
  if (seat.substr(0, kCohort.size()) == kCohort) seat.remove_prefix(kCohort.size());
  return IsName(seat);
}

}  // namespace

// Why seats that do not fit are left out rather than the job refused: a seat only says which
// client trains which party, so that a client keeps its party (and what it keeps for it:
// FedBN's local tensors, top-k's residual) across restarts. Nothing the job has committed
// depends on it: the model, the rounds and the strategy's state per party stay as they are,
// whoever trains a party next. A seat outside the partition is a client that can never train
// (every update it sends is refused), a seat no worker can hold keeps its party untrained for
// good, and two seats on one party train that party twice and leave another out; the job
// cannot tell which of two seats is right, so both go. Refusing to resume would stop a job
// that has nothing wrong with it but who trains what; seating those clients again loses
// nothing. Each seat left out is named in the log and to the job's watchers, and the rows
// stay in the store as they were, for whoever looks into how they came to be.
Status SeatTable::Load(uint32_t parties, std::vector<Status>* dropped) {
  seats_.clear();
  size_t left_out = 0;
  auto drop = [&](const std::string& why) {
    if (++left_out <= kNamedDroppedSeats) dropped->push_back(DataLossError("job " + job_id_ + ": " + why));
  };
  auto stored = store_->LoadSeats(job_id_, kMaxStoredSeats);
  if (!stored.ok()) {
    if (stored.status().code() != StatusCode::kDataLoss) return stored.status();
    drop("no stored seat is used, every client is seated again: " + stored.status().message());
    return Status::Ok();
  }
  std::map<uint32_t, size_t> claims;  // party -> seats on it that are otherwise fine
  std::vector<std::pair<std::string, uint32_t>> fitting;
  auto named = [](const std::string& seat, uint32_t party) {
    return "seat " + QuoteUntrusted(seat, 128) + " on party " + std::to_string(party);
  };
  for (auto& [seat, party] : *stored) {
    if (!IsSeat(seat)) {
      drop(named(seat, party) + " is not used: expected a worker's name or 'cohort:' and a cohort's, 1 to 128 letters, "
                   "digits, '-', '_' or '.'; party " + std::to_string(party) + " is seated again");
    } else if (parties > 0 && party >= parties) {
      drop(named(seat, party) + " is not used: expected a party below " + std::to_string(parties) +
           ", the partition's parties; the client is seated again");
    } else {
      ++claims[party];
      fitting.emplace_back(std::move(seat), party);
    }
  }
  for (auto& [seat, party] : fitting) {
    if (const size_t claimed = claims[party]; claimed > 1) {
      drop(named(seat, party) + " is not used: expected one seat a party, found " + std::to_string(claimed) +
           " on it; each of them is seated again");
      continue;
    }
    seats_.emplace(std::move(seat), party);
  }
  if (left_out > kNamedDroppedSeats) {
    dropped->push_back(DataLossError("job " + job_id_ + ": " + std::to_string(left_out - kNamedDroppedSeats) +
                                     " more stored seats are not used"));
  }
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
