// The asynchronous round driver: FedBuff (Nguyen et al., AISTATS 2022, "Federated Learning
// with Buffered Asynchronous Aggregation"), beside JobRunner's synchronous rounds.
//
// `concurrency` clients train at once, each on the model version that was current when its
// task was sent. As their updates arrive they are checked as a synchronous round checks them
// (server/jobs/update_checks.h: CheckReportedFigures, CheckUpdateEnvelope, CheckDelta) and
// folded into a buffer, each with its staleness weight: s versions behind the model the
// buffer will be applied to, the update's delta counts StalenessWeight(s) times, its weight
// in the mean staying its sample count. Every `buffer_size` (K) folded updates the buffer's
// mean goes through the job's strategy (FedAvg's plain step, FedAvgM, FedAdam, ...) into a new
// model version, which is evaluated and committed like a synchronous round (one RoundRecord per
// server step, with the folded clients and each one's staleness), and the freed clients get
// new tasks on the newest version. An update whose base is more than `max_staleness` versions
// behind is refused, and a task that can no longer be folded is cancelled when the version
// that makes it so is committed. A stale update is the protocol at work, not the client's
// fault: its task ends when it is refused, its client is given work again at once, and the
// refusal is not held against the worker.
//
// A task's identity: its round is its number in the job (the n-th task handed out), its
// attempt is 1, and its model_version is the version it trains from. An update answers only
// the task its worker holds, on the version that task names. No number is handed out twice,
// across restarts too: numbers are reserved in blocks (kTaskNumberBlock, or more when more
// tasks go out at once) in the job's row (Job.async_tasks_reserved), written before any
// number of the block is sent, and a resumed job numbers its tasks past the numbers reserved
// (and past the last step's count plus concurrency + K, which is all a row written before the
// reservation existed tells). One write of the job's row per block, none per task.
//
// A job that folds nothing fails, as max_round_attempts synchronous rounds falling short do:
// once max(1, max_round_attempts) x concurrency tasks in a row ended without an update folded
// (refused, failed, dropped at their deadline or with their worker lost), no new task is
// handed out; the tasks still out may yet fold (which starts the count again), and when the
// last of them has ended without one, the job fails naming the step, the count and the last
// task's outcome. Tasks that end by the protocol (an update too stale, a task cancelled as too
// stale) do not count.
//
// Memory: a buffer is the strategy's streaming aggregate, never K copies of updates. While a
// step is applied, the buffers that fill meanwhile wait behind it, each one model-sized
// aggregate: at most about concurrency / K of them (with K = 1 and many fast clients, that
// many models), not O(model) alone. A version other than the current one is held only while
// a task sent on it has not finished downloading it.
//
// Restarts: the driver's durable state is the job's row (its reserved task numbers) and its
// steps. A job resumed after a crash starts from the last committed version with the
// strategy's state restored (JobRunner::Prepare); the updates buffered but not yet applied are
// lost, and every client gets a new task. An update computed for a task of the previous
// process is refused as a task handed out before the job was resumed (its number is at most
// the resumed job's first number minus one), whatever version it names: resumed from an older
// checkpoint than its last step's (the newest one damaged), the job is at a version older than
// that task's.
//
// Thread-safety: Run() is the job's thread; the entry points are called from gRPC threads.
// mu_ guards the tasks and the buffers; a delta's checks and its fold run outside it, so
// uploads fold concurrently. Under mu_ nothing waits: the state store, the registry's
// liveness and its sends are reached with mu_ released, and the runner's lock is taken only
// where noted (Run() and ApplyStep, on the job's thread, read the runner's current version;
// ReserveTaskNumbers, on it too, sets the runner's copy of the job), never under mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "core/tensor.h"
#include "server/jobs/model_version.h"
#include "server/selection/selection.h"
#include "server/strategy/strategy.h"
#include "tessera/v1/job.pb.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

class JobRunner;

// FedBuff's staleness weight for an update `staleness` model versions behind: 1 / (1 + s)^a
// for "polynomial" (a = staleness_exponent), 1 for "constant". In (0, 1].
double StalenessWeight(const v1::AsyncSpec& spec, uint64_t staleness);

class AsyncDriver {
 public:
  // `runner` is the job's, and outlives the driver; its model, strategy, evaluator and seats
  // are prepared (JobRunner::Prepare).
  explicit AsyncDriver(JobRunner& runner);
  AsyncDriver(const AsyncDriver&) = delete;
  AsyncDriver& operator=(const AsyncDriver&) = delete;

