// Small models inside their tasks: a worker that says at join that it takes them gets the
// model in its TrainTask (the same tensors a download gives), a worker that does not gets
// none and downloads; a coordinator with --inline-model-kib 0 sends none. Real workers train
// to the same figures either way, as they do whether the coordinator takes their trained
// models (--trained-weights) or their deltas, and whether they send their updates on
// connections of their own (--upload-connection-kib) or on their long-lived one.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "proto/tensor_transfer.h"
#include "proto/update_envelope.h"
#include "server/monitoring/coordinator_metrics.h"
#include "server/rpc/task_channels.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

// A hand-driven worker that keeps its last train task.
class TaskKeeper {
 public:
  TaskKeeper(int port, const std::string& name, bool accepts_inline_model)
      : hand_(std::make_unique<HandWorker>(
            "127.0.0.1:" + std::to_string(port), name,
            [this](const v1::TrainTask& t) {
              std::lock_guard<std::mutex> lock(mu_);
              task_ = t;
            },
            accepts_inline_model)) {}
  std::optional<v1::TrainTask> task() {
    std::lock_guard<std::mutex> lock(mu_);
    return task_;
  }
  HandWorker& hand() { return *hand_; }

 private:
  std::mutex mu_;
  std::optional<v1::TrainTask> task_;
  std::unique_ptr<HandWorker> hand_;  // last: its threads end before the members above go
};

TEST(InlineModelTest, OnlyAWorkerThatTakesItGetsTheModelInItsTask) {
  for (uint64_t limit : {uint64_t{256} << 10, uint64_t{0}}) {
    SCOPED_TRACE(limit);
    TempDir dir("inline-model");
    auto options = TestCoordinatorOptions(dir.str());
    options.chunk_bytes = 4096;  // the model travels in many chunks, inside the task too
    options.runner.inline_model_bytes = limit;
    auto coordinator = server::Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    const int port = (*coordinator)->port();
    TaskKeeper taker(port, "taker", true), old(port, "old", false);
    auto stub = JobStub(port);
    ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
    auto job = (*coordinator)->SubmitJob(SmallJob(1, 2, 1000));
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    ASSERT_TRUE(WaitUntil([&] { return taker.task() && old.task(); }, std::chrono::milliseconds(20000)));
    const v1::TrainTask inline_task = *taker.task();
    EXPECT_FALSE(old.task()->has_inline_model()) << "a worker that did not ask for it got a model in its task";
    auto downloaded = old.hand().Download(*old.task());
    ASSERT_TRUE(downloaded.ok()) << downloaded.status().ToString();
    if (limit == 0) {
      EXPECT_FALSE(inline_task.has_inline_model()) << "--inline-model-kib 0 sent one";
      continue;
    }
    ASSERT_TRUE(inline_task.has_inline_model());
    EXPECT_GT(inline_task.inline_model().chunks_size(), 1);
    auto carried = wire::ReadInlineModel(inline_task.inline_model(), "the taker's model", uint64_t{1} << 30);
    ASSERT_TRUE(carried.ok()) << carried.status().ToString();
    EXPECT_EQ(TensorSetSha256(*carried), TensorSetSha256(*downloaded));
    // The task's own fields are there beside the model.
    EXPECT_EQ(inline_task.job_id(), job->id());
    EXPECT_EQ(inline_task.round(), 1u);
  }
}

// Holds back the first task-channel write completion after Arm() until Release() (or a bound
// only a failing test reaches), as a loaded machine can; clears the hook when it goes.
class HeldWriteCompletion {
 public:
  HeldWriteCompletion() {
    server::SetTaskChannelWriteDoneHookForTesting([this] {
      if (!armed_.load() || held_.exchange(true)) return;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(60), [this] { return released_; });
    });
  }
  ~HeldWriteCompletion() { server::SetTaskChannelWriteDoneHookForTesting(nullptr); }
  void Arm() { armed_ = true; }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool held() const { return held_.load(); }

 private:
  std::atomic<bool> armed_{false}, held_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// A model inside its task counts for its round as the task is handed to the transport: the
