#include "worker/task_checks.h"

#include <algorithm>
#include <vector>

#include "base/escape.h"
#include "base/names.h"
#include "device/registry.h"
#include "proto/job_mapping.h"
#include "worker/round_download.h"

namespace tessera::worker {
namespace {

// The coordinator's rendezvous prefix for a cohort's round ("rendezvous/JOB/ROUND/ATTEMPT/"),
// at most this long.
constexpr size_t kMaxRendezvousPrefixBytes = 256;
// The most members a cohort can have: every member publishes at least one rendezvous key,
// and the coordinator keeps at most 4096 under a cohort's round prefix (RendezvousLimits, which
// no flag changes). A size past INT_MAX turned negative in the communicator's options, and one
// just below it had the p2p transport allocate a connection slot per rank before any peer came.
constexpr uint32_t kMaxCohortSize = 4096;

}  // namespace

Status CheckTask(const v1::TrainTask& task, const std::string& what) {
  // A cancel of round 0 ends the whole job (worker/cancelled_task.h): a task of round 0 could
  // not be cancelled on its own, and a coordinator numbers rounds and tasks from 1.
  if (task.round() == 0) {
    return InvalidArgumentError(what + ": the task's round is 0; rounds are numbered from 1");
  }
  if (Status valid = wire::ValidateJobSpec(task.spec()); !valid.ok()) {
    return valid.WithContext(what + ": the task's job spec");
  }
  // Counted first: each set is compared with those before it, and a task of a few hundred
  // thousand sets (what fits in one message) held the task thread for minutes in those
  // comparisons.
  if (task.model_sets_size() > kMaxModelSets) {
    return InvalidArgumentError(what + ": the task names " + std::to_string(task.model_sets_size()) +
                                " model sets, expected at most " + std::to_string(kMaxModelSets));
  }
  for (int i = 0; i < task.model_sets_size(); ++i) {
    const std::string& set = task.model_sets(i);
    if (!IsName(set)) {
      return InvalidArgumentError(what + ": the task names a model set " + QuoteUntrusted(set, 64) + ", expected 1 to " +
                                  std::to_string(kMaxNameBytes) + " letters, digits, '-', '_' or '.'");
    }
    if (std::find(task.model_sets().begin(), task.model_sets().begin() + i, set) != task.model_sets().begin() + i) {
      return InvalidArgumentError(what + ": the task names model set '" + set + "' twice; each set comes once");
    }
  }
  // A partition's party: the worker would download the model before its data load found the
  // party missing. Workers' own files give each client a seat of any number.
  const v1::PartitionSpec& partition = task.spec().data().partition();
  if (partition.kind() != v1::PARTITION_LOCAL_FILES && task.party_index() >= partition.parties()) {
    return InvalidArgumentError(what + ": the task's party_index " + std::to_string(task.party_index()) +
                                " is outside the job's partition of " + std::to_string(partition.parties()) +
                                " parties (data.partition.parties)");
  }
  if (task.cohort().empty()) {
    // A lone worker's task carries no cohort fields: with a cohort_rank other than 0 the
    // worker would train and upload nothing, leaving its update to a leader that is not there.
    if (task.cohort_rank() != 0 || task.cohort_size() != 0 || !task.rendezvous_prefix().empty() ||
        !task.collective_backend().empty()) {
      return InvalidArgumentError(what + ": the task has no cohort but gives cohort_rank " +
                                  std::to_string(task.cohort_rank()) + ", cohort_size " +
                                  std::to_string(task.cohort_size()) +
                                  ", a rendezvous_prefix or a collective_backend; expected none of them");
    }
    return Status::Ok();
  }
  if (!IsName(task.cohort())) {
    return InvalidArgumentError(what + ": the task's cohort " + QuoteUntrusted(task.cohort(), 64) + " is not a name");
  }
  // What a job may name (ValidateJobSpec) and the coordinator sends: an unknown backend was
  // found only by the rendezvous, after the model's download.
  const std::string& backend = task.collective_backend();
  if (!backend.empty() && backend != "auto" && backend != "gloo" && backend != "mpi" && backend != "nccl" &&
      backend != "p2p") {
    return InvalidArgumentError(what + ": the task's collectives backend " + QuoteUntrusted(backend, 64) +
                                ", expected auto, gloo, mpi, nccl or p2p");
  }
  if (task.rendezvous_prefix().empty() || task.rendezvous_prefix().size() > kMaxRendezvousPrefixBytes ||
      HasHiddenCharacters(task.rendezvous_prefix())) {
    return InvalidArgumentError(what + ": the task's rendezvous prefix " + QuoteUntrusted(task.rendezvous_prefix(), 64) +
                                " is empty, longer than " + std::to_string(kMaxRendezvousPrefixBytes) +
                                " bytes or holds control characters");
  }
  if (task.cohort_size() == 0 || task.cohort_size() > kMaxCohortSize || task.cohort_rank() >= task.cohort_size()) {
    return InvalidArgumentError(what + ": the task gives this worker rank " + std::to_string(task.cohort_rank()) +
                                " of a cohort of " + std::to_string(task.cohort_size()) + ", expected a rank below a size of 1 to " +
                                std::to_string(kMaxCohortSize));
  }
  return Status::Ok();
}

Status CheckDeadline(const v1::TrainTask& task, const std::string& what, std::chrono::system_clock::time_point now) {
  const int64_t deadline = task.deadline_unix_ms();
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  if (deadline <= 0 || now_ms <= deadline) return Status::Ok();
  return DeadlineExceededError(what + ": the task's deadline_unix_ms " + std::to_string(deadline) +
                               " has passed on this worker's clock (" + std::to_string(now_ms) + ", " +
                               std::to_string(now_ms - deadline) + " ms later); it is neither downloaded nor trained "
                               "(if every task arrives past its deadline, this worker's clock runs ahead of the "
                               "coordinator's)");
}

bool IsDeviceClass(const std::string& name) {
  const std::vector<DeviceBackend> backends = RegisteredDeviceBackends();
  return std::any_of(backends.begin(), backends.end(), [&](const DeviceBackend& b) { return b.name == name; });
}

}  // namespace tessera::worker
