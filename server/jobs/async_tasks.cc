// The asynchronous driver's tasks (async_driver.h): ending them (one by one, those whose
// workers were lost or whose deadline passed, all at the job's end), counting those that end
// without a fold, reserving their numbers, and handing new ones to idle clients.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <map>
#include <set>

#include "base/escape.h"
#include "server/jobs/async_driver.h"
#include "server/jobs/job_runner.h"

namespace tessera::server {
namespace {

// A client whose task failed, was refused or dropped rests this long: one that cannot train does not spin.
constexpr std::chrono::milliseconds kRestAfterFailure{1000};
// The characters of the last unfolded task's outcome that the job's error quotes when too
// many tasks in a row ended without a fold.
constexpr size_t kLastUnfoldedChars = 300;
// Task numbers reserved in the job's row at a time (more when more tasks go out at once): one
// write of the row per this many tasks, and at most this many numbers skipped by a restart.
constexpr uint64_t kTaskNumberBlock = 1024;

}  // namespace

void AsyncDriver::EndTaskLocked(const std::string& leader, v1::WorkerRoundReport report, bool refused, bool rest) {
  auto it = tasks_.find(leader);
  if (it == tasks_.end()) return;
  const Task& task = it->second;
  Buffer& filling = JoinedLocked();
  (refused ? filling.refused : filling.dropped) += 1;
  if (rest) ++unfolded_in_a_row_;  // not the protocol's ending: it counts towards the job's bound
  // What allocates comes first, while the task is at hand; the task ends whatever it throws
  // (a task left in flight would keep its client idle, and one marked folding, for good).
  try {
    if (rest) {
      const auto rest_until = clock_->Now() + kRestAfterFailure;
      for (const auto& [worker, generation] : task.members) resting_[worker] = rest_until;
      last_unfolded_ = "task " + std::to_string(task.number) + " of worker " + QuoteUntrusted(leader) + ": " +
                       EscapeUntrusted(report.outcome(), kLastUnfoldedChars);
    }
    report.set_staleness(static_cast<uint32_t>(std::min<uint64_t>(StalenessLocked(task.version), UINT32_MAX)));
    AddReportLocked(filling, std::move(report), /*folded=*/false);
  } catch (const std::exception& e) {
    spdlog::error("job {}: the report of worker '{}' is lost: {}", runner_.job_id_, leader, e.what());
  } catch (...) {
    spdlog::error("job {}: the report of worker '{}' is lost", runner_.job_id_, leader);
  }
  RemoveTaskLocked(it);
}

void AsyncDriver::RemoveTaskLocked(std::map<std::string, Task>::iterator it) {
  for (const auto& [worker, generation] : it->second.members) leader_of_.erase(worker);
  if (!it->second.rendezvous_prefix.empty()) runner_.rendezvous_->ClearPrefix(it->second.rendezvous_prefix);
  tasks_.erase(it);
  client_freed_ = true;
  cv_.notify_all();  // a client is free for a new task
}

void AsyncDriver::CancelAll(const std::string& reason) {
  std::vector<std::pair<std::string, uint32_t>> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [leader, task] : tasks_) {
      for (const auto& [worker, generation] : task.members) cancels.emplace_back(worker, task.number);
      if (!task.rendezvous_prefix.empty()) runner_.rendezvous_->ClearPrefix(task.rendezvous_prefix);
    }
    tasks_.clear();
    leader_of_.clear();
  }
  for (const auto& [worker, number] : cancels) runner_.SendCancel(worker, number, 1, reason);
}

std::optional<Status> AsyncDriver::NothingFoldedLocked(uint32_t step) const {
  const uint64_t attempts = std::max<uint32_t>(1, spec_.max_round_attempts());
  const uint64_t concurrency = std::max<uint32_t>(1, options_.concurrency());
  if (unfolded_in_a_row_ < attempts * concurrency) return std::nullopt;
  return FailedPreconditionError("step " + std::to_string(step) + ": " + std::to_string(unfolded_in_a_row_) +
                                 " tasks in a row ended without an update folded (max_round_attempts " +
                                 std::to_string(attempts) + " x concurrency " + std::to_string(concurrency) +
                                 "); the last: " + last_unfolded_);
}

Status AsyncDriver::ReserveTaskNumbers(size_t count) {
  uint32_t sent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sent = tasks_sent_;
  }
  if (uint64_t{sent} + count <= tasks_reserved_) return Status::Ok();
  const auto upto =
      static_cast<uint32_t>(std::min<uint64_t>(UINT32_MAX, uint64_t{sent} + std::max<uint64_t>(count, kTaskNumberBlock)));
  // Durable before any number of the block is sent: a coordinator resuming the job after a
  // crash at any point numbers its tasks past it. Every write of the job's row is the job's
  // thread's, from the runner's copy of the job, which keeps the reservation from here on.
  v1::Job row = runner_.Snapshot();
  row.set_async_tasks_reserved(upto);
  if (Status saved = runner_.store_->UpdateJob(row); !saved.ok()) {
    return saved.WithContext("job " + runner_.job_id_ + ": reserving task numbers " + std::to_string(uint64_t{sent} + 1) +
                             " to " + std::to_string(upto));
  }
  {
    std::lock_guard<std::mutex> lock(runner_.mu_);
    runner_.job_.set_async_tasks_reserved(upto);
  }
  tasks_reserved_ = upto;
  return Status::Ok();
}

