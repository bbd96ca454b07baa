#include "server/jobs/async_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "base/format.h"
#include "proto/job_mapping.h"
#include "proto/record_bounds.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/round.h"

namespace tessera::server {
namespace {

// Reports a step's record keeps besides its folded updates' (refused, failed, dropped): the rest are counted.
constexpr size_t kMaxReportsPerStep = 256;
// A step's record lists at most buffer_size (<= kMaxParties) folded updates and these.
static_assert(size_t{wire::kMaxParties} + kMaxReportsPerStep <= wire::kMaxRoundReports);
// Workers a discarded step's message names; the others are counted.
constexpr size_t kNamedDiscarded = 8;

// A count as a record's 32-bit field holds it: at most UINT32_MAX.
uint32_t Saturated(uint64_t count) { return static_cast<uint32_t>(std::min<uint64_t>(count, UINT32_MAX)); }

}  // namespace

double StalenessWeight(const v1::AsyncSpec& spec, uint64_t staleness) {
  if (spec.staleness_weighting() == "constant") return 1.0;
  return 1.0 / std::pow(1.0 + static_cast<double>(staleness), spec.staleness_exponent());
}

AsyncDriver::AsyncDriver(JobRunner& runner)
    : runner_(runner),
      spec_(runner.Summary().spec()),
      options_(spec_.async()),
      clock_(runner.clock_),
      max_update_norm_(wire::MaxUpdateNorm(spec_)),
      clip_(wire::ClipsToUpdateNorm(spec_)),
      checked_hook_(runner.options_.async_checked_hook),
      folded_hook_(runner.options_.async_folded_hook) {}

std::shared_ptr<AsyncDriver::Buffer> AsyncDriver::NewBuffer() const {
  auto buffer = std::make_shared<Buffer>();
  // BeginRound reads only the layout and the strategy's options (strategy.h).
  buffer->aggregate = runner_.strategy_->BeginRound(*current_->shared_tensors());
  return buffer;
}

void AsyncDriver::Interrupt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_ = true;
  }
  cv_.notify_all();
}

size_t AsyncDriver::tasks_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size();
}

size_t AsyncDriver::buffered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffer_ ? buffer_->folded : 0;
}

std::string AsyncDriver::Describe(const v1::UpdateHeader& h) const {
  return "update from worker '" + h.worker_id() + "' for job " + runner_.job_id_ + " task " + std::to_string(h.round());
}

AsyncDriver::Buffer& AsyncDriver::JoinedLocked() const {
  for (const auto& sealed : sealed_) {
    if (sealed->reserved < options_.buffer_size()) return *sealed;
  }
  return *buffer_;
}

uint64_t AsyncDriver::StalenessLocked(uint64_t version) const {
  // The version an update folded now goes into: one past every step still to be made before
  // its buffer's, the one being applied included.
  const Buffer* joined = &JoinedLocked();
  size_t before = 0;  // sealed buffers ahead of it
  while (before < sealed_.size() && sealed_[before].get() != joined) ++before;
  const uint64_t target = current_->version() + (applying_ ? 1 : 0) + before;
  return version >= target ? 0 : target - version;
}

bool AsyncDriver::StepReadyLocked() const {
  return !sealed_.empty() && sealed_.front()->folding == 0 && sealed_.front()->reserved >= options_.buffer_size();
}

