// One attempt at one federated round: who was selected, what each reported, and the
// running aggregate. The job runner opens it, the worker service feeds it updates, and the
// runner closes it at its deadline, when every participant has reported, or (with
// over-selection) once it has accepted the updates it wants: the participants still pending
// are then dropped as over-selected, and an update of theirs that arrives later is refused
// before its tensors are read.
//
// Thread-safe: uploads arrive on gRPC threads while the runner waits. An accepted update is
// folded into the strategy's aggregate outside the round's lock, so uploads of different
// clients fold concurrently; Close() waits for the folds in flight.
//
// Time (dispatch, reports, quorum, close, the folds' duration, WaitComplete's deadline)
// is read from the Clock given at construction, which must outlive the round.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "core/tensor.h"
#include "core/update_codec.h"
#include "server/jobs/update_checks.h"
#include "server/strategy/strategy.h"
#include "tessera/v1/job.pb.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

// The median of `values`, 0 when there are none: the round record's per-worker summaries.
double Median(std::vector<double> values);

class Round {
 public:
  enum class Outcome { kPending, kAccepted, kRejected, kDropped };
  struct Participant {
    uint32_t party = 0;
    // The workers behind this client, leader first, each with its session generation when
    // the task was sent. One for a lone worker; the members for a site cohort.
    std::vector<std::pair<std::string, uint64_t>> members;
    Outcome outcome = Outcome::kPending;
    v1::WorkerRoundReport report;
    Clock::TimePoint download_done{};
    bool folding = false;  // its update is being folded, outside the lock
    uint64_t max_samples = 0;     // the size of its party: more samples than this are refused
    double update_norm = 0;       // its delta's L2 norm, once checked
    double eval_loss = 0;         // federated evaluation: its reported loss on its local test split
    bool non_finite_alone = false;  // the global model plus its delta alone overflows float
  };

  // What an update whose delta's L2 norm exceeds the bound meets: refused, or scaled down to
  // the bound and aggregated (its report's outcome then reads "accepted: clipped ...").
  enum class NormPolicy { kRefuse, kClip };

  // `max_update_norm`: the bound on an update's delta's L2 norm, applied by `norm_policy`.
  Round(std::string job_id, uint32_t round, uint32_t attempt, uint64_t model_version,
        std::shared_ptr<const TensorSet> global, std::unique_ptr<RoundAggregate> aggregate,
        uint32_t min_clients, std::vector<std::string> extra_sets = {},
        double max_update_norm = std::numeric_limits<double>::infinity(), NormPolicy norm_policy = NormPolicy::kRefuse,
        const Clock* clock = &SteadyClock());

  const std::string& job_id() const { return job_id_; }
  uint32_t round() const { return round_; }
  uint32_t attempt() const { return attempt_; }
  uint64_t model_version() const { return model_version_; }

  // A client keyed by its leader (members[0]); `cohort` is empty for a lone worker.
  // `max_samples`: the most samples its update may claim (its party's size).
  void AddParticipant(uint32_t party, std::vector<std::pair<std::string, uint64_t>> members,
                      const std::string& cohort = "", uint64_t max_samples = UINT64_MAX);
  // The round is complete once `accepted` updates are accepted, even with participants
  // still pending (over-selection: clients_per_round of more selected). 0 (the default): only
  // when none is pending. Set before MarkDispatched.
  void CompleteAtAccepted(size_t accepted);
  void MarkDispatched();
  // How the job's "delta" sets must be encoded (spec.compression; float32 unless set), and
  // top-k's fraction. Set before the round is dispatched; every other set stays float32.
  void SetDeltaEncoding(UpdateEncoding encoding, double topk_fraction);
  UpdateEncoding delta_encoding() const { return delta_encoding_; }
  // Per tensor of the model, whether its values may not be negative (a batch norm's running
  // variance): an update that would take one below 0 is refused, naming the tensor. Set
  // before the round is dispatched; none without it.
  void SetNonNegative(std::vector<bool> non_negative) { non_negative_ = std::move(non_negative); }
  // Runs in an upload after its update was folded, as the round counts it; what it throws is
  // logged, and the update stays accepted with its report. A seam for tests (set before
  // dispatch).
  void SetFoldedHook(std::function<void()> hook);
  // Runs in an upload as its participant's report is filled, under the round's lock, before
  // the fold. What it throws refuses the update, as an exception in its checks does. A seam
  // for tests (set before dispatch).
  void SetReportHook(std::function<void()> hook);
  double topk_fraction() const { return topk_fraction_; }

