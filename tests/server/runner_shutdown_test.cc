// Stopping with work in flight, on a ManualClock: JobRunner::Stop() (what the coordinator's
// shutdown calls) while an update is being folded, while an upload is admitted but not yet
// submitted, and while a commit is under way; the coordinator's own Shutdown() with an upload
// in flight, then a restart on the same state directory. Each time: no crash, no deadlock,
// no half-committed round, and the resumed job continues from its last committed round. A
// cancel, as the job runs or as it ends: no cancel left pending on the ended job.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <future>

#include "job_runner_fixture.h"
#include "server/coordinator.h"
#include "server/state/sqlite_state_store.h"
#include "test_strategies.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

class RunnerShutdownTest : public JobRunnerFixture {
 protected:
  // Runs the stored job again in a new runner, as a restarted coordinator would.
  v1::Job Resume() {
    StartRunner(Stored());
    return AwaitEnd();
  }
};

TEST_F(RunnerShutdownTest, StopWhileAnUpdateIsMidFoldWaitsForTheFoldAndCommitsNothing) {
  auto fold = std::make_shared<Gate>();
  OpenAtExit fold_ends(fold);
  options_.strategy_factory = WrapStrategy<FoldGatedStrategy>(fold);
  std::atomic<bool> resumed{false};
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  AddWorker("w2", [&resumed](const v1::TrainTask&) { return resumed ? FakeAction::Upload() : FakeAction::Hang(); });
  Submit(SmallSpec(2, 2));
  ASSERT_TRUE(fold->AwaitReached());  // w1's update is being folded, outside the round's lock
  ASSERT_TRUE(AwaitRunnerWaiting());  // the runner waits for w2
  auto stopped = std::async(std::launch::async, [this] { StopRunner(); });
  OpenAtExit fold_goes_on(fold);
  ASSERT_TRUE(clock_.AwaitWaiters(0, kWaitLimit));  // the stop ended the runner's wait
  EXPECT_NE(stopped.wait_for(milliseconds(0)), std::future_status::ready)
      << "Stop() returned while an update was being folded into the round";
  fold->Open();
  ASSERT_EQ(stopped.wait_for(kWaitLimit), std::future_status::ready) << "Stop() does not return";
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  EXPECT_TRUE(w1.turns()[0].verdict.has_value());
  // Nothing of the round is stored; the job stays running, to be resumed.
  EXPECT_EQ(Stored().state(), v1::JOB_RUNNING);
  EXPECT_EQ(Stored().rounds_committed(), 0u);
  EXPECT_TRUE(Rounds().empty());
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 1));
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 0);

  resumed = true;
  options_.strategy_factory = nullptr;
  v1::Job job = Resume();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].round(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
}

// A job's end is told to the workers that trained for it (a cancel of round 0), and those a
// coordinator process before a restart tasked are no exception: the seats the store holds for
// the job name them. Here the first runner trains round 1 and stops while round 2 waits; the
// job's cancel is then asked for in the store, so the resumed runner ends it without a task.
TEST_F(RunnerShutdownTest, AResumedJobsEndReachesTheWorkersTaskedBeforeTheRestart) {
  FakeWorker& w1 = AddWorker("w1", [](const v1::TrainTask& t) {
    return t.round() == 1 ? FakeAction::Upload() : FakeAction::Hang();
  });
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(2);
  Submit(spec);
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  ASSERT_TRUE(AwaitEvent("committed round 1;")) << Events();
  ASSERT_TRUE(AwaitRunnerWaiting());  // for w1's round 2
  // w1 has taken round 2's task: counted below before the restart, not after it.
  ASSERT_TRUE(w1.AwaitTrainTask(2, 1));
  StopRunner();
  ASSERT_EQ(Stored().state(), v1::JOB_RUNNING);
  ASSERT_EQ(Stored().rounds_committed(), 1u);
  auto told = [](const std::vector<v1::Task>& received) {
    return std::count_if(received.begin(), received.end(), [](const v1::Task& t) {
      return t.has_cancel() && t.cancel().round() == 0 && t.cancel().job_id() == kJobId;
    });
  };
  EXPECT_EQ(told(w1.received()), 0) << "a stop does not end the job";
  const size_t tasks_before = w1.turns().size();

  ASSERT_TRUE(store_.RequestCancel(kJobId).ok());
  v1::Job job = Resume();
  ASSERT_EQ(job.state(), v1::JOB_CANCELLED) << job.error();
  EXPECT_EQ(w1.turns().size(), tasks_before) << "the resumed runner tasked no one";
  EXPECT_TRUE(w1.Await([&](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return told(received) == 1;
  })) << "w1 trained for the job before the restart and was not told it ended";
}

