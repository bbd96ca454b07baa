// An in-process worker for tests of the round driver, with failure injection.
//
// A FakeWorker joins a WorkerRegistry, holds a task channel (a TaskChannelSink of its own),
// and answers each TrainTask through the same entry points the worker service uses, in the
// same order (server/rpc/transfers.cc): JobRunner::SelectedRound, Model and RecordDownload for
// the download; AdmitUpload, with RejectUpload when the header or manifest is malformed; then
// SubmitUpdate, or ReportFailure for a failure header. What it does with a task is its
// script's choice, per round and attempt (a FakeAction): upload a delta (unchanged, a fill
// value, random, or given), fail with a reason, hang, vanish, upload late, send a malformed
// manifest; an upload can also stop at a Gate before it is admitted or before it is
// submitted, so a test can act while it is in flight.
//
// Threads: one reads the channel (like a worker's session thread), and each train task is
// acted on by a thread of its own (like a worker's trainer), so a cancel arrives while an
// upload waits at a gate. Stop() opens the gates in flight and joins every thread; the
// destructor stops. Everything the worker saw and did is kept for the test to look at
// (received(), turns(), Await()). Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "server/jobs/job_runner.h"
#include "server/workers/worker_registry.h"

namespace tessera::server {

// How long a test waits, in real time, for what must happen soon (a thread to reach a wait,
// a task to arrive): a bound that only a failing test reaches, never a measured interval.
inline constexpr std::chrono::milliseconds kWaitLimit{60000};

// A point where one thread stops until another opens it. Thread-safe.
class Gate {
 public:
  void Open();
  // Marks the gate reached and blocks until it is opened.
  void Pass();
  // Blocks (at most `limit`) until a thread has reached the gate; returns whether one has.
  bool AwaitReached(std::chrono::milliseconds limit = kWaitLimit);
  bool reached() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false;
  bool open_ = false;
};

// Opens a gate when it goes out of scope: declared after whatever waits on the gate (a
// std::async of Stop()), it lets that finish when a test ends early.
class OpenAtExit {
 public:
  explicit OpenAtExit(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  ~OpenAtExit() { gate_->Open(); }
  OpenAtExit(const OpenAtExit&) = delete;
  OpenAtExit& operator=(const OpenAtExit&) = delete;

 private:
  std::shared_ptr<Gate> gate_;
};

// What a fake worker does with one train task.
struct FakeAction {
  enum class Kind {
    kUpload,             // download the model, upload a delta
    kFail,               // report that it cannot train, with `failure`
    kHang,               // take the task and never report
    kVanish,             // its task channel closes: the worker is lost
    kMalformedManifest,  // upload a header whose manifest does not fit the model
  };
  Kind kind = Kind::kUpload;
  // The delta uploaded, from the round's global model (kUpload).
  std::function<TensorSet(const TensorSet& global)> delta;
  uint64_t samples = 100;
  std::string failure;  // kFail
  // Changes the header or delta before they are sent (a hostile worker).
  std::function<void(v1::UpdateHeader*, TensorSet*)> tamper;
  // Where an upload stops until the test opens the gate: after the download, before the
  // header is admitted (an upload that comes late), and after it is admitted, before the
  // update is submitted (an upload in flight).
  std::shared_ptr<Gate> before_admit;
  std::shared_ptr<Gate> before_submit;
  // The upload goes to the job's runner as found once `before_admit` is passed (one resumed
  // meanwhile), as a worker that reconnected to a restarted coordinator uploads to it; else to
  // the runner it downloaded from.
  bool upload_to_current_runner = false;

  // Every value of the delta `fill`.
  static FakeAction Upload(float fill = 0.001f);
  // A zero delta: the model comes back unchanged.
  static FakeAction UploadUnchanged();
  // Values drawn uniformly from [-scale, scale] with `seed`.
  static FakeAction UploadRandom(uint64_t seed, float scale = 0.01f);
  // Exactly `delta` (its layout must fit the model, or the upload is refused).
  static FakeAction UploadGiven(TensorSet delta);
  static FakeAction Fail(std::string reason);
  static FakeAction Hang();
  static FakeAction Vanish();
  // An upload that waits at `gate` (opened by the test, e.g. after the deadline).
  static FakeAction UploadLate(std::shared_ptr<Gate> gate, float fill = 0.001f);
  static FakeAction MalformedManifest();

