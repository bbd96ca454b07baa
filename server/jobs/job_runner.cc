#include "server/jobs/job_runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "proto/job_mapping.h"
#include "proto/record_bounds.h"
#include "server/jobs/async_driver.h"
#include "server/monitoring/coordinator_metrics.h"

namespace tessera::server {

namespace {

// An asynchronous round's tasks never offer TrainTask.takes_trained_weights.
Status AsyncTakesDeltas(const v1::UpdateHeader& header) {
  return InvalidArgumentError("update from worker '" + header.worker_id() + "' for job " + header.job_id() +
                              ": field 'trained_weights': asynchronous rounds take deltas only");
}

// A job whose model travels compressed (spec.compression.download) takes deltas only: a
// worker trains from the model as it decoded it, which the coordinator does not hold, so a
// trained model could not be made the delta the worker trained (it would carry the encoding's
// rounding as if it were training). Its tasks never offer TrainTask.takes_trained_weights.
Status DecodedModelTakesDeltas(const v1::UpdateHeader& header, UpdateEncoding download) {
  return InvalidArgumentError("update from worker '" + header.worker_id() + "' for job " + header.job_id() +
                              ": field 'trained_weights': this job's model travels in " + UpdateEncodingName(download) +
                              "; its updates are deltas from the model as decoded");
}

}  // namespace

JobRunner::JobRunner(v1::Job job, StateStore* store, WorkerRegistry* registry, RendezvousStore* rendezvous,
                     JobRunnerOptions options)
    : store_(store),
      registry_(registry),
      rendezvous_(rendezvous),
      options_(options),
      clock_(options_.clock),
      job_(std::move(job)),
      seats_(store, job_.id()),
      selection_(CreateSelectionPolicy(job_.spec())),
      job_id_(job_.id()),
      update_buffers_(options_.idle_update_buffer_bytes) {
  // A resumed job's row may predate the bound on its error.
  job_.set_error(wire::BoundedText(job_.error(), wire::kMaxJobErrorBytes));
}

JobRunner::~JobRunner() { Stop(); }

void JobRunner::Start() { thread_ = std::thread([this] { Run(); }); }

void JobRunner::Stop() {
  stop_ = true;
  WakeWaits();
  if (thread_.joinable()) thread_.join();
}

void JobRunner::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A cancel that comes as the job ends is no cancel pending on it (Finish).
    if (!wire::JobEnded(job_.state())) job_.set_cancel_requested(true);
  }
  cancel_ = true;
  WakeWaits();
}

void JobRunner::WakeWaits() {
  // The flags are set before the waiters' mutexes are taken: a waiter sees them, or is
  // asleep and is notified.
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
  }
  wake_cv_.notify_all();
  std::shared_ptr<Round> round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
  }
  if (round) round->Interrupt();
  if (auto driver = Driver()) driver->Interrupt();
}

double JobRunner::MillisSince(Clock::TimePoint start) const {
  return std::chrono::duration<double, std::milli>(clock_->Now() - start).count();
}

v1::Job JobRunner::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_;
}

v1::Job JobRunner::Listed() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!job_.has_last_round()) return job_;
  // The reports are moved aside for the copy and back, as in Summary().
  google::protobuf::RepeatedPtrField<v1::WorkerRoundReport> reports;
  job_.mutable_last_round()->mutable_workers()->Swap(&reports);
  v1::Job listed = job_;
  job_.mutable_last_round()->mutable_workers()->Swap(&reports);
  return listed;
}

v1::JobState JobRunner::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_.state();
}

v1::Job JobRunner::Summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!job_.has_last_round()) return job_;
  std::unique_ptr<v1::RoundRecord> last(job_.release_last_round());
  v1::Job summary = job_;
  job_.set_allocated_last_round(last.release());
  return summary;
}

