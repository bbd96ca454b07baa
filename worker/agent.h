// The worker daemon's core. It joins the coordinator with a token, keeps a heartbeat, holds
// the task channel open (every connection starts here: edge nodes sit behind NAT), and for
// each task downloads the global model, trains on its share of the data through its Device,
// and uploads the model delta with its sample count and timings.
//
// When the coordinator goes away it reconnects with exponential backoff and rejoins under
// the same name, which keeps its seat. A join refused (a wrong join token, a bad name, a
// certificate the coordinator does not take: PERMISSION_DENIED or INVALID_ARGUMENT) is fatal:
// Run() returns it. The same codes from the task channel after a join are retried like any
// other break. Any other failed join (UNAVAILABLE: the coordinator down, or a TLS handshake
// that fails, which gRPC does not tell apart by its code) is tried again after the backoff,
// and logged as worker/join_retry.h says: with a hint at the TLS flags for a failed handshake.
//
// Thread-safe: Stop() may be called from any thread (a signal handler's waiter).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/rate_limit.h"
#include "core/data/dataset.h"
#include "device/device.h"
#include "proto/tensor_transfer.h"
#include "worker/cancelled_task.h"
#include "worker/coordinator_client.h"
#include "worker/external_trainer.h"
#include "worker/seat_memory.h"

namespace tessera::worker {

// The coordinator's verdicts that refuse an update, as they come down the task channel (one
// for an update this worker never sent included), are logged at most this many per window,
// the next line let through saying how many were not: a coordinator cannot fill the log.
inline constexpr uint32_t kRefusedVerdictLogBurst = 5;
inline constexpr auto kRefusedVerdictLogWindow = std::chrono::seconds(60);
// Likewise the cancels of a round's task that come down the task channel (a job's end, round
// 0, is logged once its data is released): as many as a coordinator likes, of any job.
inline constexpr uint32_t kCancelLogBurst = 5;
inline constexpr auto kCancelLogWindow = std::chrono::seconds(60);

struct WorkerOptions {
  std::string name;                 // this worker's identity at the coordinator
  std::string join_token;
  std::string device = "cpu";       // device to train on
  std::string fallback_device = "cpu";
  std::string data_dir;             // the worker's own IDX files (local-files partitions)
  std::string cohort;
  std::string cohort_address = "127.0.0.1";  // where this worker listens for its cohort's peers
  // How long the cohort's rendezvous and each of its collectives wait for the other members,
  // never past the round's deadline (worker/cohort.h, CohortWait).
  uint32_t cohort_timeout_s = 30;
  uint32_t chunk_bytes = wire::kDefaultUploadChunkBytes;  // upload chunk size, at most 1 MiB
  // The wait before joining again after a session ends (jittered: half of it to all of it). It
  // doubles, up to backoff_max_ms, while sessions end within 10 s of their start. Run()
  // refuses an initial backoff of 0 or a maximum below it.
  uint32_t backoff_initial_ms = 200;
  uint32_t backoff_max_ms = 5000;
  // An emulated device (emu:...) sleeps until each op's modelled time has passed, so a slow
  // chip's rounds really take their modelled time (EmulatedDeviceOptions::pace_real_time).
  // Advertised to the coordinator as the device property "pace_real_time".
  bool pace_real_time = false;
  // A round's buffers (up to 32 MiB each) stay with the process between rounds
  // (tessera-worker sets glibc to serve them from its heap); they are handed back after
  // idle_release_ms without a task instead of after every round.
  bool keep_round_memory = false;
  uint32_t idle_release_ms = 10000;
  // External trainers this worker runs, by the name a job's model.trainer gives
  // (worker/external_trainer.h); a job naming another trainer fails on this worker.
  std::vector<TrainerCommand> trainers;
  // Tests only: runs on the task thread once a task has trained well, before the worker
  // looks for the task's cancel and uploads (a test delivers a cancel there). Empty in the
  // daemon.
  std::function<void(const v1::TrainTask&)> after_training;
  // Tests only: runs on the task thread when a task's training failed or stopped (a cancel,
  // its session's end), with why, before the failure is logged or reported. Empty in the
  // daemon.
  std::function<void(const v1::TrainTask&, const Status&)> after_failed_training;
};

// An update before it is encoded: its named sets in upload order, "delta" first.
using UpdateParts = std::vector<std::pair<std::string, TensorSet>>;
// The tensors of an update's "delta" set whose values must stay 0 or more once the
// coordinator adds them to its model (a batch norm's running variance): each one's index in
// the set and the values it is added to (the global model's, or zeros for a set that is the
// trained model itself). The upload keeps each sum at 0 or more (KeepSumNotNegative).
using NonNegativeBases = std::vector<std::pair<size_t, std::vector<float>>>;
// The NonNegativeBases of `delta`, an update of `task`'s model: its tensors that may not be
// negative (CountParameters), with `global`'s values as their bases, or zeros where `global`
// is empty (the set is the trained model itself).
Result<NonNegativeBases> NonNegativeBasesOf(const v1::TrainTask& task, const TensorSet& delta,
                                            const TensorSet& global);

class WorkerAgent {
 public:
  WorkerAgent(WorkerOptions options, std::unique_ptr<CoordinatorClient> client);
  ~WorkerAgent();