Result<const AsyncDriver::Task*> AsyncDriver::FindTaskLocked(const v1::UpdateHeader& h) const {
  const std::string what = Describe(h);
  if (h.job_id() != runner_.job_id_) return InvalidArgumentError(what + ": job '" + h.job_id() + "' is not this job");
  if (!current_) return UnavailableError(what + ": the job's model is not loaded yet");
  // Before the version's checks: a job resumed from an older checkpoint than its last step's
  // (the newest one damaged) is at a version older than the previous process's tasks.
  if (h.round() != 0 && h.round() <= resumed_after_) {
    return FailedPreconditionError(what + ": task " + std::to_string(h.round()) +
                                   " was handed out before the coordinator resumed the job (the tasks handed out "
                                   "since are numbered from " +
                                   std::to_string(uint64_t{resumed_after_} + 1) + "); its update cannot be taken");
  }
  const uint64_t base = h.base_model_version();
  if (base > current_->version()) {
    return FailedPreconditionError(what + ": trained from model version " + std::to_string(base) +
                                   ", newer than the current version " + std::to_string(current_->version()));
  }
  const uint64_t staleness = StalenessLocked(base);
  if (staleness > options_.max_staleness()) {
    return FailedPreconditionError(what + ": too stale: trained from model version " + std::to_string(base) +
                                   ", " + std::to_string(staleness) + " versions behind the model it would be " +
                                   "folded into; max_staleness is " + std::to_string(options_.max_staleness()));
  }
  auto it = tasks_.find(h.worker_id());
  if (it == tasks_.end()) {
    return FailedPreconditionError(what + ": the worker holds no task of this job (one from before a restart, a "
                                          "task already ended, or a cohort member that is not its leader)");
  }
  const Task& task = it->second;
  if (h.round() != task.number || h.attempt() != 1 || base != task.version) {
    return FailedPreconditionError(what + ": it answers task " + std::to_string(h.round()) + " attempt " +
                                   std::to_string(h.attempt()) + " on version " + std::to_string(base) +
                                   "; the worker's task is " + std::to_string(task.number) + " attempt 1 on version " +
                                   std::to_string(task.version));
  }
  if (task.folding) return FailedPreconditionError(what + ": the worker's update for this task arrived twice");
  return &task;
}

Result<AsyncDriver::TaskView> AsyncDriver::TaskOf(const std::string& worker_id, const std::string& what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto leader = leader_of_.find(worker_id);
  const auto task = leader == leader_of_.end() ? tasks_.end() : tasks_.find(leader->second);
  if (task == tasks_.end() || task->second.folding) {
    return PermissionDeniedError(what + " refused for worker '" + worker_id + "': it holds no task of job " +
                                 runner_.job_id_ + " still to report");
  }
  TaskView view;
  view.round = task->second.number;
  view.model_version = task->second.version;
  view.deadline = task->second.deadline;
  return view;
}

Result<std::shared_ptr<const ModelVersion>> AsyncDriver::Model(uint64_t version, const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!current_) return UnavailableError("job " + runner_.job_id_ + ": the global model is not loaded yet");
  if (auto leader = leader_of_.find(worker_id); leader != leader_of_.end()) {
    const Task& task = tasks_.at(leader->second);
    if (task.version == version && task.model) return task.model;
  }
  if (version == current_->version()) return current_;
  return FailedPreconditionError("job " + runner_.job_id_ + ": model version " + std::to_string(version) +
                                 " is not held for worker '" + worker_id + "'; the current version is " +
                                 std::to_string(current_->version()));
}

void AsyncDriver::RecordDownload(const std::string& worker_id, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto leader = leader_of_.find(worker_id);
  if (leader == leader_of_.end()) return;
  Task& task = tasks_.at(leader->second);
  if (task.version != version) return;
  if (task.downloaded.empty()) task.download_done = clock_->Now();
  task.downloaded.insert(worker_id);
  // Every member has the model: an older version need not stay in memory for this task.
  if (task.downloaded.size() == task.members.size()) task.model.reset();
}

Status AsyncDriver::Admit(const v1::UpdateHeader& h) const {
  const std::string what = Describe(h);
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(const Task* task, FindTaskLocked(h));
  if (!h.failure().empty()) return Status::Ok();
  if (h.samples() == 0) return InvalidArgumentError(what + ": field 'samples': expected a positive sample count, got 0");
  RETURN_IF_ERROR(CheckReportedFigures(h, what));
  if (h.samples() > task->max_samples) {
    return InvalidArgumentError(what + ": field 'samples': expected at most " + std::to_string(task->max_samples) +
                                " (the size of party " + std::to_string(task->party) + "), got " +
                                std::to_string(h.samples()));
  }
  return CheckUpdateEnvelope(h, *current_->shared_tensors(), extra_sets_, what);
}

v1::WorkerRoundReport AsyncDriver::BaseReport(const Task& task, const std::string& leader) const {
  v1::WorkerRoundReport report;
  report.set_worker_id(leader);
  if (!task.cohort.empty()) {
    report.set_cohort(task.cohort);
    for (const auto& [worker, generation] : task.members) report.add_members(worker);
  }
  if (task.download_done != Clock::TimePoint{}) report.set_download_done_ms(MillisBetween(task.sent, task.download_done));
  return report;
}