Result<std::shared_ptr<const ModelVersion>> JobRunner::Model(uint64_t version, const std::string& worker_id) const {
  if (auto driver = Driver(); driver && !finished_) return driver->Model(version, worker_id);
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return FailedPreconditionError("job " + job_.id() + " has ended; it serves no model");
  if (!current_) return UnavailableError("job " + job_.id() + ": the global model is not loaded yet");
  if (version != job_.rounds_committed()) {
    return FailedPreconditionError("job " + job_.id() + ": model version " + std::to_string(version) +
                                   " is not current; the current version is " + std::to_string(job_.rounds_committed()));
  }
  if (auto it = participant_models_.find(worker_id); it != participant_models_.end()) return it->second;
  return current_;
}

void JobRunner::RecordDownload(const std::string& worker_id, uint64_t version, uint64_t bytes) {
  if (auto driver = Driver()) return driver->RecordDownload(worker_id, version);
  std::shared_ptr<Round> round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
  }
  if (round && round->model_version() == version) round->RecordDownload(worker_id, bytes);
}

std::pair<UpdateEncoding, double> JobRunner::DeltaEncoding() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!round_) return {UpdateEncoding::kFloat32, 0.0};
  return {round_->delta_encoding(), round_->topk_fraction()};
}

Result<JobRunner::OpenRound> JobRunner::SelectedRound(const std::string& worker_id, const std::string& what) const {
  if (auto driver = Driver()) {
    ASSIGN_OR_RETURN(AsyncDriver::TaskView task, driver->TaskOf(worker_id, what));
    return OpenRound{task.round, task.attempt, task.model_version, task.deadline};
  }
  std::shared_ptr<Round> round;
  OpenRound open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!round_) {
      return PermissionDeniedError(what + " refused for worker '" + worker_id + "': job " + job_.id() +
                                   " has no round open");
    }
    round = round_;
    open.deadline = round_deadline_;
  }
  open.round = round->round();
  open.attempt = round->attempt();
  open.model_version = round->model_version();
  if (!round->IsPending(worker_id)) {
    return PermissionDeniedError(what + " refused for worker '" + worker_id + "': it is not a participant of job " +
                                 round->job_id() + " round " + std::to_string(open.round) + " attempt " +
                                 std::to_string(open.attempt) + " still to report");
  }
  return open;
}

Status JobRunner::AdmitUpload(const v1::UpdateHeader& header) const {
  if (auto driver = Driver()) {
    if (header.trained_weights()) return AsyncTakesDeltas(header);
    return driver->Admit(header);
  }
  std::shared_ptr<Round> round;
  UpdateEncoding download;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
    if (!round) {
      return FailedPreconditionError("update from worker '" + header.worker_id() + "' for job " + job_.id() +
                                     " round " + std::to_string(header.round()) + ": no round is open (" +
                                     std::to_string(job_.rounds_committed()) + " rounds committed)");
    }
    download = wire::JobDownloadEncoding(job_.spec());
  }
  RETURN_IF_ERROR(round->Admit(header));
  if (header.trained_weights() && download != UpdateEncoding::kFloat32) return DecodedModelTakesDeltas(header, download);
  if (header.failure().empty()) RETURN_IF_ERROR(round->CheckManifest(header));
  return Status::Ok();
}

bool JobRunner::CancelledAsOverSelected(const v1::UpdateHeader& header) const {
  std::lock_guard<std::mutex> lock(mu_);
  return header.job_id() == job_.id() && header.round() == over_selected_.round &&
         header.attempt() == over_selected_.attempt && over_selected_.workers.count(header.worker_id()) > 0;
}

void JobRunner::RejectUpload(const v1::UpdateHeader& header, const Status& why) {
  std::shared_ptr<Round> round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
  }
  registry_->RecordRejected(header.worker_id());
  spdlog::warn("job {}: refused {}", header.job_id(), why.message());
  Note("refused " + why.message());
  if (auto driver = Driver()) driver->Reject(header, why);
  if (round && round->round() == header.round() && round->attempt() == header.attempt()) {
    round->Reject(header.worker_id(), why);
  }
}

void JobRunner::RefuseArrival(const v1::UpdateHeader& header, const Status& why) {
  if (why.code() == StatusCode::kInvalidArgument) return RejectUpload(header, why);
  if (auto driver = Driver(); driver && driver->RefuseStale(header, why)) return;
  if (!CancelledAsOverSelected(header)) registry_->RecordRejected(header.worker_id());
}