  // Runs until Stop() (returns OK) or a fatal error (a refused join, an unusable device and
  // no fallback, backoff options it refuses: INVALID_ARGUMENT, before anything starts).
  Status Run();
  void Stop();

  // For tests and the operator: what this worker has done.
  uint32_t rounds_trained() const { return rounds_trained_.load(); }
  uint32_t updates_refused() const { return updates_refused_.load(); }
  // How many times memory kept between rounds was handed back after idle_release_ms.
  uint32_t idle_releases() const { return idle_releases_.load(); }
  // The jobs whose data (training share, test share, partition) or seats' memory (top-k's
  // residual, FedBN's local tensors) this worker holds now.
  std::vector<std::string> JobsHeld() const;
  std::string device_name() const;

 private:
  // The named device, paced when options_.pace_real_time and it is emulated.
  Result<std::unique_ptr<Device>> CreateWorkerDevice(const std::string& name) const;
  Status OpenDevice();
  // One connected session: join, heartbeat and task channel until something breaks. Sets
  // *joined once the join has succeeded: an error after it is the session's, not the join's.
  Status RunSession(bool* joined);
  // Sets stop_ and wakes every waiter.
  void SetStopped();
  void TrainerLoop();
  // Who this worker is in the session that handed a task out: what the task's download, update
  // and failure report name, even once the worker has joined again (a session carries only its
  // own tasks' updates; the coordinator refuses one of an earlier session).
  struct Identity {
    std::string worker_id;
    std::string session;
  };
  // Downloads the model (with the sets the task names) and trains on `device`, with the
  // client side of the job's strategy (FedProx's proximal term, SCAFFOLD's correction); fills
  // the upload's header (local steps, FedNova's normaliser) and the sets it uploads, in
  // float32: "delta", and for SCAFFOLD "control_delta" after it.
  // `bases`: the delta's tensors that must not take the model below 0.
  Status Train(const v1::TrainTask& task, const Identity& identity, v1::UpdateHeader* header, UpdateParts* upload,
               NonNegativeBases* bases, Device* device);
  // Encodes `parts` into the header's envelope ("delta" in the job's [compression] encoding,
  // every other set in float32) and uploads them. Top-k keeps error feedback: the residual of
  // this job and seat is added to the delta before the entries are chosen, and what is kept
  // after the verdict follows ResidualAfterUpload (error_feedback.h): what was not sent when
  // the update was accepted or its fate is unknown, nothing when it was refused.
  // A task cancelled by the time its update is encoded (its job, round and attempt; a cancel
  // that came during its last training step or after it) uploads nothing: the coordinator
  // would refuse it and count it against this worker. So does a task of a session that has
  // ended (the worker joined again while it trained): the coordinator refuses an update of any
  // session but its current one. The seat's residual stays as it was.
  // One that comes while the update is being sent ends the upload there
  // (CoordinatorClient::CancelUpload): no further chunk goes, and as some may have arrived,
  // the residual is kept as for an upload whose fate is unknown.
  // Each tensor `bases` names is changed, after the residual is added, so that the coordinator's
  // model plus what it decodes of it stays 0 or more (KeepSumNotNegative).
  Status Upload(const v1::TrainTask& task, v1::UpdateHeader header, UpdateParts parts,
                const NonNegativeBases& bases);  // agent_upload.cc
  // A job's seat on this worker ("JOB#PARTY"), the key of what the worker keeps for it
  // between rounds.
  static std::string SeatOf(const v1::TrainTask& task);
  // How much of a reason the coordinator gives (a cancel's, a refused update's) is logged.
  static constexpr size_t kMaxReasonChars = 512;
  // Whether `task` is cancelled, logged when it is: the caller then drops its update.
  bool UploadCancelled(const v1::TrainTask& task);
  // Tells the coordinator this worker cannot do `task`, so the round need not wait for it.
  void ReportFailure(const v1::TrainTask& task, const Identity& identity, const Status& why);
  // The samples this worker trains on for `task`: its party's share of the job's partition
  // (only those images are loaded), or its own files. The last share is kept for the next
  // round; another job's or party's replaces it.
  Result<std::shared_ptr<const Dataset>> TrainingShare(const v1::TrainTask& task);
  // The rows of the training split this task's party holds: the job's partition of the labels
  // `read_labels` gives, computed once per job and kept. `labels_from` names the files they
  // come from, in the partition's errors (a label outside the job's classes).
  Result<std::vector<int64_t>> PartyRows(const v1::TrainTask& task, const std::string& labels_from,
                                         const std::function<Result<std::vector<uint8_t>>()>& read_labels);
  // Federated evaluation's data: the test split of the worker's own files (local-files jobs),
  // or its party's share of the test split, cut as the job cuts the training split. NotFound
  // when the worker has no test split.
  Result<std::shared_ptr<const Dataset>> LocalTestShare(const v1::TrainTask& task);
  void SleepFor(uint32_t ms);