// worker can have the task, report, and see its round commit before gRPC runs the write's
// completion. Here that completion is held back until the job has ended, and the round's
// record still counts the model's bytes for the worker.
TEST(InlineModelTest, AModelInsideItsTaskCountsForItsRoundEvenWhenItsWriteCompletesAfterTheCommit) {
  HeldWriteCompletion completion;  // first: its hook is cleared after the coordinator has gone
  TempDir dir("inline-model-counted");
  auto options = TestCoordinatorOptions(dir.str());
  options.inline_update_max_bytes = 0;  // the update goes by a call, its verdict in the reply
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  TaskKeeper worker(port, "taker", true);
  struct ReleaseAtExit {
    HeldWriteCompletion* c;
    ~ReleaseAtExit() { c->Release(); }
  } release_at_exit{&completion};  // before the worker and the coordinator go
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(20)));
  completion.Arm();
  auto job = (*coordinator)->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return worker.task().has_value(); }, std::chrono::milliseconds(20000)));
  const v1::TrainTask task = *worker.task();
  ASSERT_TRUE(task.has_inline_model());
  ASSERT_TRUE(completion.held()) << "the task's write completed before the test could hold it";

  auto model = wire::ReadInlineModel(task.inline_model(), "the task's model", uint64_t{1} << 30);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  uint64_t model_bytes = 0;
  TensorSet delta = *model;
  for (auto& t : delta) {
    model_bytes += t.values.size() * sizeof(float);
    std::fill(t.values.begin(), t.values.end(), 0.0f);
  }
  v1::UpdateHeader header;
  header.set_worker_id(worker.hand().joined().worker_id());
  header.set_session(worker.hand().joined().session());
  header.set_job_id(task.job_id());
  header.set_round(task.round());
  header.set_attempt(task.attempt());
  header.set_base_model_version(task.model_version());
  header.set_samples(100);
  wire::UpdateBytes bytes;
  wire::AppendUpdateSet(wire::kDeltaSet, delta, UpdateEncoding::kFloat32, 0, 1 << 20, &header, &bytes);
  auto result =
      worker.hand().client().UploadUpdate(header, std::make_shared<const wire::UpdateBytes>(bytes), 1 << 20, 0);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->accepted()) << result->reason();
  const v1::GetJobResponse done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  completion.Release();
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 1);
  ASSERT_EQ(done.rounds(0).workers_size(), 1);
  EXPECT_EQ(done.rounds(0).workers(0).outcome(), "accepted");
  EXPECT_EQ(done.rounds(0).workers(0).download_bytes(), model_bytes);
  EXPECT_EQ(done.rounds(0).download_bytes(), model_bytes);
}

// Two real workers through a two-round job on a coordinator set up by `configure`; the
// job's round records, empty (with a failure recorded) if it did not succeed.
std::vector<v1::RoundRecord> RunSmallJob(const char* name, const std::function<void(server::CoordinatorOptions&)>& configure) {
  TempDir dir(name);
  auto options = TestCoordinatorOptions(dir.str());
  configure(options);
  auto coordinator = server::Coordinator::Start(options);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  if (!coordinator.ok()) return {};
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 2; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "w" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  EXPECT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  auto job = (*coordinator)->SubmitJob(SmallJob(2, 2, 1000));
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  if (!job.ok()) return {};
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  EXPECT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  return {done.rounds().begin(), done.rounds().end()};
}