Status JobRunner::SubmitUpdate(const v1::UpdateHeader& header, TensorSet& delta, double upload_ms,
                               const std::map<std::string, TensorSet>& payload, uint64_t upload_bytes,
                               const TensorScans* delta_scans) {
  std::shared_ptr<Round> round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
  }
  auto driver = Driver();
  if (!round && !driver) return AdmitUpload(header);
  // Called on a gRPC thread: an exception is the update's refusal, not the process's end.
  Status verdict;
  bool stale = false;  // an asynchronous update too stale to be folded: the protocol, not the worker's fault
  try {
    if (driver) {
      verdict = header.trained_weights() ? AsyncTakesDeltas(header)
                                         : driver->Submit(header, delta, upload_ms, payload, &stale);
    } else {
      // A trained model becomes its delta as the round checks it.
      // The delta's buffers go with it: the aggregate may fold it later beside others and
      // gives them back to the job's pool then.
      const HandedDelta handed{&delta, &update_buffers_};
      verdict = header.trained_weights()
                    ? round->SubmitTrained(header, delta, upload_ms, &payload, upload_bytes, handed)
                    : round->Submit(header, delta, upload_ms, &payload, upload_bytes, delta_scans, handed);
    }
  } catch (const std::exception& e) {
    verdict = InternalError("update from worker '" + header.worker_id() + "' for job " + header.job_id() +
                            ": checking it failed: " + e.what());
  }
  // An update that crossed its worker's cancel as over-selected is not the worker's fault.
  // An accepted one counts for its worker when its round commits (RecordCommitted).
  if (!verdict.ok() && !(stale || CancelledAsOverSelected(header))) registry_->RecordRejected(header.worker_id());
  if (!verdict.ok()) {
    spdlog::warn("job {}: refused {}", header.job_id(), verdict.message());
    Note("refused " + verdict.message());
  }
  return verdict;
}

Status JobRunner::ReportFailure(const v1::UpdateHeader& header) {
  std::shared_ptr<Round> round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round = round_;
  }
  auto driver = Driver();
  if (!round && !driver) return AdmitUpload(header);
  RETURN_IF_ERROR(AdmitUpload(header));
  RETURN_IF_ERROR(driver ? driver->Fail(header) : round->Fail(header));
  registry_->RecordRejected(header.worker_id());
  const std::string message = "worker '" + header.worker_id() + "' could not train round " +
                              std::to_string(header.round()) + ": " + header.failure();
  spdlog::warn("job {}: {}", header.job_id(), message);
  Note(message);
  return Status::Ok();
}

void JobRunner::PublishProgress(const Round& open, size_t selected, Clock::TimePoint deadline) {
  constexpr size_t kShown = 8;
  v1::JobEvent event;
  *event.mutable_job() = Summary();
  auto* progress = event.mutable_progress();
  progress->set_round(open.round());
  progress->set_attempt(open.attempt());
  progress->set_selected(static_cast<uint32_t>(selected));
  progress->set_reported(static_cast<uint32_t>(open.accepted()));
  const std::vector<std::string> waiting = open.PendingWorkers();
  for (size_t i = 0; i < waiting.size() && i < kShown; ++i) progress->add_waiting_on(waiting[i]);
  progress->set_waiting_more(static_cast<uint32_t>(waiting.size() > kShown ? waiting.size() - kShown : 0));
  progress->set_deadline_in_ms(
      std::max(0.0, std::chrono::duration<double, std::milli>(deadline - clock_->Now()).count()));
  events_.Publish(std::move(event));
}

void JobRunner::Note(const std::string& message) {
  v1::JobEvent event;
  *event.mutable_job() = Summary();
  event.set_message(message);
  events_.Publish(std::move(event));
}

bool JobRunner::SleepUnlessStopped(std::chrono::milliseconds delay) {
  std::unique_lock<std::mutex> lock(wake_mu_);
  return clock_->WaitUntil(lock, wake_cv_, clock_->Now() + delay, [this] { return stop_.load(); });
}

