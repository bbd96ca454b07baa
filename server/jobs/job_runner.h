// Runs one federated job: synchronous rounds of selection, distribution, local training on
// the workers, streaming aggregation, evaluation and commit, until the job's rounds are done,
// it is cancelled, or it fails. Resumes from the last committed round after a restart.
// An asynchronous job (spec.async) is driven by an AsyncDriver (server/jobs/async_driver.h)
// instead of the rounds; the runner keeps its life (prepare, resume, commit, end) and hands
// the worker service's entry points to the driver.
//
// Thread-safe. One thread per job, started by Start() and joined by Stop(). No exception
// leaves the job's thread: one that reaches its top ends the job FAILED with its message.
// The job's final state is written until it is durable (retried with backoff, each failure
// logged and published to watchers) or the runner is stopped.
//
// Seams for tests: the state store is an interface (MemoryStateStore in tests), time comes
// from JobRunnerOptions::clock (a ManualClock), and workers take part through the entry
// points below and the registry's task channels, as the worker service does
// (tests/server/fake_worker.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "core/buffer_pool.h"
#include "core/data/idx.h"
#include "core/value_scan.h"
#include "server/jobs/datasets.h"
#include "server/jobs/evaluation.h"
#include "server/jobs/job_events.h"
#include "server/jobs/model_version.h"
#include "server/jobs/participant_models.h"
#include "server/jobs/round.h"
#include "server/selection/selection.h"
#include "server/state/state_store.h"
#include "server/strategy/strategy.h"
#include "server/workers/rendezvous_store.h"
#include "server/workers/worker_registry.h"

namespace tessera::server {

struct JobRunnerOptions {
  std::chrono::milliseconds worker_wait_timeout{600000};  // fail a round attempt with too few workers after this
  uint32_t chunk_bytes = 1u << 20;                         // model download chunk size
  // A model of at most this many bytes travels inside the task to workers that take it
  // (TrainTask.inline_model): no DownloadModel call. 0: always downloaded. At most
  // ModelVersion::kMaxInlineBytes.
  uint64_t inline_model_bytes = uint64_t{256} << 10;
  // Synchronous rounds' tasks say the coordinator takes a float32 update as the trained model
  // (TrainTask.takes_trained_weights) and subtracts the global model itself: workers then
  // keep no copy of it while they train. False: every update a delta.
  bool take_trained_weights = true;
  // Idle tensor buffers the job keeps to assemble the next updates in (core/buffer_pool.h);
  // the coordinator sets its upload memory (--upload-buffer-mib).
  uint64_t idle_update_buffer_bytes = uint64_t{64} << 20;
  // The operator's dataset directory: the coordinator evaluates on its test split and reads
  // its training labels to know each party's size. A job's spec.data.path does not steer it.
  std::string data_dir = kDefaultFashionMnistDir;
  // The operator's copies of other datasets, by the name jobs give in data.dataset
  // (tessera-coordinator --dataset NAME=DIR; server/jobs/datasets.h).
  std::map<std::string, std::string> datasets;
  DatasetDirs Datasets() const { return DatasetDirs{data_dir, datasets}; }
  // OpenBLAS threads for the coordinator's evaluation (process-wide). One by default: the
  // evaluation is short, and idle OpenBLAS threads spin (sched_yield) for a while after each
  // call, taking CPU from the gRPC threads that move the next round's bytes.
  int evaluation_threads = 1;
  // The device the coordinator evaluates on (a registry name: "cpu", "cuda", ...); with "cpu"
  // evaluation_threads applies. The coordinator checks at start that it can be made here.
  std::string evaluation_device = "cpu";
  // Makes the job's strategy; empty: CreateStrategy. A seam for tests.
  std::function<Result<std::unique_ptr<Strategy>>(const v1::JobSpec&, const TensorSet&)> strategy_factory;
  // Runs in an asynchronous job's upload between the update's check and its fold. A seam for
  // tests, which hold an upload there.
  std::function<void()> async_checked_hook;
  // Runs in an asynchronous job's upload after its fold, as its report is made. A seam for
  // tests, which throw there.
  std::function<void()> async_folded_hook;
  // Runs in a synchronous round's upload after its fold, as the round counts it
  // (Round::SetFoldedHook). A seam for tests, which throw there.
  std::function<void()> round_folded_hook;
  // How long the first retry of a job's final state waits when it cannot be written; each
  // further retry waits twice as long, up to max_record_retry_delay.
  std::chrono::milliseconds record_retry_delay{100};
  std::chrono::milliseconds max_record_retry_delay{10000};
  // A round (or an asynchronous step) whose checkpoint or record cannot be written (a full
  // disk, an I/O error) is not committed: the previous checkpoint stays the newest, and the
  // commit of the same aggregated model is tried again after commit_retry_delay, each further
  // wait twice as long up to max_commit_retry_delay, for at most commit_retry_limit from the
  // first failure (tessera-coordinator --commit-retry-s). Past it the job fails with the last
  // error; 0: it fails at the first, as it does at an error no wait mends (a damaged
  // database). A cancel or Stop() ends the wait, the round uncommitted.
  std::chrono::milliseconds commit_retry_limit{300000};
  std::chrono::milliseconds commit_retry_delay{1000};
  std::chrono::milliseconds max_commit_retry_delay{30000};
  // While too few workers are ready, how often selection looks at the registry again.
  std::chrono::milliseconds worker_poll_interval{100};
  // While a round is open, how often the runner looks for participants whose worker was lost
  // (and tells watchers who is awaited); a report, the deadline or Stop() end the wait sooner.
  std::chrono::milliseconds liveness_check_interval{200};
  // Where the runner reads time and waits on it: round deadlines, the wait for workers, the
  // retry delays and every latency it records (the rounds it opens read it too). Tests give
  // a ManualClock. Must outlive the runner. Deadlines handed out (OpenRound::deadline) are
  // points on this clock.
  const Clock* clock = &SteadyClock();
};

class AsyncDriver;

class JobRunner : public std::enable_shared_from_this<JobRunner> {
 public:
  JobRunner(v1::Job job, StateStore* store, WorkerRegistry* registry, RendezvousStore* rendezvous,
            JobRunnerOptions options);
  ~JobRunner();