// The small job run twice, `configure` told which run it sets up (0 or 1); expects both
// runs to succeed with two rounds ending on the same accuracy and loss.
using TwoRuns = std::array<std::vector<v1::RoundRecord>, 2>;
TwoRuns RunTwiceAlike(const char* name, const std::function<void(server::CoordinatorOptions&, int run)>& configure) {
  TwoRuns runs;
  for (int run = 0; run < 2; ++run) {
    runs[run] = RunSmallJob(name, [&](server::CoordinatorOptions& options) { configure(options, run); });
  }
  EXPECT_EQ(runs[0].size(), 2u);
  EXPECT_EQ(runs[1].size(), 2u);
  for (size_t i = 0; i < std::min(runs[0].size(), runs[1].size()); ++i) {
    EXPECT_EQ(runs[0][i].test_accuracy(), runs[1][i].test_accuracy()) << "round " << i + 1;
    EXPECT_EQ(runs[0][i].test_loss(), runs[1][i].test_loss()) << "round " << i + 1;
  }
  return runs;
}

// Every update of run 0 accepted, and as many bytes uploaded in each round as in run 1.
void ExpectSameUploads(const TwoRuns& runs) {
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].upload_bytes(), runs[1][i].upload_bytes()) << "round " << i + 1;
    EXPECT_GT(runs[0][i].upload_bytes(), 0u);
    EXPECT_EQ(runs[0][i].workers_size(), 2);
    for (const auto& w : runs[0][i].workers()) EXPECT_EQ(w.outcome(), "accepted") << w.worker_id();
  }
}

// Real workers: a job whose model travels in the tasks ends with the same figures as the
// same job downloading it.
TEST(InlineModelTest, RealWorkersTrainTheSameEitherWay) {
  const TwoRuns runs = RunTwiceAlike("inline-model-real", [](server::CoordinatorOptions& options, int run) {
    options.runner.inline_model_bytes = run == 0 ? (uint64_t{256} << 10) : 0;
  });
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].download_bytes(), runs[1][i].download_bytes()) << "round " << i + 1;
    EXPECT_GT(runs[0][i].download_bytes(), 0u);
  }
}

// Real workers: with a coordinator that takes the trained models and subtracts the global one
// (the default) a job ends on the same figures as with deltas sent (--trained-weights=false),
// and its updates carry as many bytes.
TEST(TrainedWeightsTest, RealWorkersTrainTheSameEitherWay) {
  ExpectSameUploads(RunTwiceAlike("trained-weights-real", [](server::CoordinatorOptions& options, int run) {
    options.runner.take_trained_weights = run == 0;
  }));
}

// Real workers under mutual TLS: with every update sent on a connection of its own (a
// threshold of one byte) a job ends on the same figures as with every update on the workers'
// own connections (0), each update accepted.
TEST(UploadConnectionTest, RealWorkersTrainTheSameOnTheirOwnConnectionOrOnAFreshOne) {
  ExpectSameUploads(RunTwiceAlike("upload-connection-real", [](server::CoordinatorOptions& options, int run) {
    options.upload_connection_min_bytes = run == 0 ? 1 : 0;
    options.inline_update_max_bytes = 0;  // no update inside a task session: every one by a call
  }));
}

// Real workers: with their updates inside their task sessions (the default) a job ends on the
// same figures as with every update by an upload call (--inline-update-kib 0), each update
// accepted, and each came the way the coordinator said.
TEST(TaskSessionTest, RealWorkersTrainTheSameWithUpdatesInsideTheirSessionsOrByCalls) {
  std::array<double, 2> sessions{}, calls{};
  ExpectSameUploads(RunTwiceAlike("task-session-real", [&](server::CoordinatorOptions& options, int run) {
    options.inline_update_max_bytes = run == 0 ? (uint64_t{1} << 20) : 0;
    // (Called before each run starts: the counts so far.)
    sessions[run] = server::UpdatesReceived("session");
    calls[run] = server::UpdatesReceived("call");
  }));
  const double sessions_after = server::UpdatesReceived("session"), calls_after = server::UpdatesReceived("call");
  // Two rounds of two workers in each run.
  EXPECT_EQ(sessions[1] - sessions[0], 4);
  EXPECT_EQ(calls[1] - calls[0], 0);
  EXPECT_EQ(sessions_after - sessions[1], 0);
  EXPECT_EQ(calls_after - calls[1], 4);
}

}  // namespace
}  // namespace tessera::testing