  WorkerOptions options_;
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<Device> device_;
  v1::DeviceInfo device_info_;  // what Join advertises

  std::atomic<bool> stop_{false};
  // The coordinator checks XXH3-128 digests of an update's tensors (JoinResponse.upload_xxh3):
  // the update's manifest gives them instead of SHA-256.
  std::atomic<bool> upload_xxh3_{false};
  uint64_t metrics_collector_ = 0;  // scrape-time device metrics (worker/worker_metrics.h)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string worker_id_;
  std::string session_;
  std::deque<v1::TrainTask> tasks_;  // at most one per job, at most kMaxQueuedTasks
  static constexpr size_t kMaxQueuedTasks = 64;
  // Recent cancels, newest last (a few; a cancel only matters to the task it names). A cancel
  // drops the queued tasks it covers at once, and past kMaxCancels the oldest goes, never one
  // that covers the task in hand: however many cancels come while it trains, its own stays.
  // What each one covers: worker/cancelled_task.h.
  static constexpr size_t kMaxCancels = 16;
  std::deque<CancelledTask> cancelled_;
  std::optional<CancelledTask> in_hand_;  // the task the task thread holds (its job, round, attempt)
  bool IsCancelledLocked(const std::string& job, uint32_t round, uint32_t attempt) const;
  // Set when the session's task channel ends, cleared by the next join: the session is over,
  // and the coordinator counts this worker lost until it joins again. Its queued tasks are
  // dropped as it ends.
  bool session_ended_ = false;
  // Whether a task handed out in `session` ended with it: its task channel closed, or the
  // worker joined again since. Its training stops at the next step, as a cancel's does: the
  // coordinator takes no update of a session that is not its current one.
  bool SessionEndedLocked(const std::string& session) const { return session_ended_ || session != session_; }
  std::string state_ = "idle";