  void Start();
  // Stops the thread without changing the job's persisted state (coordinator shutdown), and
  // blocks until it has ended: the open round is closed uncommitted once the updates being
  // folded into it are folded, a commit under way completes (one waiting to retry a write that
  // failed is given up, the round uncommitted), and the job resumes at its last committed
  // round in the next runner. Idempotent.
  void Stop();
  // Ends the job as CANCELLED. Does not block. The caller records the cancel in the store
  // first (Coordinator::CancelJob); a job read with cancel_requested ends CANCELLED when it
  // starts. The job shows cancel_requested until it ends, and never once it has ended: a
  // cancel that comes after its end changes nothing.
  void Cancel();

  v1::Job Snapshot() const;
  // The job without its last round's record (up to thousands of reports): what the job's
  // thread reads each round, and what its events carry (a round's event carries the round).
  v1::Job Summary() const;
  // The job with its last round's record but not that record's per-worker reports, as the
  // store's lists give a job.
  v1::Job Listed() const;
  v1::JobState state() const;
  JobEvents& events() { return events_; }

  // For the worker service.
  // The global model of `version`, encoded for download, or an error when that version is
  // not current. With `worker_id`, what that worker downloads: for a participant of a round
  // whose strategy sends more than the model (SCAFFOLD), the model and its own sets.
  Result<std::shared_ptr<const ModelVersion>> Model(uint64_t version, const std::string& worker_id = "") const;
  // The job has ended (succeeded, failed or cancelled) and released its memory.
  bool finished() const { return finished_.load(); }
  // A download of model `version` finished, `bytes` of tensors sent (the round's record sums them).
  void RecordDownload(const std::string& worker_id, uint64_t version, uint64_t bytes = 0);
  // The open round as a participant sees it.
  struct OpenRound {
    uint32_t round = 0;
    uint32_t attempt = 0;
    uint64_t model_version = 0;
    Clock::TimePoint deadline;  // on the runner's clock
  };
  // The open round, when `worker_id` takes part in it and has not reported yet (a cohort's
  // members included); else PERMISSION_DENIED naming the worker, the job and the round, for
  // `what` ("download of model version 3").
  Result<OpenRound> SelectedRound(const std::string& worker_id, const std::string& what) const;
  // Checks the header and the manifest before the tensors arrive.
  Status AdmitUpload(const v1::UpdateHeader& header) const;
  // Whether the update is for the last attempt that closed with participants cancelled as
  // over-selected, from one of them (an update that crossed its cancel: refused, but not the
  // worker's fault).
  bool CancelledAsOverSelected(const v1::UpdateHeader& header) const;
  // Records that a selected worker's upload was refused before it could be submitted.
  void RejectUpload(const v1::UpdateHeader& header, const Status& why);
  // An upload AdmitUpload refused (`why`): a selected worker's malformed one (INVALID_ARGUMENT)
  // is rejected (RejectUpload); any other counts against its worker, unless it is late by the
  // protocol: it crossed its worker's cancel as over-selected, or, in an asynchronous job, it
  // is too stale to be folded (which ends the task it answers: AsyncDriver::RefuseStale).
  void RefuseArrival(const v1::UpdateHeader& header, const Status& why);
  // `update`: the delta, or with header.trained_weights the trained model, made the delta from
  // the round's model version in place as it is checked (Round::SubmitTrained; synchronous
  // rounds only).
  // `payload`: the update's other sets, by name (those the strategy's PayloadSets() names);
  // `upload_bytes`: the update as it came on the wire (encoded); `delta_scans`: its delta's
  // tensors as scanned on arrival (UpdateAssembler::ScanSet), or null. A synchronous round's
  // aggregate may take `update`'s buffers, leaving it empty, and gives them to
  // update_buffers() once it has folded them.
  Status SubmitUpdate(const v1::UpdateHeader& header, TensorSet& update, double upload_ms,
                      const std::map<std::string, TensorSet>& payload = {}, uint64_t upload_bytes = 0,
                      const TensorScans* delta_scans = nullptr);
  // How the open round expects "delta" sets encoded, and top-k's fraction (float32 and 0 when
  // no round is open).
  std::pair<UpdateEncoding, double> DeltaEncoding() const;
  // A selected worker could not train; it leaves the round now instead of at the deadline.
  Status ReportFailure(const v1::UpdateHeader& header);
  uint64_t model_bytes() const { return model_bytes_.load(); }
  // The most bytes an update may hold: the model's size for its delta and for each set the
  // strategy reads besides it.
  uint64_t update_bytes() const { return model_bytes_.load() * update_sets_.load(); }
  // Where uploads take the tensors they assemble into, and give them back once folded.
  FloatBufferPool& update_buffers() { return update_buffers_; }