void AsyncDriver::AddReportLocked(Buffer& buffer, v1::WorkerRoundReport report, bool folded) {
  // Every folded update is listed (at most K); of the tasks that ended unfolded, the first
  // kMaxReportsPerStep, so that refusals piling up cannot push the folded ones out.
  if (!folded && buffer.unfolded_listed >= kMaxReportsPerStep) return;  // counted, not listed
  buffer.unfolded_listed += folded ? 0 : 1;
  buffer.reports.push_back(std::move(report));
}

bool AsyncDriver::RefuseStale(const v1::UpdateHeader& h, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (h.job_id() != runner_.job_id_ || !current_) return false;
  // An update for a task of the previous process crossed the coordinator's restart: no fault
  // of its worker's either, whatever version it names (a job resumed from an older checkpoint
  // than its last step's is at a version older than that task's).
  if (h.round() != 0 && h.round() <= resumed_after_) return true;
  if (h.base_model_version() > current_->version()) return false;
  auto it = tasks_.find(h.worker_id());
  // The task it answers, still held: Admit refuses such an update (outside a malformation)
  // only as too stale, even if a discarded step has made it fresh again since.
  const bool answers = it != tasks_.end() && !it->second.folding && it->second.number == h.round() &&
                       h.attempt() == 1 && it->second.version == h.base_model_version();
  if (!answers) return StalenessLocked(h.base_model_version()) > options_.max_staleness();
  v1::WorkerRoundReport report = BaseReport(it->second, h.worker_id());
  report.set_outcome("rejected: " + why.message());
  EndTaskLocked(h.worker_id(), std::move(report), /*refused=*/true, /*rest=*/false);
  return true;
}

void AsyncDriver::End(const std::string& cancel_reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  }
  if (!cancel_reason.empty()) {
    CancelAll(cancel_reason);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [leader, task] : tasks_) {
      if (!task.rendezvous_prefix.empty()) runner_.rendezvous_->ClearPrefix(task.rendezvous_prefix);
    }
    tasks_.clear();
    leader_of_.clear();
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return submitting_ == 0; });
}

void AsyncDriver::Reject(const v1::UpdateHeader& h, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(h.worker_id());
  // Only the task the update answers, as FindTaskLocked names it: in a job stored before task
  // numbers were reserved, a number may come again after a restart, on another version.
  if (it == tasks_.end() || it->second.folding || h.job_id() != runner_.job_id_ || it->second.number != h.round() ||
      h.attempt() != 1 || it->second.version != h.base_model_version()) {
    return;
  }
  v1::WorkerRoundReport report = BaseReport(it->second, h.worker_id());
  report.set_outcome("rejected: " + why.message());
  EndTaskLocked(h.worker_id(), std::move(report), /*refused=*/true);
}

Status AsyncDriver::Fail(const v1::UpdateHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(const Task* task, FindTaskLocked(h));
  v1::WorkerRoundReport report = BaseReport(*task, h.worker_id());
  report.set_outcome("failed: " + h.failure());
  EndTaskLocked(h.worker_id(), std::move(report), /*refused=*/false);
  return Status::Ok();
}