  // Jobs the coordinator said ended (a cancel of round 0) whose data the task thread is yet
  // to release (ReleaseEndedJobs). Only a job this worker holds something for (HoldsJobLocked)
  // or trains now is kept here, so there are never more than the jobs it can hold at once:
  // one partition, a training and a test share, and the seats of seat_jobs_ (at most
  // 2 * kMaxResiduals), and the task in hand.
  std::set<std::string> ended_jobs_;
  void ReleaseEndedJobs();  // only the task thread
  // The jobs with a seat in residuals_ or local_tensors_, as the task thread last published
  // them (PublishSeatJobsLocked, after each task and each release), for the task channel's
  // thread to read.
  std::set<std::string> seat_jobs_;
  void PublishSeatJobsLocked();  // only the task thread, under mu_
  // Whether this worker holds data or seats' memory for `job`, or trains a task of it now.
  bool HoldsJobLocked(const std::string& job) const;
  std::shared_ptr<const Dataset> share_;                                     // the last share loaded
  std::string share_key_;                                                    // what it is the share of
  std::string share_job_;                                                    // the job that used it last
  std::shared_ptr<const Dataset> test_share_;                                // federated evaluation's last test share
  std::string test_share_key_;
  std::string test_share_job_;                                               // the job it is of
  std::map<std::string, std::vector<std::vector<int64_t>>> partitions_;      // the current job's, by job id
  // External trainers started so far, by name, and the private directory they exchange
  // archives through (made on first use, removed with the agent). Only the task thread.
  std::map<std::string, std::unique_ptr<ExternalTrainer>> external_;
  std::string external_dir_;
  // Top-k's error feedback: what a job's seat ("JOB#PARTY") has not sent yet, in its delta's
  // layout. In memory only (a restarted worker starts from zero); a seat not selected keeps
  // its residual until its next round. Bounded to kMaxResiduals seats, the one used longest ago
  // going first (worker/seat_memory.h). Only the task thread.
  static constexpr size_t kMaxResiduals = 8;
  // Models at least this large give their memory back after each round (WorkerAgent::Train).
  static constexpr uint64_t kReleaseAboveBytes = uint64_t{4} << 20;
  bool large_model_ = false;  // the last task's model is that large; only the task thread
  // Whether the last Train() got as far as building the model on its device: only a failure
  // from there on (out of memory, a driver error) is the device's, for the job's fallback
  // device to retry. A download's or a data load's (a transport's INTERNAL) is not. Only the
  // task thread.
  bool reached_device_ = false;
  // Whether the last Train() failed in its cohort's rendezvous or gradient allreduce. Only the
  // task thread.
  bool cohort_failed_ = false;
  // With keep_round_memory: the heap holds a round's freed buffers until the worker has had
  // no task for options_.idle_release_ms. Only the task thread.
  bool memory_kept_ = false;
  std::atomic<uint32_t> idle_releases_{0};
  SeatMemory<TensorSet> residuals_{kMaxResiduals};
  // FedBN: a seat's own values of the model's local tensors (batch norms declared local),
  // restored over each round's global model. In memory only, bounded like residuals_. Only
  // the task thread.
  SeatMemory<TensorSet> local_tensors_{kMaxResiduals};
  // Trains `task` with its job's external trainer on `share`; fills what Train fills.
  Status TrainExternally(const v1::TrainTask& task, const Identity& identity, const TensorSet& global,
                         const Dataset& share, v1::UpdateHeader* header, UpdateParts* upload,
                         NonNegativeBases* bases, double download_ms, double data_load_ms);
  std::atomic<uint32_t> rounds_trained_{0};
  std::atomic<uint32_t> updates_refused_{0};
  LogRateLimiter refused_verdicts_log_{kRefusedVerdictLogBurst, kRefusedVerdictLogWindow};
  LogRateLimiter cancels_log_{kCancelLogBurst, kCancelLogWindow};
  std::thread trainer_;
};

}  // namespace tessera::worker