 private:
  friend class AsyncDriver;  // the asynchronous driver runs on the runner's parts below

  void Run();
  void RunJob();
  Status Prepare();
  // Each party's size (samples), for bounding the sample counts updates claim.
  Status LoadPartySizes(const v1::JobSpec& spec);
  // What a resumed job's selection policy learns from, when it learns from rounds at all:
  // the history its checkpoint carries (`checkpointed`, the checkpoint's selection tensors),
  // all the policy knew when the round was committed. From a checkpoint without it (written
  // before checkpoints carried it) or one whose history cannot be read, the records in the
  // store teach it again: the newest committed rounds whose records come to about
  // kSelectionHistoryBytes (sized by the newest record), at least kSelectionHistoryRounds of
  // them, read a page of kSelectionHistoryPageBytes at a time: every round of most jobs (256
  // MiB is 400 rounds of 1,000 clients, 40,000 of ten).
  static constexpr uint32_t kSelectionHistoryRounds = 100;
  static constexpr uint64_t kSelectionHistoryBytes = uint64_t{256} << 20;
  static constexpr size_t kSelectionHistoryPageBytes = size_t{4} << 20;
  // Prepare() tried again after an Unavailable error (a checkpoint that could not be read).
  static constexpr int kPrepareRetries = 4;
  Status RestoreSelectionHistory(const v1::Job& job, const TensorSet& checkpointed);
  uint64_t MaxSamples(uint32_t party) const;
  // How one attempt at a round ended. kTooFewClients and kNonFiniteModel are retried (the
  // latter without the clients blamed for it); kFailed ends the job.
  struct AttemptOutcome {
    enum class Kind { kCommitted, kTooFewClients, kNonFiniteModel, kStopped, kFailed };
    Kind kind = Kind::kFailed;
    Status status;  // why, for every kind but kCommitted
    AttemptOutcome() = default;
    AttemptOutcome(Kind k, Status s = Status::Ok()) : kind(k), status(std::move(s)) {}
    // An error from a step of the round (a store, the strategy, the evaluation) ends the job.
    AttemptOutcome(Status s) : kind(Kind::kFailed), status(std::move(s)) {}  // NOLINT: implicit on purpose
  };
  AttemptOutcome RunAttempt(uint32_t round, uint32_t attempt);