Status AsyncDriver::Submit(const v1::UpdateHeader& h, const TensorSet& delta, double upload_ms,
                           const std::map<std::string, TensorSet>& payload, bool* stale) {
  const std::string what = Describe(h);
  std::shared_ptr<const ModelVersion> current;
  Status admitted = Admit(h);
  if (admitted.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return FailedPreconditionError(what + ": the job has ended");
    admitted = FindTaskLocked(h).status();  // still its task: no step or other upload ended it
    if (admitted.ok()) {
      tasks_.at(h.worker_id()).folding = true;
      current = current_;
      ++submitting_;
    }
  }
  if (!admitted.ok()) {
    // Admitted when its header arrived, it may have become too stale while its tensors did (a
    // buffer filled, a step was committed): refused as on arrival, its task ended with the
    // refusal, its client free to train again at once, and not held against the worker.
    if (admitted.code() != StatusCode::kInvalidArgument && RefuseStale(h, admitted) && stale != nullptr) *stale = true;
    return admitted;
  }
  // End() waits for this upload until it is folded or refused: the strategy it folds into
  // is the job's, released when the job ends.
  struct Done {
    AsyncDriver& d;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(d.mu_);
        --d.submitting_;
      }
      d.cv_.notify_all();
    }
  } done{*this};
  // Checked outside the lock: other uploads are checked and folded meanwhile. The task is
  // marked folding from here on, so nothing else ends it: whatever is thrown until its fold is
  // done is the update's refusal, never a task left in flight for good.
  CheckedDelta checked;
  try {
    checked = CheckDelta(*current->shared_tensors(), delta, &payload, extra_sets_, max_update_norm_, clip_, what, {},
                         &non_negative_);
    if (checked_hook_) checked_hook_();
  } catch (const std::exception& e) {
    checked = CheckedDelta();
    checked.verdict = InternalError(what + ": checking it failed: " + e.what());
  } catch (...) {
    checked = CheckedDelta();
    checked.verdict = InternalError(what + ": checking it failed with an exception of unknown type");
  }
  std::shared_ptr<Buffer> buffer;
  ClientUpdate update;
  uint64_t staleness = 0;
  double weight = 1;
  v1::WorkerRoundReport report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = tasks_.find(h.worker_id());
    if (ended_ || found == tasks_.end()) {  // CancelAll or End: the job ended while the delta was checked
      return FailedPreconditionError(what + ": the job ended while the update was checked");
    }
    Task& task = found->second;
    report = BaseReport(task, h.worker_id());
    report.set_samples(h.samples());
    report.set_compute_ms(h.compute_ms());
    report.set_download_ms(h.download_ms());
    report.set_data_load_ms(h.data_load_ms());
    report.set_upload_ms(upload_ms);
    report.set_reported_ms(MillisBetween(task.sent, clock_->Now()));
    report.set_train_loss(h.train_loss());
    report.set_collective_backend(h.collective_backend());
    report.set_update_norm(checked.norm);
    // Staleness as of now: a step may have been committed while the delta was checked.
    staleness = StalenessLocked(task.version);
    Status verdict = checked.verdict;
    const bool too_stale = verdict.ok() && staleness > options_.max_staleness();
    if (too_stale) {
      verdict = FailedPreconditionError(what + ": too stale: trained from model version " +
                                        std::to_string(task.version) + ", " + std::to_string(staleness) +
                                        " versions behind the model it would be folded into; max_staleness is " +
                                        std::to_string(options_.max_staleness()));
      if (stale != nullptr) *stale = true;
    }
    // The buffer it joins: the open one, or a sealed one where a fold failed.
    Buffer& joined = JoinedLocked();
    // The buffer after the one this update fills, opened before anything is counted: when it
    // cannot be (its model-sized sums not allocated), the update is refused and the open
    // buffer stays open, instead of a sealed buffer waiting for a fold that never ends.
    std::shared_ptr<Buffer> next;
    if (verdict.ok() && &joined == buffer_.get() && buffer_->reserved + 1 >= options_.buffer_size()) {
      try {
        next = NewBuffer();
      } catch (const std::exception& e) {
        verdict = InternalError(what + ": opening the next step's buffer failed: " + e.what());
      } catch (...) {
        verdict = InternalError(what + ": opening the next step's buffer failed with an exception of unknown type");
      }
    }
    if (!verdict.ok()) {
      report.set_outcome("rejected: " + verdict.message());
      // A stale update is no failure of its client's: it may train again at once.
      EndTaskLocked(h.worker_id(), std::move(report), /*refused=*/true, /*rest=*/!too_stale);
      return verdict;
    }
    weight = StalenessWeight(options_, staleness);
    for (const auto& sealed : sealed_) {
      if (sealed.get() == &joined) buffer = sealed;
    }
    if (!buffer) buffer = buffer_;
    ++buffer->reserved;
    ++buffer->folding;
    if (next) {
      // Full: the next updates go to a new buffer while the job's thread applies this one.
      sealed_.push_back(buffer_);
      buffer_ = std::move(next);
    }
    update.client = h.worker_id();
    update.party = task.party;
  }
  update.samples = h.samples();
  update.local_steps = h.local_steps();
  update.step_normalizer = h.step_normalizer();
  update.delta = checked.clipped ? &*checked.clipped : &delta;
  if (checked.clipped) update.clip_factor = max_update_norm_ / checked.norm;
  update.payload = &payload;
  update.scale = weight;
  const auto start = clock_->Now();
  // On a gRPC thread: nothing thrown may leave it, and the buffer must learn the fold ended.
  Status folded;
  try {
    folded = buffer->aggregate->Fold(update);
  } catch (const std::exception& e) {
    folded = InternalError(std::string("folding it failed: ") + e.what());
  } catch (...) {
    folded = InternalError("folding it failed with an exception of unknown type");
  }
  std::lock_guard<std::mutex> lock(mu_);
  --buffer->folding;
  buffer->fold_ms += MillisBetween(start, clock_->Now());
  report.set_staleness(static_cast<uint32_t>(std::min<uint64_t>(staleness, UINT32_MAX)));
  report.set_staleness_weight(weight);
  if (!folded.ok()) {
    // Its place is free again: the step waits for another update to fold in it.
    --buffer->reserved;
    report.set_outcome("rejected: " + folded.message());
    EndTaskLocked(h.worker_id(), std::move(report), /*refused=*/true);
    return folded.WithContext(what);
  }
  ++buffer->folded;
  unfolded_in_a_row_ = 0;
  buffer->staleness_sum += static_cast<double>(staleness);
  buffer->max_staleness = std::max<uint32_t>(buffer->max_staleness, report.staleness());
  buffer->weighted_loss += static_cast<double>(h.samples()) * h.train_loss();
  buffer->samples += h.samples();
  // The task ends before its report is made: whatever that throws, the update stays folded and
  // its client is free (cv_ is notified: a client is free, and perhaps a buffer is ready).
  if (auto done = tasks_.find(h.worker_id()); done != tasks_.end()) RemoveTaskLocked(done);
  try {
    if (folded_hook_) folded_hook_();
    report.set_outcome(!checked.clipped ? std::string("accepted")
                                        : "accepted: clipped, its delta's L2 norm " + FormatNumber(checked.norm) +
                                              " scaled down to the job's max_update_norm " +
                                              FormatNumber(max_update_norm_));
    // The folded update's report belongs to the step that applies it.
    AddReportLocked(*buffer, std::move(report), /*folded=*/true);
  } catch (const std::exception& e) {
    spdlog::error("job {}: the report of folded {} is lost: {}", runner_.job_id_, what, e.what());
  } catch (...) {
    spdlog::error("job {}: the report of folded {} is lost", runner_.job_id_, what);
  }
  return Status::Ok();
}