TEST_F(RunnerShutdownTest, StopWithAnUploadAdmittedButNotSubmittedCommitsNothingAndTheUploadIsRefused) {
  auto submit = std::make_shared<Gate>();
  std::atomic<bool> resumed{false};
  FakeWorker& w1 = AddWorker("w1", [&](const v1::TrainTask&) {
    return resumed ? FakeAction::Upload() : FakeAction::Upload().StopBeforeSubmit(submit);
  });
  AddWorker("w2", [&resumed](const v1::TrainTask&) { return resumed ? FakeAction::Upload() : FakeAction::Hang(); });
  Submit(SmallSpec(2, 1));
  ASSERT_TRUE(submit->AwaitReached());  // admitted; its tensors are still arriving
  StopRunner();
  submit->Open();
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  const FakeTurn turn = w1.turns()[0];
  EXPECT_TRUE(turn.admitted->ok());
  EXPECT_EQ(turn.verdict->code(), StatusCode::kFailedPrecondition) << turn.verdict->ToString();
  EXPECT_NE(turn.verdict->message().find("no round is open"), std::string::npos) << turn.verdict->message();
  EXPECT_EQ(Stored().state(), v1::JOB_RUNNING);
  EXPECT_EQ(Stored().rounds_committed(), 0u);
  EXPECT_TRUE(Rounds().empty());
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 1));

  resumed = true;
  v1::Job job = Resume();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_EQ(Rounds().size(), 1u);
  EXPECT_EQ(Rounds()[0].clients_reported(), 2u);
}

TEST_F(RunnerShutdownTest, StopDuringACommitLetsItCompleteAndTheJobResumesAtTheNextRound) {
  auto commit = std::make_shared<Gate>();
  OpenAtExit commit_ends(commit);
  store_.SetWriteHook(StateWrite::kCommitRound, [commit] { commit->Pass(); });
  std::atomic<bool> resumed{false};
  // Round 2 cannot end by itself before the resume: whether the stop is seen before round 2
  // opens or while it waits, it is not committed.
  FakeWorker& w1 = AddWorker("w1", [&resumed](const v1::TrainTask& t) {
    return t.round() == 1 || resumed ? FakeAction::UploadRandom(t.round()) : FakeAction::Hang();
  });
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(2);
  Submit(spec);
  ASSERT_TRUE(commit->AwaitReached());  // round 1's commit is under way
  auto stopped = std::async(std::launch::async, [this] { StopRunner(); });
  OpenAtExit commit_goes_on(commit);
  EXPECT_NE(stopped.wait_for(milliseconds(0)), std::future_status::ready)
      << "Stop() returned while a commit was under way";
  commit->Open();
  ASSERT_EQ(stopped.wait_for(kWaitLimit), std::future_status::ready) << "Stop() does not return";
  // Round 1 is whole; round 2 is not there at all.
  const v1::Job stored = Stored();
  EXPECT_EQ(stored.state(), v1::JOB_RUNNING);
  EXPECT_EQ(stored.rounds_committed(), 1u);
  EXPECT_EQ(stored.last_round().round(), 1u);
  ASSERT_EQ(Rounds().size(), 1u);
  EXPECT_TRUE(store_.HasCheckpoint(kJobId, 1));
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 2));
  const std::string first_model = Rounds()[0].model_sha256();
  EXPECT_FALSE(first_model.empty());

  store_.SetWriteHook(StateWrite::kCommitRound, nullptr);
  resumed = true;
  v1::Job job = Resume();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[0].model_sha256(), first_model) << "round 1 was run again";
  EXPECT_EQ(rounds[1].round(), 2u);
  EXPECT_EQ(w1.turns().back().task.round(), 2u);
  const auto turns = w1.turns();
  EXPECT_EQ(std::count_if(turns.begin(), turns.end(), [](const FakeTurn& t) { return t.task.round() == 1; }), 1)
      << "round 1 was trained again";
}

TEST_F(RunnerShutdownTest, ACancelWhileARoundIsOpenEndsTheJobAtOnceWithoutCommitting) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Hang()));
  Submit(SmallSpec(1, 1));
  ASSERT_TRUE(w1.AwaitTrainTask(1, 1));
  ASSERT_TRUE(AwaitRunnerWaiting());
  runner()->Cancel();  // the clock never moves: the cancel alone ends the wait
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED);
  EXPECT_EQ(Stored().state(), v1::JOB_CANCELLED);
  EXPECT_TRUE(Rounds().empty());
  ASSERT_TRUE(w1.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), IsTaskCancel);
  }));
  EXPECT_EQ(w1.cancels()[0].attempt(), 1u);
}

// A cancel that ends the job is its state, CANCELLED, not a cancel still pending: neither the
// runner nor the store gives the ended job with cancel_requested.
TEST_F(RunnerShutdownTest, ACancelThatEndsTheJobLeavesItCancelledWithNoCancelPending) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Hang()));
  Submit(SmallSpec(1, 1));
  ASSERT_TRUE(w1.AwaitTrainTask(1, 1));
  ASSERT_TRUE(store_.RequestCancel(kJobId).ok());  // as Coordinator::CancelJob does first
  runner()->Cancel();
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED);
  EXPECT_FALSE(job.cancel_requested());
  EXPECT_FALSE(runner()->Listed().cancel_requested());
  EXPECT_EQ(Stored().state(), v1::JOB_CANCELLED);
  EXPECT_FALSE(Stored().cancel_requested());
}