  // Checks an upload's header before its tensors arrive: the right job, round, attempt and
  // model version, a selected worker that has not reported yet, a positive sample count no
  // larger than its party.
  Status Admit(const v1::UpdateHeader& header) const;
  // Checks the upload's envelope before any tensor bytes are read: its sets (a "delta" set
  // and every payload set the strategy reads, no other; "delta" in the job's encoding, every
  // other set in float32) and each set's manifest against the global model's layout (names,
  // shapes, and the dtype its encoding sends).
  // Admit also asks the strategy's aggregate about the header's claims (CheckClaims).
  Status CheckManifest(const v1::UpdateHeader& header) const;
  // Marks a selected worker's update as refused for `why` (a broken or mismatched transfer).
  void Reject(const std::string& worker_id, const Status& why);
  // Validates the delta (layout, finite values, its L2 norm within the bound, or clipped to
  // it) and folds it into the aggregate. A refused update never touches the aggregate; its
  // participant is marked rejected with the reason. An exception thrown before the fold (in
  // the checks, or as the report is filled) refuses the update the same way, with an
  // internal error that names what was thrown: the round does not wait for it any longer.
  // `upload_bytes`: the update's bytes as they came on the wire (encoded), for the round's
  // record. `delta_scans`: the delta's tensors as the assembler scanned them on arrival
  // (ScanHints), or null. `handed`: the caller gives up `delta`'s buffers (handed.tensors ==
  // &delta), which the aggregate may keep to fold later beside others (ClientUpdate::handed);
  // an update clipped to the bound is folded from its clipped copy at once.
  Status Submit(const v1::UpdateHeader& header, const TensorSet& delta, double upload_ms,
                const std::map<std::string, TensorSet>* payload = nullptr, uint64_t upload_bytes = 0,
                const TensorScans* delta_scans = nullptr, HandedDelta handed = {});
  // Submit for an update sent as the trained model (header.trained_weights): `trained`
  // becomes its delta from this round's model as it is checked (CheckTrainedDelta).
  Status SubmitTrained(const v1::UpdateHeader& header, TensorSet& trained, double upload_ms,
                       const std::map<std::string, TensorSet>* payload = nullptr, uint64_t upload_bytes = 0,
                       HandedDelta handed = {});
  // A download of this round's model finished, `bytes` of tensors sent; any worker's (a
  // cohort's members download too) counts in the round's download bytes.
  void RecordDownload(const std::string& worker_id, uint64_t bytes = 0);
  // The worker reports that it cannot train this round; it is dropped with `reason`.
  Status Fail(const v1::UpdateHeader& header);

  // Marks participants with a member whose session is gone as dropped; returns how many are
  // still pending.
  template <typename AliveFn>
  size_t DropLost(AliveFn&& alive);
  // Every worker of the participants that are still pending (to cancel their work).
  std::vector<std::string> PendingWorkers() const;
  // Whether `worker_id` is a worker of a participant still pending; no copy of the list (it
  // is asked at every download and upload).
  bool IsPending(const std::string& worker_id) const;
  // Whether the round has what it waits for: no participant pending, or the accepted
  // updates CompleteAtAccepted asks for.
  bool Complete() const;
  // Blocks until the round is complete, Interrupt() was called, or the round's clock reaches
  // `until`; returns whether it is complete.
  bool WaitComplete(Clock::TimePoint until);
  // Ends every WaitComplete, now and later, at once (the job is stopping). Does not block.
  void Interrupt();
  // Stops accepting updates (waiting for the folds in flight, which count) and drops the
  // pending participants with outcome "dropped: " + `reason`, noting when (dropped_ms);
  // returns their workers, cohort members included. An upload that comes later is refused
  // with `reason` in its message.
  std::vector<std::string> Close(const std::string& reason);