Status AsyncDriver::ApplyStep(std::shared_ptr<Buffer> buffer) {
  const v1::Job job = runner_.Summary();
  const uint32_t step = job.rounds_committed() + 1;
  std::shared_ptr<const ModelVersion> current;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current = current_;
  }
  v1::RoundRecord record;
  record.set_job_id(job.id());
  record.set_round(step);
  record.set_attempt(1);
  record.set_clients_selected(Saturated(buffer->folded + buffer->refused + buffer->dropped));
  record.set_clients_reported(buffer->folded);
  if (buffer->samples > 0) record.set_train_loss(buffer->weighted_loss / static_cast<double>(buffer->samples));
  std::vector<double> compute, upload;
  for (const auto& report : buffer->reports) {
    if (report.outcome().rfind("accepted", 0) != 0) continue;
    compute.push_back(report.compute_ms());
    upload.push_back(report.upload_ms());
  }
  for (auto& report : buffer->reports) *record.add_workers() = std::move(report);
  wire::BoundRoundRecord(&record);  // its size is bounded (proto/record_bounds.h)
  auto& latency = *record.mutable_latency();
  latency.set_compute_ms_median(Median(compute));
  latency.set_compute_ms_max(compute.empty() ? 0 : *std::max_element(compute.begin(), compute.end()));
  latency.set_upload_ms(Median(upload));
  auto& async = *record.mutable_async_step();
  async.set_updates_folded(buffer->folded);
  async.set_updates_refused(Saturated(buffer->refused));
  async.set_tasks_dropped(Saturated(buffer->dropped));
  async.set_mean_staleness(buffer->folded ? buffer->staleness_sum / buffer->folded : 0);
  async.set_max_staleness(buffer->max_staleness);

  const auto finish_start = clock_->Now();
  Result<StrategyStep> next = buffer->folded > 0
                                  ? runner_.strategy_->Finish(*current->shared_tensors(), *buffer->aggregate)
                                  : Result<StrategyStep>(FailedPreconditionError("no update of the buffer was folded"));
  latency.set_aggregation_ms(buffer->fold_ms + MillisBetween(finish_start, clock_->Now()));
  Status usable = next.ok() ? CheckFinite(next->model, "the aggregated model") : next.status();
  if (usable.ok()) usable = CheckFinite(next->state, "the strategy's next state");
  if (!usable.ok()) {
    // Not committed: the buffer is discarded and the clients go on training.
    // The first kNamedDiscarded of them by name, the rest counted: a buffer holds up to
    // 10,000, and the message may become the job's error.
    std::string workers;
    size_t accepted = 0;
    for (const auto& report : record.workers()) {
      if (report.outcome().rfind("accepted", 0) != 0 || accepted++ >= kNamedDiscarded) continue;
      workers += (workers.empty() ? "'" : ", '") + report.worker_id() + "'";
    }
    if (accepted > kNamedDiscarded) workers += " and " + std::to_string(accepted - kNamedDiscarded) + " more";
    const std::string message = "step " + std::to_string(step) + ": " + usable.message() + "; not committed, its " +
                                std::to_string(buffer->folded) + " buffered updates (" + workers + ") discarded";
    spdlog::warn("job {}: {}", job.id(), message);
    runner_.Note(message);
    if (++consecutive_discards_ >= std::max<uint32_t>(1, spec_.max_round_attempts())) {
      return DataLossError(message + "; " + std::to_string(consecutive_discards_) + " steps in a row discarded");
    }
    return Status::Ok();
  }
  consecutive_discards_ = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    async.set_tasks_in_flight(static_cast<uint32_t>(tasks_.size()));
    async.set_tasks_sent(tasks_sent_);
  }
  const auto step_start = last_step_;
  last_step_ = clock_->Now();
  RETURN_IF_ERROR(runner_.CommitStep(std::move(record), std::move(next).value(), step_start));

  // The new version is current: tasks that can no longer be folded end now.
  std::vector<std::pair<std::string, uint32_t>> cancels;
  auto committed = runner_.Current();  // the runner's lock, never taken under mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(committed);
    applying_ = false;  // with the new version, under the same lock: the target stays put
    std::vector<std::string> stale;
    for (const auto& [leader, task] : tasks_) {
      if (!task.folding && StalenessLocked(task.version) > options_.max_staleness()) stale.push_back(leader);
    }
    for (const std::string& leader : stale) {
      Task& task = tasks_.at(leader);
      for (const auto& [worker, generation] : task.members) cancels.emplace_back(worker, task.number);
      v1::WorkerRoundReport report = BaseReport(task, leader);
      report.set_outcome("dropped: too stale to be folded (trained from version " + std::to_string(task.version) +
                         ", max_staleness " + std::to_string(options_.max_staleness()) + ")");
      // A client dropped for staleness has done nothing wrong: it may train again at once.
      EndTaskLocked(leader, std::move(report), /*refused=*/false, /*rest=*/false);
    }
  }
  for (const auto& [worker, number] : cancels) {
    runner_.SendCancel(worker, number, 1, "its model version is too stale to be folded");
  }
  return Status::Ok();
}

