// The parts of a job's runner that both drivers use (server/jobs/job_runner.h): seating the ready
// clients, sending tasks and cancels, committing a round or a step; and the asynchronous
// job's hand-over to its AsyncDriver.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <optional>
#include <utility>

#include "proto/job_mapping.h"
#include "server/jobs/async_driver.h"
#include "server/jobs/job_runner.h"
#include "server/monitoring/coordinator_metrics.h"

namespace tessera::server {

std::shared_ptr<AsyncDriver> JobRunner::Driver() const {
  std::lock_guard<std::mutex> lock(mu_);
  return async_;
}

std::shared_ptr<const ModelVersion> JobRunner::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void JobRunner::RunAsync() {
  auto driver = std::make_shared<AsyncDriver>(*this);
  {
    std::lock_guard<std::mutex> lock(mu_);
    async_ = driver;
  }
  if (stopping()) driver->Interrupt();  // a Stop() or Cancel() before the driver was there
  Status ended;
  try {
    ended = driver->Run();
  } catch (...) {
    // The job ends failed (Run() says so, durably), and Finish() releases the strategy: no
    // upload may still be between its check and its fold then, nor a task left to take one.
    driver->End("the job failed");
    throw;
  }
  // Nothing is folded once Run() has returned, and no upload is left inside the driver when
  // Finish() releases the strategy.
  driver->End(cancel_ ? "the job was cancelled" : "");
  if (cancel_) {
    Finish(v1::JOB_CANCELLED, "cancelled by the user");
  } else if (stop_) {
    std::lock_guard<std::mutex> lock(mu_);
    async_.reset();
  } else if (ended.ok()) {
    Finish(v1::JOB_SUCCEEDED, "");
  } else {
    Finish(v1::JOB_FAILED, ended.message());
  }
}

Result<std::vector<Client>> JobRunner::ReadyClients(uint32_t parties) {
  ASSIGN_OR_RETURN(std::vector<Client> candidates, seats_.Seat(GroupClients(*registry_), parties));
  // Clients blamed for a model that was not finite sit out the rest of this round.
  std::erase_if(candidates, [this](const Client& client) {
    return std::any_of(client.members.begin(), client.members.end(),
                       [this](const std::string& worker) { return excluded_.count(worker) > 0; });
  });
  return candidates;
}

uint32_t JobRunner::SeatedParties(const v1::JobSpec& spec) {
  // With shared data each seat is a party of the partition; with workers' own files every
  // client gets a seat of its own.
  if (spec.data().partition().kind() == v1::PARTITION_LOCAL_FILES) return 0;
  return std::max<uint32_t>(1, spec.data().partition().parties());
}

void JobRunner::SendTrainTask(const Client& client, const v1::TrainTask& task, const std::string& rendezvous_prefix,
                              const std::shared_ptr<const std::string>& task_wire) {
  const v1::JobSpec& spec = task.spec();
  const std::shared_ptr<const std::string> shared =
      task_wire ? task_wire : std::make_shared<const std::string>(task.SerializeAsString());
  // A cohort's backend: the job's choice, else NCCL when every member trains on CUDA, else
  // the first viable host backend (the same on every member).
  std::string backend = spec.collective_backend().empty() ? "auto" : spec.collective_backend();
  if (backend == "auto" && !client.cohort.empty()) {
    bool all_cuda = true;
    for (const auto& worker : client.members) {
      auto status = registry_->Describe(worker);
      all_cuda = all_cuda && status && status->device().kind() == "cuda";
    }
    if (all_cuda) backend = "nccl";
  }
  for (size_t rank = 0; rank < client.members.size(); ++rank) {
    v1::TrainTask own;  // this worker's fields
    own.set_party_index(client.party);
    if (!client.cohort.empty()) {
      own.set_cohort(client.cohort);
      own.set_cohort_rank(static_cast<uint32_t>(rank));
      own.set_cohort_size(static_cast<uint32_t>(client.members.size()));
      own.set_collective_backend(backend);
      own.set_rendezvous_prefix(rendezvous_prefix + client.cohort + "/");
    }
    const std::string& worker = client.members[rank];
    tasked_.insert(worker);
    OutgoingTask outgoing;
    outgoing.train_shared = shared;
    own.SerializeToString(&outgoing.train_own);
    if (options_.inline_model_bytes > 0 && registry_->AcceptsInlineModel(worker)) {
      // A small model rides inside the task: the worker makes no download call. Its bytes
      // count as downloaded as the task is handed to the transport.
      auto model = Model(task.model_version(), worker);
      if (model.ok() && (*model)->inline_model() && (*model)->total_bytes() <= options_.inline_model_bytes) {
        outgoing.inline_model = (*model)->inline_model();
        outgoing.on_written = [runner = weak_from_this(), worker, version = task.model_version(),
                               bytes = (*model)->total_bytes()] {
          if (auto self = runner.lock()) self->RecordDownload(worker, version, bytes);
          RecordDownloadBytes(worker, bytes);
        };
      }
    }
    if (Status s = registry_->Send(worker, std::move(outgoing)); !s.ok()) {
      spdlog::warn("job {}: {}", task.job_id(), s.message());
    }
  }
}

void JobRunner::SendCancel(const std::string& worker, uint32_t round, uint32_t attempt, const std::string& reason) {
  v1::Task cancel;
  cancel.mutable_cancel()->set_job_id(job_.id());  // the id never changes
  cancel.mutable_cancel()->set_round(round);
  cancel.mutable_cancel()->set_attempt(attempt);
  cancel.mutable_cancel()->set_reason(reason);
  registry_->Send(worker, std::move(cancel)).ok();
}

Status JobRunner::CommitStep(v1::RoundRecord record, StrategyStep step, Clock::TimePoint round_start) {
  const v1::Job job = Summary();
  const uint32_t round = record.round();
  auto next = std::make_shared<const TensorSet>(std::move(step.model));
  // Three things only read the new model, and nothing else runs between rounds: the
  // checkpoint's write (mostly waiting for the disk's sync) and the evaluation each run on a
  // thread of their own while this one encodes the model for download (hashes, chunk
  // messages). The commit waits for the longest of the three, not for all of them.
  // The strategy's next state and what the selection policy knows after this round go into
  // the same checkpoint file as the model: all are of this round, or none is. They are
  // written after the model's tensors, which are not copied to join them.
  // A synchronous round's timings teach the selection policy (an asynchronous step has none
  // to give); a policy that keeps a ClientHistory takes it in only once the round is
  // committed, as the strategy its state.
  ClientHistory* const learned = selection_->learned();
  std::optional<ClientHistory> next_history;
  TensorSet extra = JoinModelAndState({}, step.state);
  if (learned != nullptr) {
    next_history = *learned;
    if (!record.has_async_step()) next_history->Observe(record, job.spec());
    extra.push_back(next_history->ToTensor());
  }
  auto written = std::async(std::launch::async, [this, &job, round, next, &extra] {
    return store_->WriteCheckpoint(job.id(), round, *next, extra);
  });
  auto evaluated = std::async(std::launch::async, [this, next] {
    const auto eval_start = clock_->Now();
    Result<Evaluation> evaluation = evaluator_->Evaluate(*next);
    return std::make_pair(std::move(evaluation), MillisSince(eval_start));
  });
  // Encoded for download once, here, not by each download; its hash is the record's.
  auto encoded =
      ModelVersion::Encode(next, round, options_.chunk_bytes, wire::JobDownloadEncoding(job.spec()), non_negative_);
  auto [evaluation, evaluation_ms] = evaluated.get();
  // The commit: what is left of the checkpoint's write, then the round's record with it.
  const auto commit_start = clock_->Now();
  const Status checkpoint = written.get();
  RETURN_IF_ERROR(evaluation.status());
  const double accuracy = evaluation->accuracy, loss = evaluation->loss;
  record.mutable_latency()->set_evaluation_ms(evaluation_ms);
  record.set_test_accuracy(accuracy);
  record.set_test_loss(loss);
  record.set_model_sha256(encoded->sha256());

  v1::Job committed = job;
  committed.set_rounds_committed(round);
  RETURN_IF_ERROR(CommitWritten(&committed, &record, *next, extra, checkpoint));
  strategy_->Adopt(std::move(step.state));
  record.mutable_latency()->set_commit_ms(MillisSince(commit_start));
  record.mutable_latency()->set_total_ms(MillisSince(round_start));
  {
    // What the named phases and the critical path leave of the round (docs/MONITORING.md).
    auto& l = *record.mutable_latency();
    const double named = l.selection_ms() + l.critical_download_ms() + l.critical_data_load_ms() +
                         l.critical_compute_ms() + l.critical_upload_ms() + l.after_last_report_ms() +
                         l.aggregation_ms() + l.evaluation_ms() + l.commit_ms();
    l.set_other_ms(std::max(0.0, l.total_ms() - named));
  }
  *committed.mutable_last_round()->mutable_latency() = record.latency();  // all the commit changed
  if (Status s = store_->UpdateRoundRecord(committed, record); !s.ok()) {
    spdlog::warn("job {}: round {} committed, but its commit latency was not recorded: {}", job.id(), round, s.ToString());
  }
  if (learned != nullptr) {
    *learned = std::move(*next_history);
  } else if (!record.has_async_step()) {
    selection_->Observe(record, job.spec());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_.set_rounds_committed(round);
    job_.set_allocated_last_round(committed.release_last_round());
    current_ = std::move(encoded);
  }
  spdlog::info("job {}: {} {} committed: accuracy {:.4f}, loss {:.4f}, {} of {} clients, {:.0f} ms", job.id(),
               record.has_async_step() ? "step" : "round", round, accuracy, loss, record.clients_reported(),
               record.clients_selected(), record.latency().total_ms());
  RecordRound(record);
  registry_->RecordCommitted(record);
  v1::JobEvent event;
  *event.mutable_job() = Summary();
  *event.mutable_round() = std::move(record);
  events_.Publish(std::move(event));
  return Status::Ok();
}

std::set<std::string> JobRunner::WorkersToTellOfTheEnd() {
  std::set<std::string> workers = std::exchange(tasked_, {});
  auto stored = store_->LoadSeats(job_id_, kMaxStoredSeats);
  if (!stored.ok()) {
    // Only the workers this process tasked are told; the others keep the job's data until they
    // restart.
    spdlog::warn("job {}: its seats could not be read to tell their workers it ended: {}", job_id_,
                 stored.status().message());
    return workers;
  }
  std::set<std::string> seats;
  for (auto& [seat, party] : *stored) seats.insert(std::move(seat));
  for (const auto& [seat, client] : GroupClients(*registry_)) {
    if (seats.count(seat) > 0) workers.insert(client.members.begin(), client.members.end());
  }
  return workers;
}

}  // namespace tessera::server
