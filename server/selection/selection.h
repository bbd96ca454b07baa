// Client selection: which federated clients take part in a round, and which share of the
// partition (party) each one trains.
//
//  - GroupClients: the ready workers as clients (a site cohort is one client, its members
//    sorted, the first leading).
//  - SeatTable: a job's seats, client -> party, persisted in the state store so that a client
//    keeps its party across restarts; a new client takes the lowest free party. Seats read
//    back that do not fit the job are not used (SeatTable::Load).
//  - SelectionPolicy: which of the seated candidates a round takes, wire::SelectionCount of
//    them (clients_per_round, or more with over-selection). RandomSelection (the default)
//    draws them from the job's seed, the round and the attempt; DeadlineSelection
//    (server/selection/deadline_selection.h) ranks them by the time they took in the job's rounds,
//    UtilitySelection (server/selection/utility_selection.h) by Oort's utility.
//    CreateSelectionPolicy makes the one a spec names.
//
// Not thread-safe: a job's thread owns its table and policy.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "server/selection/client_history.h"
#include "server/state/state_store.h"
#include "server/workers/worker_registry.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

// A federated client: a lone worker, or a site cohort whose members train as one.
struct Client {
  std::string seat;                  // the worker's id, or "cohort:NAME"
  std::string cohort;                // "" for a lone worker
  uint32_t party = 0;
  std::vector<std::string> members;  // sorted; members[0] leads
};

// The ready workers grouped into clients, by seat.
std::map<std::string, Client> GroupClients(const WorkerRegistry& registry);

// Seats Load names one by one; the rest it leaves out are counted in one more status.
inline constexpr size_t kNamedDroppedSeats = 10;

class SeatTable {
 public:
  SeatTable(StateStore* store, std::string job_id) : store_(store), job_id_(std::move(job_id)) {}
  // Reads the job's seats from the store (what was there before is forgotten), leaving out
  // every seat that does not fit the job: a name that is no worker's or cohort's, a party
  // outside the partition (`parties`, as Seat's; 0: workers' own files, no partition to be
  // outside of), a party two seats claim (both are left out), or all of them when the store
  // holds more than kMaxStoredSeats for the job or a row it cannot read (DataLoss). Each seat
  // left out is a DataLoss appended to *dropped, naming the job, the seat (escaped) and its
  // party and saying what was expected: the first kNamedDroppedSeats, then one for the rest.
  // The rows stay in the store as they are; a client left out is seated again by Seat, as a
  // new one. Another error of the store (an I/O error) is returned, with nothing loaded.
  Status Load(uint32_t parties, std::vector<Status>* dropped);
  // Gives each client its party: its seat's, or for a new client the lowest free one of
  // `parties` (saved before it is used). Clients left without a party (all taken) are left
  // out. `parties` == 0: every client gets a party of its own (workers' own files).
  Result<std::vector<Client>> Seat(std::map<std::string, Client> clients, uint32_t parties);
  size_t size() const { return seats_.size(); }

 private:
  StateStore* store_;
  std::string job_id_;
  std::map<std::string, uint32_t> seats_;  // client seat -> party
};

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  // The clients of one round attempt, sorted by seat: wire::SelectionCount(spec,
  // candidates.size()) of `candidates` (at least spec.min_clients of them). The same
  // candidates, (seed, round, attempt) and rounds observed give the same clients.
  virtual std::vector<Client> Choose(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                                     uint32_t attempt) = 0;
  // Learns from a committed round of the job, its workers' reports. The runner calls it for
  // each round it commits, and at its start for the rounds committed before (from the state
  // store), in round order. Nothing by default.
  virtual void Observe(const v1::RoundRecord& record, const v1::JobSpec& spec) {
    (void)record;
    (void)spec;
  }
  // Whether Observe learns anything: the runner reads past rounds from the store only then.
  virtual bool LearnsFromRounds() const { return false; }
  // What Observe has learned, for a policy that learns it all in a ClientHistory: the runner
  // checkpoints it with each round and gives it back on resume. Null (the default) for the
  // others.
  virtual ClientHistory* learned() { return nullptr; }
};

// The policy spec.selection names (wire::SelectionPolicy): RandomSelection for "random",
// DeadlineSelection for "deadline", UtilitySelection for "utility".
std::unique_ptr<SelectionPolicy> CreateSelectionPolicy(const v1::JobSpec& spec);

// The seat a round report is of: its cohort's ("cohort:NAME"), or its worker's.
std::string SeatOf(const v1::WorkerRoundReport& report);

// `candidates` in the order drawn from (seed, round, attempt): RandomSelection's draw, and
// the order in which the ranking policies break ties and try never-seen clients.
std::vector<Client> DrawnOrder(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                               uint32_t attempt);
// The first wire::SelectionCount(spec, ranked.size()) of `ranked`, sorted by seat.
std::vector<Client> TakeFirst(std::vector<Client> ranked, const v1::JobSpec& spec);

// wire::SelectionCount clients drawn uniformly, reproducibly from (seed, round, attempt);
// without over-selection (the default) clients_per_round, as before over-selection existed.
class RandomSelection final : public SelectionPolicy {
 public:
  std::vector<Client> Choose(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                             uint32_t attempt) override;
};

}  // namespace tessera::server
