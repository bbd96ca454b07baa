#include "server/monitoring/coordinator_metrics.h"

#include <initializer_list>

#include "base/metrics.h"

namespace tessera::server {
namespace {

struct Families {
  metrics::HistogramFamily& phase = metrics::Global().Histogram(
      "tessera_round_phase_seconds",
      "Time of each phase of a committed round, and of the whole round (phase=\"total\"), in seconds.",
      {"job", "phase"}, metrics::LatencyBuckets());
  metrics::CounterFamily& committed =
      metrics::Global().Counter("tessera_rounds_committed_total", "Rounds committed.", {"job"});
  metrics::CounterFamily& retried = metrics::Global().Counter(
      "tessera_rounds_retried_total", "Attempts of a round that did not commit and were tried again.", {"job"});
  metrics::CounterFamily& commit_failures = metrics::Global().Counter(
      "tessera_commit_failures_total",
      "Tries to commit a round or step whose checkpoint or record could not be written (a full disk, an I/O error, "
      "a database lock held elsewhere, ...), each try counted.",
      {"job"});
  metrics::CounterFamily& updates = metrics::Global().Counter(
      "tessera_updates_total",
      "Workers' updates in committed rounds by outcome (accepted, refused: a check failed, dropped: "
      "missed the deadline, failed, left, or cancelled as over-selected once the round had its updates) and reason (none, "
      "clipped, norm, samples, layout, not_finite, failed, deadline, over_selected, stale, lost, other).",
      {"job", "outcome", "reason"});
  metrics::CounterFamily& round_bytes = metrics::Global().Counter(
      "tessera_round_bytes_total",
      "Tensor bytes on the wire in committed rounds: direction=\"upload\", the accepted updates as encoded; "
      "direction=\"download\", the models sent to the participants.",
      {"job", "direction"});
  metrics::CounterFamily& stragglers = metrics::Global().Counter(
      "tessera_stragglers_total", "Selected workers dropped from a committed round at its deadline.", {"job"});
  metrics::GaugeFamily& communication = metrics::Global().Gauge(
      "tessera_round_communication_ratio",
      "Share of the last committed round's time spent distributing the model and uploading updates (0 to 1).",
      {"job"});
  metrics::HistogramFamily& compute = metrics::Global().Histogram(
      "tessera_worker_compute_seconds", "A worker's local training time in a round, as it reported it, in seconds.",
      {"worker"}, metrics::CoarseLatencyBuckets());
  metrics::HistogramFamily& download = metrics::Global().Histogram(
      "tessera_worker_download_seconds", "A worker's model download time in a round, as it reported it, in seconds.",
      {"worker"}, metrics::CoarseLatencyBuckets());
  metrics::HistogramFamily& upload = metrics::Global().Histogram(
      "tessera_worker_upload_seconds", "A worker's update upload time in a round, as the coordinator saw it, in seconds.",
      {"worker"}, metrics::CoarseLatencyBuckets());
  metrics::CounterFamily& download_bytes = metrics::Global().Counter(
      "tessera_worker_download_bytes_total", "Bytes of models sent to a worker.", {"worker"});
  metrics::CounterFamily& upload_bytes = metrics::Global().Counter(
      "tessera_worker_upload_bytes_total", "Bytes of updates received from a worker.", {"worker"});
  metrics::CounterFamily& received = metrics::Global().Counter(
      "tessera_updates_received_total",
      "Updates received whole, by the way they came: way=\"session\", inside a worker's task session; "
      "way=\"call\", by an upload call.",
      {"way"});
};

Families& F() {
  static Families* families = new Families();
  return *families;
}

bool StartsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// The outcome's class, by the prefix the round writes (server/jobs/round.cc): "accepted...",
// "rejected: ..." (a check refused it), "failed: ..." (the worker could not train: it leaves
// the round, as a dropped participant does) or "dropped: ...".
std::string Outcome(const std::string& outcome) {
  if (StartsWith(outcome, "accepted")) return "accepted";  // "accepted: clipped, ..." too
  if (StartsWith(outcome, "dropped") || StartsWith(outcome, "failed")) return "dropped";
  return "refused";
}

// A bounded class of the outcome's reason. What follows a prefix is partly from the wire (a
// worker's own failure text, a worker's name): a failure or a drop is classed by its prefix
// alone, so that a worker whose training says "not finite", or one named "deadline-7" that
// left, is counted as what happened to it. A refusal is classed by its check's message.
std::string Reason(const std::string& outcome) {
  auto has = [&](const char* text) { return outcome.find(text) != std::string::npos; };
  if (outcome == "accepted") return "none";
  if (StartsWith(outcome, "accepted: clipped")) return "clipped";
  if (StartsWith(outcome, "failed")) return "failed";
  if (StartsWith(outcome, "dropped: over-selected")) return "over_selected";
  if (StartsWith(outcome, "dropped: deadline")) return "deadline";
  // An asynchronous update past max_staleness: the protocol's bound, not the worker's fault.
  // A name cannot hold the refusal's words (names have no spaces or colons).
  if (StartsWith(outcome, "dropped: too stale")) return "stale";
  if (StartsWith(outcome, "dropped")) return "lost";
  if (has(": too stale: trained from model version")) return "stale";
  if (has("max_update_norm")) return "norm";
  if (has("'samples'")) return "samples";
  if (has("finite")) return "not_finite";
  if (has("expected shape") || has("expected name") || has("tensors") || has("dtype") || has("set '")) return "layout";
  return "other";
}

}  // namespace

void RecordRound(const v1::RoundRecord& r) {
  Families& f = F();
  const std::string& job = r.job_id();
  const auto& l = r.latency();
  const std::pair<const char*, double> phases[] = {
      {"selection", l.selection_ms()},       {"distribution", l.distribution_ms()},
      {"compute", l.compute_ms_max()},       {"upload", l.upload_ms()},
      {"straggler_wait", l.straggler_wait_ms()}, {"aggregation", l.aggregation_ms()},
      {"evaluation", l.evaluation_ms()},     {"commit", l.commit_ms()},
      {"data_load", l.data_load_ms_max()},   {"after_last_report", l.after_last_report_ms()},
      {"other", l.other_ms()},               {"total", l.total_ms()}};
  for (const auto& [phase, ms] : phases) f.phase.With({job, phase}).Observe(ms / 1000.0);
  f.committed.With({job}).Inc();
  f.round_bytes.With({job, "upload"}).Inc(static_cast<double>(r.upload_bytes()));
  f.round_bytes.With({job, "download"}).Inc(static_cast<double>(r.download_bytes()));
  if (l.total_ms() > 0) {
    f.communication.With({job}).Set((l.distribution_ms() + l.upload_ms()) / l.total_ms());
  }
  for (const auto& w : r.workers()) {
    const std::string outcome = Outcome(w.outcome());
    const std::string reason = Reason(w.outcome());
    f.updates.With({job, outcome, reason}).Inc();
    if (reason == "deadline") f.stragglers.With({job}).Inc();
    if (outcome != "accepted") continue;
    f.compute.With({w.worker_id()}).Observe(w.compute_ms() / 1000.0);
    f.download.With({w.worker_id()}).Observe(w.download_ms() / 1000.0);
    f.upload.With({w.worker_id()}).Observe(w.upload_ms() / 1000.0);
  }
  // Series that exist before their first event read 0 rather than being absent.
  f.retried.With({job});
  f.stragglers.With({job});
}

void RecordRetry(const std::string& job_id) { F().retried.With({job_id}).Inc(); }

void RecordCommitFailure(const std::string& job_id) { F().commit_failures.With({job_id}).Inc(); }

void RetireJob(const std::string& job_id) {
  Families& f = F();
  for (metrics::FamilyBase* family : std::initializer_list<metrics::FamilyBase*>{
           &f.phase, &f.committed, &f.retried, &f.commit_failures, &f.updates, &f.round_bytes, &f.stragglers, &f.communication}) {
    family->Retire("job", job_id);
  }
}

void RetireWorker(const std::string& worker_id) {
  Families& f = F();
  for (metrics::FamilyBase* family : std::initializer_list<metrics::FamilyBase*>{
           &f.compute, &f.download, &f.upload, &f.download_bytes, &f.upload_bytes}) {
    family->Retire("worker", worker_id);
  }
}

void RecordDownloadBytes(const std::string& worker_id, uint64_t bytes) {
  F().download_bytes.With({worker_id}).Inc(static_cast<double>(bytes));
}

void RecordUploadBytes(const std::string& worker_id, uint64_t bytes) {
  F().upload_bytes.With({worker_id}).Inc(static_cast<double>(bytes));
}

void RecordUpdateReceived(const std::string& way) { F().received.With({way}).Inc(); }

double UpdatesReceived(const std::string& way) { return F().received.With({way}).value(); }

}  // namespace tessera::server
