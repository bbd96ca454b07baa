// The asynchronous driver's tasks (async_driver.h): ending those whose workers were lost or
// whose deadline passed, and handing new ones to idle clients.
#include <algorithm>
#include <map>
#include <set>

#include "server/jobs/async_driver.h"
#include "server/jobs/job_runner.h"

namespace tessera::server {

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
  for (const Client& client : candidates) {
    v1::TrainTask train;
    std::string prefix;
    std::vector<std::pair<std::string, uint64_t>> members;
    for (const auto& worker : client.members) members.emplace_back(worker, runner_.registry_->Generation(worker));
    const uint64_t max_samples = runner_.MaxSamples(client.party);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (tasks_sent_ == UINT32_MAX) return ResourceExhaustedError("job " + runner_.job_id_ + ": task numbers exhausted");
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