  // Runs server steps until the job's `rounds` versions are committed (Ok), the job stops or
  // is cancelled (CANCELLED), or a step cannot be made (the error, which ends the job).
  // On the job's thread.
  Status Run();
  // Ends Run()'s waits at once (the job is stopping). Does not block.
  void Interrupt();
  // After Run() returned: no update is taken from now on, the tasks still out are dropped
  // (and their workers sent `cancel_reason` unless it is empty), and it returns once no
  // upload is between its check and its fold, so that the job may release its strategy.
  void End(const std::string& cancel_reason);

  // The entry points of JobRunner's, for an asynchronous job.
  struct TaskView {
    uint32_t round = 0;  // the task's number
    uint32_t attempt = 1;
    uint64_t model_version = 0;
    Clock::TimePoint deadline;
  };
  Result<TaskView> TaskOf(const std::string& worker_id, const std::string& what) const;
  Result<std::shared_ptr<const ModelVersion>> Model(uint64_t version, const std::string& worker_id) const;
  void RecordDownload(const std::string& worker_id, uint64_t version);
  Status Admit(const v1::UpdateHeader& header) const;
  void Reject(const v1::UpdateHeader& header, const Status& why);
  // `stale` (when given) is set when the update is refused as too stale.
  Status Submit(const v1::UpdateHeader& header, const TensorSet& delta, double upload_ms,
                const std::map<std::string, TensorSet>& payload, bool* stale = nullptr);
  // An update refused on arrival for another reason than its malformation (Admit's verdict
  // `why`, not an InvalidArgument): when it is too stale, the task it answers, if its worker
  // still holds it, ends with `why` as its refusal, and its client may train again at once.
  // Returns whether the update is too stale.
  bool RefuseStale(const v1::UpdateHeader& header, const Status& why);
  Status Fail(const v1::UpdateHeader& header);

  // For watchers and tests: tasks in flight, and updates in the buffer being filled.
  size_t tasks_in_flight() const;
  size_t buffered() const;

 private:
  struct Task {
    uint32_t number = 0;       // the TrainTask's round
    uint64_t version = 0;      // the model version it trains from
    uint32_t party = 0;
    std::string cohort;
    std::vector<std::pair<std::string, uint64_t>> members;  // leader first, with session generations
    std::shared_ptr<const ModelVersion> model;  // held until every member downloaded it
    std::set<std::string> downloaded;
    Clock::TimePoint sent{};
    Clock::TimePoint deadline{};
    Clock::TimePoint download_done{};
    uint64_t max_samples = 0;
    bool folding = false;  // its update is being checked or folded, outside the lock
    std::string rendezvous_prefix;
  };
  // The updates of one server step. Reports of tasks that ended without being folded
  // (refused, failed, dropped) go to the buffer being filled when they ended (JoinedLocked).
  struct Buffer {
    std::unique_ptr<RoundAggregate> aggregate;
    uint32_t reserved = 0;  // folded, or being folded (a fold that fails frees its place)
    uint32_t folding = 0;
    uint32_t folded = 0;
    // Tasks ended unfolded: not bounded by K (stale refusals, failures between folds), so
    // counted in 64 bits, and recorded as at most UINT32_MAX.
    uint64_t refused = 0;
    uint64_t dropped = 0;
    double staleness_sum = 0;
    uint32_t max_staleness = 0;
    double weighted_loss = 0;  // sum of samples x train loss of the folded updates
    uint64_t samples = 0;
    double fold_ms = 0;
    std::vector<v1::WorkerRoundReport> reports;  // every folded update's, and a bounded number of the others
    uint32_t unfolded_listed = 0;  // reports in `reports` of tasks not folded
  };

