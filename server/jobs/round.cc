#include "server/jobs/round.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

#include "base/escape.h"
#include "base/format.h"
#include "proto/job_mapping.h"
#include "proto/record_bounds.h"

namespace tessera::server {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Round::Round(std::string job_id, uint32_t round, uint32_t attempt, uint64_t model_version,
             std::shared_ptr<const TensorSet> global, std::unique_ptr<RoundAggregate> aggregate,
             uint32_t min_clients, std::vector<std::string> extra_sets, double max_update_norm,
             NormPolicy norm_policy, const Clock* clock)
    : job_id_(std::move(job_id)),
      round_(round),
      attempt_(attempt),
      model_version_(model_version),
      global_(std::move(global)),
      global_max_abs_(global_ ? GlobalMagnitudes(*global_) : std::vector<float>{}),
      min_clients_(min_clients),
      extra_sets_(std::move(extra_sets)),
      max_update_norm_(max_update_norm),
      norm_policy_(norm_policy),
      clock_(clock),
      aggregate_(std::move(aggregate)) {}

void Round::AddParticipant(uint32_t party, std::vector<std::pair<std::string, uint64_t>> members,
                           const std::string& cohort, uint64_t max_samples) {
  std::lock_guard<std::mutex> lock(mu_);
  Participant p;
  p.party = party;
  p.max_samples = max_samples;
  p.members = std::move(members);
  const std::string leader = p.members.front().first;
  p.report.set_worker_id(leader);
  p.report.set_outcome("pending");
  if (!cohort.empty()) {
    p.report.set_cohort(cohort);
    for (const auto& [worker, generation] : p.members) p.report.add_members(worker);
  }
  for (const auto& [worker, generation] : p.members) participant_of_[worker] = leader;
  participants_[leader] = std::move(p);
  ++pending_;
}

bool Round::IsPending(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto of = participant_of_.find(worker_id);
  if (of == participant_of_.end()) return false;
  auto it = participants_.find(of->second);
  return it != participants_.end() && it->second.outcome == Outcome::kPending;
}

std::vector<std::string> Round::PendingWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> workers;
  for (const auto& [id, p] : participants_) {
    if (p.outcome != Outcome::kPending) continue;
    for (const auto& member : p.members) workers.push_back(member.first);
  }
  return workers;
}

void Round::CompleteAtAccepted(size_t accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  complete_at_accepted_ = accepted;
  NotifyWaitersLocked();
}

void Round::MarkDispatched() {
  std::lock_guard<std::mutex> lock(mu_);
  dispatched_ = clock_->Now();
}

std::string Round::Describe(const std::string& worker_id) const {
  return "update from worker '" + worker_id + "' for job " + job_id_ + " round " + std::to_string(round_);
}

