#include "worker/task_checks.h"

#include <algorithm>
#include <vector>

#include "base/escape.h"
#include "base/names.h"
#include "device/registry.h"
#include "proto/job_mapping.h"

namespace tessera::worker {
namespace {

// The coordinator's rendezvous prefix for a cohort's round ("rendezvous/JOB/ROUND/ATTEMPT/"),
// at most this long.
constexpr size_t kMaxRendezvousPrefixBytes = 256;

}  // namespace

Status CheckTask(const v1::TrainTask& task, const std::string& what) {
  if (Status valid = wire::ValidateJobSpec(task.spec()); !valid.ok()) {
    return valid.WithContext(what + ": the task's job spec");
  }
  for (const std::string& set : task.model_sets()) {
    if (!IsName(set)) {
      return InvalidArgumentError(what + ": the task names a model set " + QuoteUntrusted(set, 64) + ", expected 1 to " +
                                  std::to_string(kMaxNameBytes) + " letters, digits, '-', '_' or '.'");
    }
  }
  if (task.cohort().empty()) return Status::Ok();
  if (!IsName(task.cohort())) {
    return InvalidArgumentError(what + ": the task's cohort " + QuoteUntrusted(task.cohort(), 64) + " is not a name");
  }
  if (!task.collective_backend().empty() && !IsName(task.collective_backend())) {
    return InvalidArgumentError(what + ": the task's collectives backend " +
                                QuoteUntrusted(task.collective_backend(), 64) + " is not a name");
  }
  if (task.rendezvous_prefix().empty() || task.rendezvous_prefix().size() > kMaxRendezvousPrefixBytes ||
      HasHiddenCharacters(task.rendezvous_prefix())) {
    return InvalidArgumentError(what + ": the task's rendezvous prefix " + QuoteUntrusted(task.rendezvous_prefix(), 64) +
                                " is empty, longer than " + std::to_string(kMaxRendezvousPrefixBytes) +
                                " bytes or holds control characters");
  }
  if (task.cohort_size() == 0 || task.cohort_rank() >= task.cohort_size()) {
    return InvalidArgumentError(what + ": the task gives this worker rank " + std::to_string(task.cohort_rank()) +
                                " of a cohort of " + std::to_string(task.cohort_size()));
  }
  return Status::Ok();
}

bool IsDeviceClass(const std::string& name) {
  const std::vector<DeviceBackend> backends = RegisteredDeviceBackends();
  return std::any_of(backends.begin(), backends.end(), [&](const DeviceBackend& b) { return b.name == name; });
}

}  // namespace tessera::worker