void JobRunner::WaitUnlessStopping(std::chrono::milliseconds delay) {
  std::unique_lock<std::mutex> lock(wake_mu_);
  clock_->WaitUntil(lock, wake_cv_, clock_->Now() + delay, [this] { return stopping(); });
}

void JobRunner::RecordEnd(const v1::Job& job, const std::string& state_name) {
  auto delay = options_.record_retry_delay;
  for (int attempt = 1;; ++attempt) {
    Status saved = store_->UpdateJob(job);
    if (saved.ok()) {
      if (attempt > 1) {
        spdlog::info("job {}: its end ({}) is recorded, at try {}", job.id(), state_name, attempt);
        Note("the job's end (" + state_name + ") is recorded, at try " + std::to_string(attempt));
      }
      return;
    }
    const std::string message = "cannot record the job's end (" + state_name + ") at try " + std::to_string(attempt) +
                                ": " + saved.message();
    if (stop_.load()) {
      spdlog::error("job {}: {}; the coordinator is stopping: the job stays as last recorded and is resumed at the "
                    "next start", job.id(), message);
      Note(message + "; not retried: the coordinator is stopping");
      return;
    }
    spdlog::error("job {}: {}; retrying in {} ms", job.id(), message, delay.count());
    Note(message + "; retrying in " + std::to_string(delay.count()) + " ms");
    if (SleepUnlessStopped(delay)) continue;  // one last try before giving up
    delay = std::min(delay * 2, options_.max_record_retry_delay);
  }
}

void JobRunner::Finish(v1::JobState state, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_.set_state(state);
    // Whatever text the failure carried (a worker's among it) is cut to the bound
    // (proto/record_bounds.h), in the job's row and in the log alike.
    job_.set_error(wire::BoundedText(error, wire::kMaxJobErrorBytes));
    // An ended job has no cancel pending, whether one ended it (its state says so) or one
    // was recorded as it ended otherwise.
    job_.clear_cancel_requested();
    round_.reset();
    async_.reset();
    participant_models_.clear();
  }
  v1::Job job = Snapshot();
  const std::string state_name = wire::JobStateName(state);
  RecordEnd(job, state_name);
  std::string message = "job " + job.id() + " " + state_name;
  if (!job.error().empty()) message += ": " + job.error();
  spdlog::info("{}", message);
  Note(message);
  events_.End();
  rendezvous_->ClearPrefix("rendezvous/" + job.id() + "/");  // a cohort's keys of the round it ended in
  // The workers that trained for it let go of what they hold for it (a cancel of round 0, which
  // no task has; a worker that does not know it ignores it), those tasked before a restart too.
  for (const std::string& worker : WorkersToTellOfTheEnd()) SendCancel(worker, 0, 0, "the job " + state_name);
  // An ended job keeps only its record (in the store): its model, evaluation data and device
  // are released now, and the coordinator drops the runner.
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_.reset();
  }
  evaluator_.reset();
  strategy_.reset();
  update_buffers_.Clear();
  finished_ = true;
}

void JobRunner::Run() {
  // Nothing thrown in the job's thread ends the process: the job ends FAILED, durably, so a
  // restart does not resume it into the same exception.
  std::string thrown;
  try {
    RunJob();
    return;
  } catch (const std::bad_alloc&) {
    thrown = "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    thrown = std::string("exception: ") + e.what();
  } catch (...) {
    thrown = "an exception of unknown type";
  }
  try {
    spdlog::error("job {}: {}", job_.id(), thrown);
    if (!finished_.load()) Finish(v1::JOB_FAILED, "internal error in the job's thread: " + thrown);
  } catch (...) {
    spdlog::critical("job {}: cannot end the job after {}", job_.id(), thrown);
    finished_ = true;
  }
}