  // The parts both drivers use.
  // The ready clients, seated (a new client takes a free party, saved), without those left
  // out of the current round (excluded_). `parties`: SeatedParties(spec).
  Result<std::vector<Client>> ReadyClients(uint32_t parties);
  // The parties seats are drawn from: the partition's, or 0 for workers' own files.
  static uint32_t SeatedParties(const v1::JobSpec& spec);
  // Sends `task` to each member of `client` with its party, and for a cohort its rank,
  // backend and rendezvous prefix (`rendezvous_prefix` + cohort + "/"): each member's task is
  // `task` serialized (`task_wire` when given, shared by every task of the round; else
  // serialized here) followed by the member's own fields (wire::TrainTaskWire). `task` sets
  // none of those fields: a proto3 zero in them would not override its value.
  void SendTrainTask(const Client& client, const v1::TrainTask& task, const std::string& rendezvous_prefix,
                     const std::shared_ptr<const std::string>& task_wire = nullptr);
  void SendCancel(const std::string& worker, uint32_t round, uint32_t attempt, const std::string& reason);
  // The workers to tell that the job ended: those this process tasked (tasked_), and the joined
  // workers on a seat the store holds for the job, whom a coordinator process before this one
  // may have tasked (a cohort's seat names each of its members).
  std::set<std::string> WorkersToTellOfTheEnd();
  // Evaluates `step`'s model, commits it with its state and `record` (checkpoint and record
  // together), adopts the state, makes it the current version and tells watchers and
  // metrics. `started`: when the round (or the step) began, for its total latency.
  Status CommitStep(v1::RoundRecord record, StrategyStep step, Clock::TimePoint started);
  // CommitStep's writes (server/jobs/round_commit.cc): commits `record` with `committed`, the
  // job's row, once the checkpoint of `model` and `extra` is written (`written`: how the write
  // begun beside the evaluation ended). A write that fails is tried again as
  // JobRunnerOptions::commit_retry_limit says, each failure logged and told to watchers; the
  // records' commit times are those of the try that commits. A cancel or a stop during a wait
  // ends it with CANCELLED, nothing committed.
  Status CommitWritten(v1::Job* committed, v1::RoundRecord* record, const TensorSet& model, const TensorSet& extra,
                       Status written);
  std::shared_ptr<const ModelVersion> Current() const;
  std::shared_ptr<AsyncDriver> Driver() const;
  // Runs an asynchronous job to its end.
  void RunAsync();
  // The round's clients; empty with *shortfall set when fewer than min_clients were ready
  // within the wait, or when the job is stopping.
  Result<std::vector<Client>> SelectClients(uint32_t round, uint32_t attempt, std::string* shortfall);
  void Finish(v1::JobState state, const std::string& error);
  // Writes the job's final state, retrying until it is durable or the runner is stopped.
  void RecordEnd(const v1::Job& job, const std::string& state_name);
  // Waits `delay` on the clock, or less when the runner is stopped; returns whether it was
  // stopped.
  bool SleepUnlessStopped(std::chrono::milliseconds delay);
  // Waits `delay` on the clock, or less when the job is stopping or cancelled.
  void WaitUnlessStopping(std::chrono::milliseconds delay);
  // Ends the waits of the job's thread (Stop(), Cancel()).
  void WakeWaits();
  void Note(const std::string& message);
  // Tells watchers where the open round stands: how many reported, who is awaited.
  void PublishProgress(const Round& open, size_t selected, Clock::TimePoint deadline);
  double MillisSince(Clock::TimePoint start) const;
  bool stopping() const { return stop_.load() || cancel_.load(); }

  StateStore* store_;
  WorkerRegistry* registry_;
  RendezvousStore* rendezvous_;
  JobRunnerOptions options_;
  const Clock* const clock_;
  JobEvents events_;
  std::mutex wake_mu_;  // with wake_cv_: the job's thread waits on the clock for these
  std::condition_variable wake_cv_;

  mutable std::mutex mu_;
  // mutable: Summary() moves last_round aside for its copy and back, under mu_.
  mutable v1::Job job_;
  std::shared_ptr<const ModelVersion> current_;  // the committed global model
  std::shared_ptr<Round> round_;
  Clock::TimePoint round_deadline_;  // of round_
  // The last attempt that closed with participants cancelled as over-selected, and their
  // workers (at most one round's selection).
  struct OverSelectedClose {
    uint32_t round = 0;
    uint32_t attempt = 0;
    std::set<std::string> workers;
  };
  OverSelectedClose over_selected_;
  ParticipantModels participant_models_;  // round_'s per-participant downloads, if its strategy has any
  SeatTable seats_;                              // only the job's thread uses these two
  std::unique_ptr<SelectionPolicy> selection_;
  std::vector<uint64_t> party_sizes_;     // only the job's thread uses these two; empty: local files
  std::set<std::string> excluded_;        // workers left out of the current round's next attempts
  // Workers this process sent a task of the job: told when it ends (a cancel of round 0), so
  // that they let go of its data. Only the job's thread.
  std::set<std::string> tasked_;

  std::shared_ptr<AsyncDriver> async_;   // an asynchronous job's driver, while it runs
  const std::string job_id_;             // job_.id(), readable without mu_
  std::unique_ptr<Strategy> strategy_;    // only the job's thread uses it (and AsyncDriver's BeginRound)
  std::unique_ptr<Evaluator> evaluator_;  // likewise
  // Per tensor of the model, whether its values may not be negative (a running variance):
  // updates that would take one below 0 are refused, and downloads send them in float32. Set
  // with the strategy; only the job's thread (and AsyncDriver::Run) reads it.
  std::vector<bool> non_negative_;
  FloatBufferPool update_buffers_;  // freed with the runner, at the job's end
  std::atomic<uint64_t> model_bytes_{0};
  std::atomic<uint64_t> update_sets_{1};  // "delta" and the strategy's payload sets
  std::atomic<bool> stop_{false};
  std::atomic<bool> cancel_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tessera::server