void AsyncDriver::EndLostAndLateTasks(Clock::TimePoint now) {
  struct Look {
    std::string leader;
    uint32_t number;
    std::vector<std::pair<std::string, uint64_t>> members;
    bool late;
  };
  std::vector<Look> looks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [leader, task] : tasks_) {
      if (task.folding) continue;  // its update has arrived
      looks.push_back({leader, task.number, task.members, now >= task.deadline});
    }
  }
  // The registry is asked without the driver's lock.
  std::vector<std::pair<std::string, std::string>> ended;  // leader, outcome
  std::vector<std::string> cancel;
  std::map<std::string, uint32_t> numbers;
  for (const Look& look : looks) {
    std::string outcome;
    for (const auto& [worker, generation] : look.members) {
      if (!runner_.registry_->IsAlive(worker, generation)) {
        outcome = "dropped: worker '" + worker + "' lost (no heartbeat, disconnected or restarted)";
        break;
      }
    }
    if (outcome.empty() && look.late) outcome = "dropped: deadline";
    if (outcome.empty()) continue;
    ended.emplace_back(look.leader, outcome);
    numbers[look.leader] = look.number;
  }
  std::vector<std::pair<std::string, uint32_t>> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [leader, outcome] : ended) {
      auto it = tasks_.find(leader);
      if (it == tasks_.end() || it->second.folding || it->second.number != numbers[leader]) continue;
      if (outcome == "dropped: deadline") {
        for (const auto& [worker, generation] : it->second.members) cancels.emplace_back(worker, it->second.number);
      }
      v1::WorkerRoundReport report = BaseReport(it->second, leader);
      report.set_outcome(outcome);
      EndTaskLocked(leader, std::move(report), /*refused=*/false);
    }
  }
  for (const auto& [worker, number] : cancels) runner_.SendCancel(worker, number, 1, "the task's deadline passed");
}

Result<size_t> AsyncDriver::FillTasks(Clock::TimePoint now) {
  size_t want = 0;
  std::set<std::string> busy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tasks_.size() >= options_.concurrency()) return size_t{0};
    want = options_.concurrency() - tasks_.size();
    for (const auto& [worker, leader] : leader_of_) busy.insert(worker);
    std::erase_if(resting_, [&](const auto& entry) { return entry.second <= now; });
    for (const auto& [worker, until] : resting_) busy.insert(worker);
  }
  ASSIGN_OR_RETURN(std::vector<Client> candidates, runner_.ReadyClients(JobRunner::SeatedParties(spec_)));
  std::erase_if(candidates, [&](const Client& client) {
    return std::any_of(client.members.begin(), client.members.end(),
                       [&](const std::string& worker) { return busy.count(worker) > 0; });
  });
  const size_t idle = candidates.size();
  if (candidates.size() > want) {
    // Which of the idle clients train next: drawn from the job's seed and the next task's
    // number, as a synchronous round draws from its round and attempt.
    v1::JobSpec draw = spec_;
    draw.set_clients_per_round(static_cast<uint32_t>(want));
    uint32_t next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      next = tasks_sent_ + 1;
    }
    candidates = runner_.selection_->Choose(std::move(candidates), draw, next, 1);
  }
  if (!candidates.empty()) RETURN_IF_ERROR(ReserveTaskNumbers(candidates.size()));
  for (const Client& client : candidates) {
    v1::TrainTask train;
    std::string prefix;
    std::vector<std::pair<std::string, uint64_t>> members;
    for (const auto& worker : client.members) members.emplace_back(worker, runner_.registry_->Generation(worker));
    const uint64_t max_samples = runner_.MaxSamples(client.party);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (tasks_sent_ == UINT32_MAX) return ResourceExhaustedError("job " + runner_.job_id_ + ": task numbers exhausted");
      if (tasks_sent_ >= tasks_reserved_) {
        return InternalError("job " + runner_.job_id_ + ": task " + std::to_string(uint64_t{tasks_sent_} + 1) +
                             " is not reserved in the job's row");
      }
      Task task;
      task.number = ++tasks_sent_;
      task.version = current_->version();
      task.party = client.party;
      task.cohort = client.cohort;
      task.members = std::move(members);
      for (const auto& worker : client.members) leader_of_[worker] = client.members.front();
      task.model = current_;
      task.sent = clock_->Now();
      task.deadline = task.sent + std::chrono::milliseconds(spec_.round_deadline_ms());
      task.max_samples = max_samples;
      if (!client.cohort.empty()) {
        prefix = "rendezvous/" + runner_.job_id_ + "/" + std::to_string(task.number) + "/1/";
        task.rendezvous_prefix = prefix + client.cohort + "/";
        runner_.rendezvous_->Open(task.rendezvous_prefix);  // closed with its keys when the task ends
      }
      train.set_job_id(runner_.job_id_);
      train.set_round(task.number);
      train.set_attempt(1);
      train.set_model_version(task.version);
      *train.mutable_spec() = spec_;
      train.set_deadline_unix_ms(UnixMillis() + spec_.round_deadline_ms());
      tasks_[client.members.front()] = std::move(task);
    }
    runner_.SendTrainTask(client, train, prefix);
  }
  return idle;
}

}  // namespace tessera::server