Status Round::Admit(const v1::UpdateHeader& h) const {
  const std::string what = Describe(h.worker_id());
  if (h.job_id() != job_id_) return InvalidArgumentError(what + ": job '" + h.job_id() + "' is not this round's job");
  if (h.round() != round_ || h.attempt() != attempt_) {
    std::string when = h.round() < round_ || (h.round() == round_ && h.attempt() < attempt_) ? "a past" : "a future";
    return FailedPreconditionError(what + ": it is for " + when + " round (round " + std::to_string(h.round()) +
                                   " attempt " + std::to_string(h.attempt()) + "); the open round is " +
                                   std::to_string(round_) + " attempt " + std::to_string(attempt_));
  }
  if (h.base_model_version() != model_version_) {
    return FailedPreconditionError(what + ": trained from model version " + std::to_string(h.base_model_version()) +
                                   ", expected version " + std::to_string(model_version_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return FailedPreconditionError(what + ": the round has closed (" + close_reason_ + ")");
  auto it = participants_.find(h.worker_id());
  if (it == participants_.end()) {
    return FailedPreconditionError(what + ": the worker was not selected for this round (or is not its cohort's leader)");
  }
  if (it->second.outcome != Outcome::kPending) {
    return FailedPreconditionError(what + ": the worker already reported (" + it->second.report.outcome() + ")");
  }
  // The fields are judged only for a pending participant: an InvalidArgument is the
  // participant's malformed update, which its job logs and notes and holds against it
  // (JobRunner::RejectUpload), so any other worker's must not reach one (it is refused
  // above, rate-limited).
  if (h.samples() == 0 && h.failure().empty()) {
    return InvalidArgumentError(what + ": field 'samples': expected a positive sample count, got 0");
  }
  RETURN_IF_ERROR(CheckReportedFigures(h, what));
  if (h.failure().empty() && h.samples() > it->second.max_samples) {
    return InvalidArgumentError(what + ": field 'samples': expected at most " + std::to_string(it->second.max_samples) +
                                " (the size of party " + std::to_string(it->second.party) + "), got " +
                                std::to_string(h.samples()));
  }
  // Federated evaluation's figures: a share of the test split, an accuracy, a finite loss.
  if (h.eval_samples() > wire::kMaxLocalFilesSamples) {
    return InvalidArgumentError(what + ": field 'eval_samples': expected at most " +
                                std::to_string(wire::kMaxLocalFilesSamples) + ", got " + std::to_string(h.eval_samples()));
  }
  if (h.eval_samples() > 0 && (!(h.eval_accuracy() >= 0 && h.eval_accuracy() <= 1) ||
                               !(h.eval_loss() >= 0 && h.eval_loss() <= 1e9))) {
    return InvalidArgumentError(what + ": fields 'eval_accuracy' and 'eval_loss': expected an accuracy in [0, 1] and a " +
                                "loss in [0, 1e9], got " + FormatNumber(h.eval_accuracy()) + " and " +
                                FormatNumber(h.eval_loss()));
  }
  if (h.failure().empty()) {
    Status claims = aggregate_->CheckClaims(Claims(h, it->second.party));
    if (!claims.ok()) return claims.WithContext(what);
  }
  return Status::Ok();
}

ClientUpdate Round::Claims(const v1::UpdateHeader& h, uint32_t party) {
  ClientUpdate update;
  update.client = h.worker_id();
  update.party = party;
  update.samples = h.samples();
  update.local_steps = h.local_steps();
  update.step_normalizer = h.step_normalizer();
  return update;
}

Status Round::CheckManifest(const v1::UpdateHeader& h) const {
  return CheckUpdateEnvelope(h, *global_, extra_sets_, Describe(h.worker_id()), delta_encoding_);
}

void Round::Reject(const std::string& worker_id, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = participants_.find(worker_id);
  if (closed_ || it == participants_.end() || it->second.outcome != Outcome::kPending || it->second.folding) return;
  it->second.outcome = Outcome::kRejected;
  it->second.report.set_outcome("rejected: " + why.message());
  --pending_;
  NotifyWaitersLocked();
}

void Round::SetFoldedHook(std::function<void()> hook) { folded_hook_ = std::move(hook); }

void Round::SetReportHook(std::function<void()> hook) { report_hook_ = std::move(hook); }

void Round::SetDeltaEncoding(UpdateEncoding encoding, double topk_fraction) {
  delta_encoding_ = encoding;
  topk_fraction_ = topk_fraction;
}

Status Round::Submit(const v1::UpdateHeader& h, const TensorSet& delta, double upload_ms,
                     const std::map<std::string, TensorSet>* payload, uint64_t upload_bytes,
                     const TensorScans* delta_scans, HandedDelta handed) {
  // Called on a gRPC thread. What the checks throw (a copy of the model to clip it that finds
  // no memory, say) refuses the update in the round too: its participant must not stay
  // pending, or the round would wait for it until the deadline.
  try {
    RETURN_IF_ERROR(Admit(h));
    const std::string what = Describe(h.worker_id());
    CheckedDelta checked =
        CheckDelta(*global_, delta, payload, extra_sets_, max_update_norm_, norm_policy_ == NormPolicy::kClip, what,
                   ScanHints{&global_max_abs_, delta_scans}, &non_negative_);
    return FoldChecked(h, delta, std::move(checked), upload_ms, payload, upload_bytes, handed);
  } catch (const std::exception& e) {
    return RefuseThrown(h, e.what());
  } catch (...) {
    return RefuseThrown(h, "an exception of unknown type");
  }
}

Status Round::SubmitTrained(const v1::UpdateHeader& h, TensorSet& trained, double upload_ms,
                            const std::map<std::string, TensorSet>* payload, uint64_t upload_bytes,
                            HandedDelta handed) {
  try {  // as in Submit
    RETURN_IF_ERROR(Admit(h));
    const std::string what = Describe(h.worker_id());
    CheckedDelta checked = CheckTrainedDelta(*global_, trained, payload, extra_sets_, max_update_norm_,
                                             norm_policy_ == NormPolicy::kClip, what, &non_negative_);
    return FoldChecked(h, trained, std::move(checked), upload_ms, payload, upload_bytes, handed);
  } catch (const std::exception& e) {
    return RefuseThrown(h, e.what());
  } catch (...) {
    return RefuseThrown(h, "an exception of unknown type");
  }
}

Status Round::RefuseThrown(const v1::UpdateHeader& h, const char* error) {
  // Only this round's participant: a header for another job, round or attempt says nothing
  // about the worker's seat here.
  if (h.job_id() == job_id_ && h.round() == round_ && h.attempt() == attempt_ &&
      h.base_model_version() == model_version_) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = participants_.find(h.worker_id());
    // A participant folding, accepted or rejected is left as it is: the exception came after
    // its outcome was decided, or from a second upload of the same worker.
    if (!closed_ && it != participants_.end() && it->second.outcome == Outcome::kPending && !it->second.folding) {
      Participant& p = it->second;
      p.outcome = Outcome::kRejected;  // counted first, with nothing that allocates
      --pending_;
      try {
        p.report.set_outcome(std::string("rejected: checking it failed: ") + error);
      } catch (...) {
        p.report.mutable_outcome()->assign("rejected");  // short: kept in the string itself
      }
      NotifyWaitersLocked();
    }
  }
  return InternalError(Describe(h.worker_id()) + ": checking it failed: " + error);
}

Status Round::FoldChecked(const v1::UpdateHeader& h, const TensorSet& delta, CheckedDelta checked, double upload_ms,
                          const std::map<std::string, TensorSet>* payload, uint64_t upload_bytes,
                          HandedDelta handed) {
  const std::string what = Describe(h.worker_id());
  const Status valid = checked.verdict;
  const double norm = checked.norm;
  const bool non_finite_alone = checked.non_finite_alone;
  const std::optional<TensorSet>& clipped = checked.clipped;
  // The report's outcome once folded, made before the fold: once the update is in the
  // aggregate, nothing thrown may keep it from being counted and reported.
  std::string accepted = !clipped ? std::string("accepted")
                                  : "accepted: clipped, its delta's L2 norm " + FormatNumber(norm) +
                                        " scaled down to the job's max_update_norm " + FormatNumber(max_update_norm_);
  uint32_t party = 0;  // the participant's seat, read under the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& p = participants_[h.worker_id()];
    if (closed_ || p.outcome != Outcome::kPending || p.folding) {
      return FailedPreconditionError(what + ": the round closed, or the worker's update arrived twice, while it was checked");
    }
    p.report.set_samples(h.samples());
    p.report.set_compute_ms(h.compute_ms());
    p.report.set_download_ms(h.download_ms());
    p.report.set_data_load_ms(h.data_load_ms());
    p.report.set_upload_ms(upload_ms);
    p.report.set_upload_bytes(upload_bytes);
    p.report.set_reported_ms(MillisBetween(dispatched_, clock_->Now()));
    p.report.set_train_loss(h.train_loss());
    if (h.eval_samples() > 0) {
      p.report.set_local_test_samples(h.eval_samples());
      p.report.set_local_test_accuracy(h.eval_accuracy());
      p.eval_loss = h.eval_loss();
    }
    p.report.set_collective_backend(h.collective_backend());
    p.report.set_update_norm(norm);
    p.update_norm = norm;
    p.non_finite_alone = non_finite_alone;
    if (report_hook_) report_hook_();
    if (!valid.ok()) {
      p.outcome = Outcome::kRejected;  // never folded in
      p.report.set_outcome("rejected: " + valid.message());
      --pending_;
      NotifyWaitersLocked();
      return valid;
    }
    p.folding = true;
    ++folding_;
    party = p.party;
  }
  // Folded outside the round's lock: other uploads fold concurrently, and the runner's
  // waits and liveness checks are not held up by an update's arithmetic.
  const auto start = clock_->Now();
  // Called on a gRPC thread: nothing thrown may leave it, and the participant must not stay
  // "folding" (Close() waits for it), so building the update's claims is inside the try too.
  Status folded;
  try {
    ClientUpdate update = Claims(h, party);
    update.delta = clipped ? &*clipped : &delta;
    if (clipped) update.clip_factor = max_update_norm_ / norm;
    update.payload = payload;
    update.handed = handed;  // taken only where it is the delta folded (not a clipped copy)
    folded = aggregate_->Fold(update);
  } catch (const std::exception& e) {
    folded = InternalError(std::string("folding it failed: ") + e.what());
  } catch (...) {
    folded = InternalError("folding it failed with an exception of unknown type");
  }
  const double fold_ms = MillisBetween(start, clock_->Now());
  std::lock_guard<std::mutex> lock(mu_);
  auto& p = participants_[h.worker_id()];
  p.folding = false;
  --folding_;
  aggregation_ms_ += fold_ms;
  --pending_;
  if (!folded.ok()) {
    p.outcome = Outcome::kRejected;
    p.report.set_outcome("rejected: " + folded.message());
  } else {
    // Counted and reported first, with nothing that allocates (the outcome moves into the
    // string AddParticipant set): the update is in the aggregate, so the round's record must
    // say so whatever the rest throws.
    p.outcome = Outcome::kAccepted;
    p.report.set_outcome(std::move(accepted));
    ++accepted_;
    if (!quorum_at_ && accepted_ >= min_clients_) quorum_at_ = clock_->Now();
    try {
      if (folded_hook_) folded_hook_();
      upload_ms_.push_back(upload_ms);
    } catch (const std::exception& e) {
      spdlog::error("job {}: the upload time of folded {} is left out of the round's median: {}", job_id_, what,
                    e.what());
    } catch (...) {
      spdlog::error("job {}: the upload time of folded {} is left out of the round's median", job_id_, what);
    }
  }
  NotifyWaitersLocked();
  return folded.ok() ? folded : folded.WithContext(what);
}

Status Round::Fail(const v1::UpdateHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = participants_.find(h.worker_id());
  if (closed_ || it == participants_.end() || it->second.outcome != Outcome::kPending || it->second.folding) {
    return FailedPreconditionError(Describe(h.worker_id()) + ": failure report for a round it is not pending in");
  }
  it->second.outcome = Outcome::kDropped;
  it->second.report.set_outcome("failed: " + h.failure());
  --pending_;
  NotifyWaitersLocked();
  return Status::Ok();
}

void Round::RecordDownload(const std::string& worker_id, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  download_bytes_ += bytes;
  auto it = participants_.find(worker_id);
  if (it != participants_.end()) {
    it->second.download_done = clock_->Now();
    it->second.report.set_download_bytes(it->second.report.download_bytes() + bytes);
  }
}

bool Round::CompleteLocked() const {
  return pending_ == 0 || (complete_at_accepted_ > 0 && accepted_ >= complete_at_accepted_);
}

bool Round::Complete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return CompleteLocked();
}