void JobRunner::RunJob() {
  // A cancel recorded before the coordinator stopped: nothing more runs.
  if (Summary().cancel_requested()) {
    Finish(v1::JOB_CANCELLED, "cancelled by the user");
    return;
  }
  // A spec stored before today's limits (a resumed job) is checked again.
  if (Status valid = wire::ValidateJobSpec(Summary().spec()); !valid.ok()) {
    Finish(v1::JOB_FAILED, "the job's spec is not accepted: " + valid.message());
    return;
  }
  Status prepared = Prepare();
  // A read that failed for a passing reason (too many open files, an I/O error) is tried
  // again a few times before the job ends on it.
  auto delay = options_.record_retry_delay;
  for (int retry = 0; retry < kPrepareRetries && prepared.code() == StatusCode::kUnavailable && !stopping(); ++retry) {
    spdlog::warn("job {}: {}; trying again in {} ms", job_.id(), prepared.message(), delay.count());
    WaitUnlessStopping(delay);  // a cancel or a stop ends the wait
    if (stopping()) break;
    delay = std::min(delay * 2, options_.max_record_retry_delay);
    prepared = Prepare();
  }
  if (cancel_) {
    // Answered Ok to the user: the job ends cancelled, whatever Prepare was doing.
    Finish(v1::JOB_CANCELLED, "cancelled by the user");
    return;
  }
  if (!prepared.ok()) {
    if (!stop_) Finish(v1::JOB_FAILED, prepared.ToString());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_.set_state(v1::JOB_RUNNING);
  }
  if (Status s = store_->UpdateJob(Snapshot()); !s.ok()) spdlog::error("job {}: {}", job_.id(), s.ToString());
  const v1::JobSpec spec = Summary().spec();
  if (wire::IsAsync(spec)) {
    RunAsync();
    return;
  }
  const uint32_t max_attempts = std::max<uint32_t>(1, spec.max_round_attempts());
  while (!stopping()) {
    const uint32_t round = Summary().rounds_committed() + 1;
    if (round > spec.rounds()) {
      Finish(v1::JOB_SUCCEEDED, "");
      return;
    }
    AttemptOutcome result;
    uint32_t attempt = 1;
    excluded_.clear();
    for (; attempt <= max_attempts && !stopping(); ++attempt) {
      result = RunAttempt(round, attempt);
      if (result.kind != AttemptOutcome::Kind::kTooFewClients && result.kind != AttemptOutcome::Kind::kNonFiniteModel) {
        break;
      }
      spdlog::warn("job {}: {}", job_.id(), result.status.message());
      Note(result.status.message() + (attempt < max_attempts ? "; retrying" : ""));
      if (attempt < max_attempts) RecordRetry(job_.id());
    }
    if (cancel_) {
      Finish(v1::JOB_CANCELLED, "cancelled by the user");
      return;
    }
    if (stop_) return;
    if (result.kind != AttemptOutcome::Kind::kCommitted) {
      Finish(v1::JOB_FAILED, "round " + std::to_string(round) + " failed after " +
                                 std::to_string(std::min(attempt, max_attempts)) + " attempt(s): " +
                                 result.status.message());
      return;
    }
  }
  if (cancel_) Finish(v1::JOB_CANCELLED, "cancelled by the user");
}

Result<std::vector<Client>> JobRunner::SelectClients(uint32_t round, uint32_t attempt, std::string* shortfall) {
  const v1::JobSpec spec = Summary().spec();
  const uint32_t parties = SeatedParties(spec);
  const auto wait_start = clock_->Now();
  auto last_note = wait_start;
  while (true) {
    if (stopping()) {
      *shortfall = "job stopping";
      return std::vector<Client>();
    }
    ASSIGN_OR_RETURN(std::vector<Client> candidates, ReadyClients(parties));
    if (candidates.size() >= spec.min_clients()) return selection_->Choose(std::move(candidates), spec, round, attempt);
    if (clock_->Now() - wait_start > options_.worker_wait_timeout) {
      *shortfall = "round " + std::to_string(round) + ": only " + std::to_string(candidates.size()) +
                   " clients ready, min_clients is " + std::to_string(spec.min_clients());
      return std::vector<Client>();
    }
    if (clock_->Now() - last_note > std::chrono::seconds(10)) {
      last_note = clock_->Now();
      Note("waiting for workers: " + std::to_string(candidates.size()) + " clients ready, " +
           std::to_string(spec.min_clients()) + " needed");
    }
    WaitUnlessStopping(options_.worker_poll_interval);
  }
}