// A cancel that comes as the job ends otherwise, recorded and told to the runner while its end
// is being written, leaves no cancel pending on the job that succeeded.
TEST_F(RunnerShutdownTest, ACancelRecordedAsTheJobSucceedsLeavesNoCancelPending) {
  AddWorker("w1", Always(FakeAction::Upload(0.1f)));
  std::atomic<bool> cancelled{false};
  store_.SetWriteHook(StateWrite::kUpdateJob, [this, &cancelled] {
    auto r = runner();
    if (r == nullptr || r->state() != v1::JOB_SUCCEEDED || cancelled.exchange(true)) return;
    EXPECT_TRUE(store_.RequestCancel(kJobId).ok());
    r->Cancel();
  });
  v1::Job job = Run(SmallSpec(1, 1));
  store_.SetWriteHook(StateWrite::kUpdateJob, nullptr);
  ASSERT_TRUE(cancelled.load()) << "the job's end was not written";
  EXPECT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  EXPECT_FALSE(job.cancel_requested());
  EXPECT_FALSE(runner()->Listed().cancel_requested());
  EXPECT_FALSE(Stored().cancel_requested());
  auto listed = store_.ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_FALSE((*listed)[0].cancel_requested());
}

// The coordinator's shutdown in full (task channels, runners, watches, the gRPC server) with
// an upload admitted but not submitted, then a new coordinator on the same state directory.
class CoordinatorShutdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-shutdown");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  CoordinatorOptions Options() {
    CoordinatorOptions options = LoopbackCoordinatorOptions(dir_, "shutdown-test");
    options.runner.clock = &clock_;
    options.registry.clock = &registry_clock_;
    return options;
  }

  std::shared_ptr<FakeWorker> Worker(Coordinator* c, const std::string& name, FakeAction action) {
    auto worker = std::make_shared<FakeWorker>(
        &c->registry(), name, [action](const v1::TrainTask&) { return action; },
        [this, c] { return c->Runner(job_id_); });
    EXPECT_TRUE(worker->Start().ok());
    return worker;
  }

  // Blocks until the job's event log closes (it ended).
  static bool AwaitEnd(JobRunner& runner) {
    std::mutex mu;
    std::condition_variable cv;
    bool ended = false;
    auto check = [&] {
      bool done = false;
      runner.events().Since(0, &done);
      std::lock_guard<std::mutex> lock(mu);
      ended = ended || done;
      cv.notify_all();
    };
    const uint64_t id = runner.events().Subscribe(check);
    check();
    std::unique_lock<std::mutex> lock(mu);
    const bool done = cv.wait_for(lock, kWaitLimit, [&] { return ended; });
    lock.unlock();
    runner.events().Unsubscribe(id);
    return done;
  }

  std::filesystem::path dir_;
  ManualClock clock_;
  ManualClock registry_clock_;
  std::string job_id_;
};

TEST_F(CoordinatorShutdownTest, ShutdownWithAnUploadInFlightCommitsNothingAndARestartResumesTheJob) {
  const v1::JobSpec spec = JobRunnerFixture::SmallSpec(2, 2);
  {
    auto started = Coordinator::Start(Options());
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    Coordinator& c = **started;
    auto submit = std::make_shared<Gate>();
    auto w1 = Worker(&c, "w1", FakeAction::Upload().StopBeforeSubmit(submit));
    auto w2 = Worker(&c, "w2", FakeAction::Hang());
    auto job = c.SubmitJob(spec);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    job_id_ = job->id();
    ASSERT_TRUE(submit->AwaitReached());
    c.Shutdown();
    submit->Open();
    ASSERT_TRUE(w1->AwaitFinished(1, 1));
    EXPECT_EQ(w1->turns()[0].verdict->code(), StatusCode::kFailedPrecondition) << w1->turns()[0].verdict->ToString();
    w1->Stop();
    w2->Stop();
  }
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    auto stored = (*store)->GetJob(job_id_);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->state(), v1::JOB_RUNNING);
    EXPECT_EQ(stored->rounds_committed(), 0u);
    EXPECT_TRUE((*store)->ListRounds(job_id_)->empty());
  }
  auto restarted = Coordinator::Start(Options());
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  Coordinator& c = **restarted;
  std::shared_ptr<JobRunner> runner = c.Runner(job_id_);
  ASSERT_NE(runner, nullptr) << "the running job was not resumed";
  ASSERT_TRUE(clock_.AwaitWaiters(1, kWaitLimit));  // it waits for workers
  auto w1 = Worker(&c, "w1", FakeAction::Upload());
  auto w2 = Worker(&c, "w2", FakeAction::Upload());
  clock_.Advance(JobRunnerOptions().worker_poll_interval);
  ASSERT_TRUE(AwaitEnd(*runner));
  auto job = c.GetJob(job_id_);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_SUCCEEDED) << job->error();
  auto rounds = c.ListRounds(job_id_, 0);
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].clients_reported(), 2u);
  w1->Stop();
  w2->Stop();
  c.Shutdown();
}

}  // namespace
}  // namespace tessera::server