void Round::NotifyWaitersLocked() {
  // Only when a wait can end: the runner waking at every update cost the coordinator a
  // context switch per client and round.
  if (CompleteLocked() || (closed_ && folding_ == 0)) cv_.notify_all();
}

bool Round::WaitComplete(Clock::TimePoint until) {
  std::unique_lock<std::mutex> lock(mu_);
  clock_->WaitUntil(lock, cv_, until, [&] { return CompleteLocked() || interrupted_; });
  return CompleteLocked();
}

void Round::Interrupt() {
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = true;
  cv_.notify_all();
}

std::vector<std::string> Round::Close(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;  // no new fold starts
  close_reason_ = reason;
  cv_.wait(lock, [&] { return folding_ == 0; });
  closed_at_ = clock_->Now();
  std::vector<std::string> dropped;
  for (auto& [id, p] : participants_) {
    if (p.outcome == Outcome::kPending) {
      p.outcome = Outcome::kDropped;
      p.report.set_outcome("dropped: " + reason);
      p.report.set_dropped_ms(MillisBetween(dispatched_, closed_at_));
      for (const auto& member : p.members) dropped.push_back(member.first);
    }
  }
  pending_ = 0;
  return dropped;
}

size_t Round::accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_;
}

Result<StrategyStep> Round::Finish(const Strategy& strategy) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_ || folding_ > 0) {
      return InternalError("round " + std::to_string(round_) + ": finished before it was closed");
    }
  }
  // Outside the round's lock: once closed with no fold in flight nothing changes the
  // aggregate, and a robust rule's combination takes O(clients^2 x model) for Krum. Meanwhile
  // the round's late uploads, downloads and rendezvous calls still look at it (Admit,
  // IsPending, RecordDownload), each on one of gRPC's threads, which must not wait for it.
  const auto start = clock_->Now();
  auto step = strategy.Finish(*global_, *aggregate_);
  const double ms = MillisBetween(start, clock_->Now());
  std::lock_guard<std::mutex> lock(mu_);
  aggregation_ms_ += ms;
  return step;
}