JobRunner::AttemptOutcome JobRunner::RunAttempt(uint32_t round, uint32_t attempt) {
  using Kind = AttemptOutcome::Kind;
  const auto round_start = clock_->Now();
  const v1::Job job = Summary();
  const v1::JobSpec& spec = job.spec();
  v1::RoundRecord record;
  record.set_job_id(job.id());
  record.set_round(round);
  record.set_attempt(attempt);

  // Selection.
  const auto selection_start = clock_->Now();
  std::string shortfall;
  ASSIGN_OR_RETURN(auto selected, SelectClients(round, attempt, &shortfall));
  if (stopping()) return {Kind::kStopped, CancelledError("job stopping")};
  if (selected.empty()) return {Kind::kTooFewClients, FailedPreconditionError(shortfall)};
  record.mutable_latency()->set_selection_ms(MillisSince(selection_start));

  // Distribution: open the round, then send each selected worker its task.
  std::shared_ptr<const TensorSet> global;
  {
    std::lock_guard<std::mutex> lock(mu_);
    global = current_->shared_tensors();
  }
  auto open = std::make_shared<Round>(job.id(), round, attempt, job.rounds_committed(), global,
                                      strategy_->BeginRound(*global), spec.min_clients(), strategy_->PayloadSets(),
                                      wire::MaxUpdateNorm(spec),
                                      wire::ClipsToUpdateNorm(spec) ? Round::NormPolicy::kClip : Round::NormPolicy::kRefuse,
                                      clock_);
  open->SetDeltaEncoding(wire::JobUpdateEncoding(spec), wire::TopKFraction(spec));
  open->SetNonNegative(non_negative_);
  if (options_.round_folded_hook) open->SetFoldedHook(options_.round_folded_hook);
  for (const Client& client : selected) {
    std::vector<std::pair<std::string, uint64_t>> members;
    for (const auto& worker : client.members) members.emplace_back(worker, registry_->Generation(worker));
    open->AddParticipant(client.party, std::move(members), client.cohort, MaxSamples(client.party));
  }
  // A strategy that sends each participant its own sets (SCAFFOLD) has them encoded now.
  ParticipantModels downloads =
      EncodeParticipantModels(*strategy_, *global, selected, job.rounds_committed(), options_.chunk_bytes);
  const std::vector<std::string> model_sets = strategy_->DownloadSets();
  const auto deadline = clock_->Now() + std::chrono::milliseconds(spec.round_deadline_ms());
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_ = open;
    round_deadline_ = deadline;
    participant_models_ = std::move(downloads);
  }
  const int64_t deadline_unix_ms = UnixMillis() + spec.round_deadline_ms();
  // Over-selected: the round closes once clients_per_round updates are accepted.
  open->CompleteAtAccepted(spec.clients_per_round());
  open->MarkDispatched();
  const std::string rendezvous_prefix =
      "rendezvous/" + job.id() + "/" + std::to_string(round) + "/" + std::to_string(attempt) + "/";
  v1::TrainTask task;
  task.set_job_id(job.id());
  task.set_round(round);
  task.set_attempt(attempt);
  task.set_model_version(job.rounds_committed());
  *task.mutable_spec() = spec;
  task.set_deadline_unix_ms(deadline_unix_ms);
  for (const std::string& set : model_sets) task.add_model_sets(set);
  task.set_takes_trained_weights(options_.take_trained_weights &&
                                 wire::JobDownloadEncoding(spec) == UpdateEncoding::kFloat32);
  // Serialized once for the round; each worker's task adds its own fields to these bytes.
  const auto task_wire = std::make_shared<const std::string>(task.SerializeAsString());
  rendezvous_->Open(rendezvous_prefix);  // closed by the ClearPrefix below, with its keys
  for (const Client& client : selected) SendTrainTask(client, task, rendezvous_prefix, task_wire);
  if (selected.size() > spec.clients_per_round()) {
    spdlog::info("job {}: round {} attempt {}: {} clients selected, {} over clients_per_round; it closes at {} updates",
                 job.id(), round, attempt, selected.size(), selected.size() - spec.clients_per_round(),
                 spec.clients_per_round());
  } else {
    spdlog::info("job {}: round {} attempt {}: {} clients selected", job.id(), round, attempt, selected.size());
  }

  // Wait for every participant (or, over-selected, for clients_per_round updates), the
  // deadline, or the loss of the ones still pending. Watchers are told who is awaited: when
  // one reports (at most every second) and every 10 s.
  size_t last_pending = selected.size();
  auto last_progress = clock_->Now();
  // Whether the wait ended before the deadline because no participant was left pending (all
  // reported, were refused or were lost), or the round had its updates.
  bool closed_before_deadline = false;
  while (clock_->Now() < deadline && !stopping()) {
    const size_t pending = open->DropLost(
        [this](const std::string& id, uint64_t generation) { return registry_->IsAlive(id, generation); });
    if (pending == 0 || open->Complete()) {
      closed_before_deadline = true;
      break;
    }
    const auto now = clock_->Now();
    if ((pending != last_pending && now - last_progress >= std::chrono::seconds(1)) ||
        now - last_progress >= std::chrono::seconds(10)) {
      PublishProgress(*open, selected.size(), deadline);
      last_pending = pending;
      last_progress = now;
    }
    open->WaitComplete(std::min(deadline, now + options_.liveness_check_interval));
  }
  // Complete with participants still pending: they were over-selected, and are cancelled
  // without counting against them.
  const bool over_selected = open->Complete() && !open->PendingWorkers().empty();
  const std::string close_reason =
      over_selected ? "over-selected, the round had its " + std::to_string(spec.clients_per_round()) + " updates"
                    : "deadline passed";
  const auto stragglers = open->Close(close_reason);
  rendezvous_->ClearPrefix(rendezvous_prefix);
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_.reset();
    participant_models_.clear();
    if (over_selected) over_selected_ = {round, attempt, {stragglers.begin(), stragglers.end()}};
  }
  for (const auto& worker : stragglers) {
    SendCancel(worker, round, attempt,
               over_selected ? "the round closed with its " + std::to_string(spec.clients_per_round()) +
                                   " updates (over-selected)"
                             : "the round's deadline passed");
  }
  if (stopping()) return {Kind::kStopped, CancelledError("job stopping")};
  if (open->accepted() < spec.min_clients()) {
    // Short before the deadline: the clients that did not report were lost or refused, which a
    // longer round_deadline_s would not have changed; they are named.
    const std::string shortfall =
        closed_before_deadline
            ? " selected clients reported; the round closed before its deadline with none left to wait for: " +
                  open->DescribeNotAccepted() + "; min_clients is "
            : " selected clients reported by the deadline; min_clients is ";
    return {Kind::kTooFewClients, FailedPreconditionError("round " + std::to_string(round) + " attempt " + std::to_string(attempt) + ": " +
                                   std::to_string(open->accepted()) + " of " + std::to_string(selected.size()) +
                                   shortfall + std::to_string(spec.min_clients()))};
  }

  // Aggregation (the streaming part already happened as updates arrived).
  ASSIGN_OR_RETURN(StrategyStep step, open->Finish(*strategy_));
  open->FillRecord(&record);
  // A model that is not finite is never committed: the round is tried again without the
  // clients whose updates made it so.
  Status finite = CheckFinite(step.model, "the aggregated model");
  if (finite.ok()) finite = CheckFinite(step.state, "the strategy's next state");
  if (!finite.ok()) {
    const std::vector<Round::Suspect> suspects = open->NonFiniteSuspects();
    for (const Round::Suspect& suspect : suspects) excluded_.insert(suspect.workers.begin(), suspect.workers.end());
    return {Kind::kNonFiniteModel,
            DataLossError("round " + std::to_string(round) + " attempt " + std::to_string(attempt) + ": " +
                          finite.message() + "; not committed; left out of the round's next attempts: " +
                          Round::DescribeSuspects(suspects))};
  }

  RETURN_IF_ERROR(CommitStep(std::move(record), std::move(step), round_start));
  return {AttemptOutcome::Kind::kCommitted};
}

}  // namespace tessera::server