  FakeAction& WithSamples(uint64_t n);
  FakeAction& WithTamper(std::function<void(v1::UpdateHeader*, TensorSet*)> change);
  FakeAction& StopBeforeSubmit(std::shared_ptr<Gate> gate);
  FakeAction& UploadToCurrentRunner();
};

// What happened with one train task.
struct FakeTurn {
  v1::TrainTask task;
  FakeAction::Kind kind = FakeAction::Kind::kUpload;
  std::optional<Status> downloaded;  // SelectedRound and Model
  std::optional<Status> admitted;    // AdmitUpload
  std::optional<Status> verdict;     // SubmitUpdate or ReportFailure
  bool finished = false;             // the worker is done with the task (a hang never is)
};

// A cancel of one task (job, round, attempt), not the cancel of round 0 that says a whole job
// ended (JobRunner::Finish), which every worker that trained for the job gets at its end.
inline bool IsTaskCancel(const v1::Task& t) { return t.has_cancel() && t.cancel().round() != 0; }

class FakeWorker : public std::enable_shared_from_this<FakeWorker> {
 public:
  using Script = std::function<FakeAction(const v1::TrainTask&)>;
  // The job's runner as the worker service finds it (Coordinator::Runner); may be null.
  using RunnerLookup = std::function<std::shared_ptr<JobRunner>()>;

  // `script` chooses the action for each train task.
  FakeWorker(WorkerRegistry* registry, std::string name, Script script, RunnerLookup runner);
  ~FakeWorker();
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  // Joins the registry and opens a task channel (the worker is ready for selection).
  Status Start();
  // Opens the gates in flight and joins the worker's threads; the channel stays as it is.
  void Stop();

  // Failure injection at any time, besides a script's kVanish.
  // The task channel closes (the connection broke): the worker is lost at once.
  void Vanish();
  // Joins again under the same name: a new session; work of the old one is lost.
  Status Rejoin();
  // Opens a second task channel in the same session, which supersedes the first; then the
  // first one's close arrives late, as over the network.
  Status ReopenChannel();
  // The next task the coordinator sends this worker stops at `gate`, on the sender's thread
  // (the job's, for a train task), before the worker learns of it: a test acts while the
  // sender is held there. Stop() opens it.
  void HoldNextDelivery(std::shared_ptr<Gate> gate);
  // One heartbeat in the current session (the fake sends none by itself: with the registry on
  // a clock that stands still, it needs none).
  Status Heartbeat();

  const std::string& name() const { return name_; }
  uint64_t generation() const;

  // Every task received (train, cancel, verdict), in order.
  std::vector<v1::Task> received() const;
  std::vector<FakeTurn> turns() const;
  // The task cancels received, in order (IsTaskCancel: not the cancel that ends a job).
  std::vector<v1::CancelTask> cancels() const;
  // Blocks (at most `limit`) until `done(received, turns)` is true; returns whether it is.
  bool Await(const std::function<bool(const std::vector<v1::Task>&, const std::vector<FakeTurn>&)>& done,
             std::chrono::milliseconds limit = kWaitLimit) const;
  // Shorthands: a train task of (round, attempt) received; a turn of it finished.
  bool AwaitTrainTask(uint32_t round, uint32_t attempt, std::chrono::milliseconds limit = kWaitLimit) const;
  bool AwaitFinished(uint32_t round, uint32_t attempt, std::chrono::milliseconds limit = kWaitLimit) const;

 private:
  class Channel;
  void TasksQueued();
  void PassDeliveryGate();  // on the sender's thread: HoldNextDelivery's gate, once
  void ReadLoop();
  void Act(size_t turn, v1::TrainTask task);
  void Record(size_t turn, const std::function<void(FakeTurn&)>& change);

  WorkerRegistry* const registry_;
  const std::string name_;
  const Script script_;
  const RunnerLookup runner_;

  mutable std::mutex mu_;  // guards the fields below
  mutable std::condition_variable cv_;
  uint64_t generation_ = 0;
  std::string session_;
  std::shared_ptr<Channel> channel_;
  bool vanished_ = false;
  bool queued_ = false;
  bool stop_ = false;
  std::vector<v1::Task> received_;
  std::vector<FakeTurn> turns_;
  std::vector<std::shared_ptr<Gate>> gates_;  // of the actions in flight
  std::shared_ptr<Gate> delivery_gate_;       // HoldNextDelivery's, until a delivery takes it
  std::thread reader_;
  std::vector<std::thread> trainers_;
};

}  // namespace tessera::server