  std::string Describe(const v1::UpdateHeader& header) const;
  // The task `header` answers, or why it answers none. Under mu_.
  Result<const Task*> FindTaskLocked(const v1::UpdateHeader& header) const;
  // The buffer an update folded now goes into: the oldest sealed one with a free place (one
  // whose fold failed), else the one being filled. Under mu_.
  Buffer& JoinedLocked() const;
  // How many versions an update from `version` lags the model the buffer it would join
  // (JoinedLocked) will be applied to. Under mu_.
  uint64_t StalenessLocked(uint64_t version) const;
  // Whether the oldest sealed buffer has its K updates folded, none still folding. Under mu_.
  bool StepReadyLocked() const;
  // Ends the task of `leader` with `report` (its outcome set) added to the buffer being filled,
  // counted as refused or dropped; with `rest` (the task did not end by the protocol), its
  // members rest for a while before a new task, and the ending counts towards the endings in a
  // row without a fold that fail the job. Whatever its report's making throws, the task ends.
  // Under mu_.
  void EndTaskLocked(const std::string& leader, v1::WorkerRoundReport report, bool refused, bool rest = true);
  // Removes the task of `leader` (an iterator of tasks_) and frees its members. Under mu_.
  void RemoveTaskLocked(std::map<std::string, Task>::iterator task);
  // `folded`: the report of an update folded into `buffer`, always listed.
  void AddReportLocked(Buffer& buffer, v1::WorkerRoundReport report, bool folded);
  v1::WorkerRoundReport BaseReport(const Task& task, const std::string& leader) const;
  // Ends every task in flight, cancelling its members' work (the job has ended).
  void CancelAll(const std::string& reason);
  std::shared_ptr<Buffer> NewBuffer() const;

  // Parts of Run().
  // Drops tasks whose workers were lost and ends those past their deadline at `now`.
  void EndLostAndLateTasks(Clock::TimePoint now);
  // Makes sure task numbers up to tasks_sent_ + `count` are reserved in the job's row
  // (a block at a time), writing the row when they are not, and keeping the reservation in
  // the runner's copy of the job (under the runner's lock). On the job's thread.
  Status ReserveTaskNumbers(size_t count);
  // The job's error when too many tasks in a row ended without an update folded, `step` being
  // the one they were for. Under mu_.
  std::optional<Status> NothingFoldedLocked(uint32_t step) const;
  // Hands a task on the current version to idle ready clients until `concurrency` train;
  // a client whose rest ends after `now` is not idle. Returns how many clients were ready
  // and idle (0: none to give work to).
  Result<size_t> FillTasks(Clock::TimePoint now);
  // Applies a sealed buffer: the next version, evaluated and committed. A model that is not
  // finite is not committed (the buffer is discarded); that happening max_round_attempts
  // times in a row ends the job.
  Status ApplyStep(std::shared_ptr<Buffer> buffer);
  void PublishProgress();

  JobRunner& runner_;
  const v1::JobSpec spec_;
  const v1::AsyncSpec options_;
  const Clock* const clock_;
  std::vector<std::string> extra_sets_;
  std::vector<bool> non_negative_;  // the runner's, set by Run() as extra_sets_
  const double max_update_norm_;
  const bool clip_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // the job's thread waits on it for a sealed buffer, a freed client, Interrupt()
  bool interrupted_ = false;
  bool ended_ = false;   // End(): uploads are refused
  int submitting_ = 0;   // uploads in Submit() past their first check, not yet done
  const std::function<void()> checked_hook_;  // JobRunnerOptions::async_checked_hook
  const std::function<void()> folded_hook_;   // JobRunnerOptions::async_folded_hook
  bool client_freed_ = false;  // a task ended since the job's thread last looked for idle clients
  std::shared_ptr<const ModelVersion> current_;  // the newest committed version
  std::map<std::string, Task> tasks_;            // by leader
  std::map<std::string, std::string> leader_of_;  // every member of a task -> its leader
  std::map<std::string, Clock::TimePoint> resting_;  // workers whose task failed: no new task before then
  std::shared_ptr<Buffer> buffer_;               // being filled
  // Full, waiting to be applied, oldest first; one whose fold failed waits for an update in
  // its place.
  std::deque<std::shared_ptr<Buffer>> sealed_;
  bool applying_ = false;  // the job's thread took a sealed buffer and has not yet made (or dropped) its step
  uint32_t tasks_sent_ = 0;                      // the last task's number
  uint32_t resumed_after_ = 0;   // numbers up to this one are a previous process's (or none's)
  uint32_t tasks_reserved_ = 0;  // numbers up to this one are reserved in the job's row; job's thread only
  // Tasks ended in a row without an update folded (not by the protocol), and the last one's
  // outcome.
  uint64_t unfolded_in_a_row_ = 0;
  std::string last_unfolded_;
  uint32_t consecutive_discards_ = 0;
  Clock::TimePoint last_step_{};
};

}  // namespace tessera::server