  size_t accepted() const;
  // Fills the record's per-worker reports and latency phases from what was measured.
  void FillRecord(v1::RoundRecord* record) const;
  // The next model and the strategy's next state, from the folded updates (timed as
  // aggregation). Only after Close().
  Result<StrategyStep> Finish(const Strategy& strategy);
  double aggregation_ms() const;
  // When the aggregate made a model that is not finite: the clients to blame, each as its
  // workers (leader first) and a description for logs. The accepted updates that overflow
  // the model on their own; if none does, the accepted update with the largest norm.
  struct Suspect {
    std::vector<std::string> workers;
    std::string description;
  };
  std::vector<Suspect> NonFiniteSuspects() const;
  // The suspects for a message: the first kNamedSuspects described, the rest counted (a round
  // may have thousands, and the message may become the job's error). "nobody" when empty.
  static constexpr size_t kNamedSuspects = 8;
  static std::string DescribeSuspects(const std::vector<Suspect>& suspects);
  // The participants whose update was not accepted, for a message: the first kNamedSuspects as
  // "WORKER (OUTCOME)", escaped and bounded, the rest counted. "nobody" when every one was.
  std::string DescribeNotAccepted() const;

 private:
  // Submit's second half: records the checked update and folds it when it is valid.
  Status FoldChecked(const v1::UpdateHeader& header, const TensorSet& delta, CheckedDelta checked, double upload_ms,
                     const std::map<std::string, TensorSet>* payload, uint64_t upload_bytes, HandedDelta handed);
  // An exception thrown while the update was admitted, checked or reported, before its fold:
  // the participant, if the header is for this round and it is still pending, is rejected
  // with `error` (pending count decremented, waiters woken). Returns the update's refusal.
  Status RefuseThrown(const v1::UpdateHeader& header, const char* error);
  std::string Describe(const std::string& worker_id) const;
  // What the header claims, as the strategy's aggregate reads it (no tensors yet).
  static ClientUpdate Claims(const v1::UpdateHeader& header, uint32_t party);

  const std::string job_id_;
  const uint32_t round_;
  const uint32_t attempt_;
  const uint64_t model_version_;
  const std::shared_ptr<const TensorSet> global_;
  // Each global tensor's largest magnitude (GlobalMagnitudes): lets an update's scan skip
  // reading the model where the magnitudes bound the sum.
  const std::vector<float> global_max_abs_;
  const uint32_t min_clients_;
  const std::vector<std::string> extra_sets_;  // payload sets the strategy reads besides "delta"
  const double max_update_norm_;
  const NormPolicy norm_policy_;
  const Clock* const clock_;
  UpdateEncoding delta_encoding_ = UpdateEncoding::kFloat32;  // set before dispatch
  double topk_fraction_ = 0;
  std::vector<bool> non_negative_;     // per tensor of the model; set before dispatch
  std::function<void()> folded_hook_;  // set before dispatch
  std::function<void()> report_hook_;  // set before dispatch

  // Wakes WaitComplete() and Close() when what they wait for holds; mu_ held.
  void NotifyWaitersLocked();
  bool CompleteLocked() const;  // Complete(), mu_ held

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<RoundAggregate> aggregate_;
  size_t folding_ = 0;  // updates being folded now
  std::map<std::string, Participant> participants_;
  std::map<std::string, std::string> participant_of_;  // every member's participant (its leader)
  bool closed_ = false;
  std::string close_reason_;
  size_t complete_at_accepted_ = 0;  // 0: complete only when none is pending
  size_t pending_ = 0;
  size_t accepted_ = 0;
  double aggregation_ms_ = 0;
  std::vector<double> upload_ms_;
  uint64_t download_bytes_ = 0;  // every download of this round's model, members' included
  bool interrupted_ = false;
  Clock::TimePoint dispatched_{};
  std::optional<Clock::TimePoint> quorum_at_;  // min_clients accepted
  Clock::TimePoint closed_at_{};
};

template <typename AliveFn>
size_t Round::DropLost(AliveFn&& alive) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, p] : participants_) {
    if (p.outcome != Outcome::kPending || p.folding) continue;  // a folding update has arrived
    for (const auto& [worker, generation] : p.members) {
      if (alive(worker, generation)) continue;
      p.outcome = Outcome::kDropped;
      p.report.set_outcome("dropped: worker '" + worker + "' lost (no heartbeat, disconnected or restarted)");
      --pending_;
      break;
    }
  }
  NotifyWaitersLocked();
  return pending_;
}

}  // namespace tessera::server