std::vector<Round::Suspect> Round::NonFiniteSuspects() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto suspect = [](const Participant& p, const std::string& why) {
    Suspect s;
    for (const auto& member : p.members) s.workers.push_back(member.first);
    s.description = "worker '" + p.members.front().first + "' (" + why + ")";
    return s;
  };
  std::vector<Suspect> suspects;
  const Participant* largest = nullptr;
  for (const auto& [id, p] : participants_) {
    if (p.outcome != Outcome::kAccepted) continue;
    if (p.non_finite_alone) {
      suspects.push_back(suspect(p, "its update alone overflows the model, norm " + FormatNumber(p.update_norm)));
    }
    if (largest == nullptr || p.update_norm > largest->update_norm) largest = &p;
  }
  if (suspects.empty() && largest != nullptr) {
    suspects.push_back(suspect(*largest, "the largest update, norm " + FormatNumber(largest->update_norm)));
  }
  return suspects;
}

std::string Round::DescribeSuspects(const std::vector<Suspect>& suspects) {
  if (suspects.empty()) return "nobody";
  std::string described;
  for (size_t i = 0; i < suspects.size() && i < kNamedSuspects; ++i) {
    described += (i == 0 ? "" : ", ") + suspects[i].description;
  }
  if (suspects.size() > kNamedSuspects) described += " and " + std::to_string(suspects.size() - kNamedSuspects) + " more";
  return described;
}