void AsyncDriver::PublishProgress() {
  constexpr size_t kShown = 8;
  v1::JobEvent event;
  *event.mutable_job() = runner_.Summary();
  auto* progress = event.mutable_progress();
  progress->set_round(event.job().rounds_committed() + 1);
  progress->set_attempt(1);
  std::vector<std::string> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress->set_selected(options_.buffer_size());
    progress->set_reported(buffer_->folded);
    for (const auto& [leader, task] : tasks_) {
      if (!task.folding) waiting.push_back(leader);
    }
  }
  for (size_t i = 0; i < waiting.size() && i < kShown; ++i) progress->add_waiting_on(waiting[i]);
  progress->set_waiting_more(static_cast<uint32_t>(waiting.size() > kShown ? waiting.size() - kShown : 0));
  runner_.events_.Publish(std::move(event));
}

Status AsyncDriver::Run() {
  const v1::Job job = runner_.Snapshot();
  auto current = runner_.Current();
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(current);
    extra_sets_ = runner_.strategy_->PayloadSets();
    non_negative_ = runner_.non_negative_;
    // Numbers go on past every number a previous process reserved in the job's row, and past
    // the last step's count and a step's worth of work (concurrency + K), all that a row
    // written before the reservation existed tells.
    const uint64_t counted = job.rounds_committed() == 0
                                 ? 0
                                 : uint64_t{job.last_round().async_step().tasks_sent()} + options_.concurrency() +
                                       options_.buffer_size();
    const uint64_t resumed = std::max<uint64_t>(job.async_tasks_reserved(), counted);
    tasks_sent_ = static_cast<uint32_t>(std::min<uint64_t>(resumed, UINT32_MAX));
    resumed_after_ = tasks_sent_;
    tasks_reserved_ = tasks_sent_;
    buffer_ = NewBuffer();
  }
  last_step_ = clock_->Now();
  spdlog::info("job {}: asynchronous from version {}: {} clients at once, a step every {} updates, max_staleness {}",
               job.id(), job.rounds_committed(), options_.concurrency(), options_.buffer_size(),
               options_.max_staleness());
  auto idle_since = clock_->Now();
  auto last_note = idle_since;
  auto last_progress = idle_since;
  std::pair<size_t, size_t> shown{SIZE_MAX, SIZE_MAX};  // tasks and buffered at the last progress event
  const auto poll = std::min(runner_.options_.worker_poll_interval, runner_.options_.liveness_check_interval);
  while (true) {
    if (runner_.stopping()) return CancelledError("job stopping");
    const uint32_t committed = runner_.Summary().rounds_committed();
    if (committed >= spec_.rounds()) {
      CancelAll("the job has made all its steps");
      return Status::Ok();
    }
    std::shared_ptr<Buffer> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      client_freed_ = false;  // a client freed from here on ends this iteration's wait at once
      if (StepReadyLocked()) {
        ready = sealed_.front();
        sealed_.pop_front();
        applying_ = true;
      }
    }
    if (ready) {
      Status applied = ApplyStep(std::move(ready));
      {
        std::lock_guard<std::mutex> lock(mu_);
        applying_ = false;  // a discarded step or a failure; a committed one cleared it with its version
      }
      if (!applied.ok()) {
        // A cancel or a stop that ended the step's wait to retry its commit is no failure:
        // the tasks out are left to End(), which tells their workers of a cancel, and of a
        // stop nothing (the job resumes at the next start).
        if (runner_.stopping()) return applied;
        CancelAll("the job failed");
        return applied;
      }
      continue;
    }
    // One reading for the iteration: time that passes after the rests and deadlines were
    // looked at is past the wait's deadline below, and ends it at once.
    const auto now = clock_->Now();
    EndLostAndLateTasks(now);
    // Too many tasks in a row ended without an update folded: no new task is handed out, and
    // the job fails once the tasks still out have ended too without one (one folded starts the
    // count again).
    bool holding = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto nothing_folded = NothingFoldedLocked(committed + 1)) {
        if (tasks_.empty()) return *nothing_folded;
        holding = true;
      }
    }
    auto filled = holding ? Result<size_t>(size_t{0}) : FillTasks(now);
    if (!filled.ok()) {
      CancelAll("the job failed");
      return filled.status();
    }
    const size_t idle = *filled;
    const size_t in_flight = tasks_in_flight(), buffered_now = buffered();
    if (in_flight == 0 && idle == 0) {
      // Nobody trains and nobody can: wait for workers as a synchronous round does.
      if (now - idle_since > runner_.options_.worker_wait_timeout) {
        CancelAll("the job failed");
        return FailedPreconditionError("step " + std::to_string(runner_.Summary().rounds_committed() + 1) +
                                       ": no client ready to train for " +
                                       std::to_string(runner_.options_.worker_wait_timeout.count()) + " ms");
      }
      if (now - last_note > std::chrono::seconds(10)) {
        last_note = now;
        runner_.Note("waiting for workers: no client ready to train");
      }
    } else {
      idle_since = now;
    }
    if ((std::pair{in_flight, buffered_now} != shown && now - last_progress >= std::chrono::seconds(1)) ||
        now - last_progress >= std::chrono::seconds(10)) {
      PublishProgress();
      shown = {in_flight, buffered_now};
      last_progress = now;
    }
    std::unique_lock<std::mutex> lock(mu_);
    auto until = now + (tasks_.size() < options_.concurrency() ? poll : runner_.options_.liveness_check_interval);
    // A task whose update is being checked or folded is not ended at its deadline: waking for it would spin.
    for (const auto& [leader, task] : tasks_) until = task.folding ? until : std::min(until, task.deadline);
    clock_->WaitUntil(lock, cv_, until, [&] {
      return interrupted_ || StepReadyLocked() || client_freed_;
    });
  }
}

}  // namespace tessera::server