std::string Round::DescribeNotAccepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string described;
  size_t named = 0, more = 0;
  for (const auto& [id, p] : participants_) {
    if (p.outcome == Outcome::kAccepted) continue;
    if (named == kNamedSuspects) {
      ++more;
      continue;
    }
    // A worker's failure text is its own: escaped and cut, as any input.
    described += (named++ == 0 ? "" : ", ") + EscapeUntrusted(id, 128) + " (" +
                 EscapeUntrusted(p.report.outcome(), 160) + ")";
  }
  if (named == 0) return "nobody";
  if (more > 0) described += " and " + std::to_string(more) + " more";
  return described;
}

double Round::aggregation_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aggregation_ms_;
}

void Round::FillRecord(v1::RoundRecord* record) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> compute;
  double distribution = 0;
  double loss_sum = 0;
  uint64_t samples = 0;
  double eval_samples = 0, eval_accuracy_sum = 0, eval_loss_sum = 0;  // federated evaluation
  const Participant* critical = nullptr;  // the accepted report that arrived last
  double data_load_max = 0;
  uint64_t upload_bytes = 0;
  for (const auto& [id, p] : participants_) {
    v1::WorkerRoundReport* report = record->add_workers();
    *report = p.report;
    wire::BoundReport(report);  // the record's size is bounded (proto/record_bounds.h)
    if (p.download_done > dispatched_) report->set_download_done_ms(MillisBetween(dispatched_, p.download_done));
    if (p.outcome != Outcome::kAccepted) continue;
    upload_bytes += p.report.upload_bytes();
    if (critical == nullptr || p.report.reported_ms() > critical->report.reported_ms()) critical = &p;
    data_load_max = std::max(data_load_max, p.report.data_load_ms());
    compute.push_back(p.report.compute_ms());
    if (p.download_done > dispatched_) distribution = std::max(distribution, MillisBetween(dispatched_, p.download_done));
    loss_sum += p.report.train_loss() * static_cast<double>(p.report.samples());
    samples += p.report.samples();
    const double n = static_cast<double>(p.report.local_test_samples());
    eval_samples += n;
    eval_accuracy_sum += p.report.local_test_accuracy() * n;
    eval_loss_sum += p.eval_loss * n;
  }
  if (eval_samples > 0) {
    record->set_federated_accuracy(eval_accuracy_sum / eval_samples);
    record->set_federated_loss(eval_loss_sum / eval_samples);
  }
  record->set_clients_selected(static_cast<uint32_t>(participants_.size()));
  record->set_clients_reported(static_cast<uint32_t>(accepted_));
  record->set_upload_bytes(upload_bytes);
  record->set_download_bytes(download_bytes_);
  record->set_train_loss(samples ? loss_sum / static_cast<double>(samples) : 0);
  auto* latency = record->mutable_latency();
  latency->set_distribution_ms(distribution);
  latency->set_compute_ms_median(Median(compute));
  latency->set_compute_ms_max(compute.empty() ? 0 : *std::max_element(compute.begin(), compute.end()));
  latency->set_upload_ms(Median(upload_ms_));
  latency->set_straggler_wait_ms(quorum_at_ ? MillisBetween(*quorum_at_, closed_at_) : 0);
  latency->set_aggregation_ms(aggregation_ms_);
  latency->set_data_load_ms_max(data_load_max);
  if (critical != nullptr) {
    latency->set_critical_worker(critical->report.worker_id());
    latency->set_critical_download_ms(critical->report.download_ms());
    latency->set_critical_data_load_ms(critical->report.data_load_ms());
    latency->set_critical_compute_ms(critical->report.compute_ms());
    latency->set_critical_upload_ms(critical->report.upload_ms());
    latency->set_after_last_report_ms(std::max(0.0, MillisBetween(dispatched_, closed_at_) - critical->report.reported_ms()));
  }
}

}  // namespace tessera::server
