// A round whose commit cannot be written (a full disk, an I/O error), with MemoryStateStore's
// failure injection and a ManualClock: the round is not committed, its commit is tried again
// with doubling waits (JobRunnerOptions::commit_retry_limit, --commit-retry-s) and, once a try
// gets through, the job goes on as if nothing had happened; past the limit the job fails
// saying how long it tried and the last error; a cancel or a stop ends the wait at once, the
// round uncommitted, and a resumed job runs it again; an asynchronous job's step alike (a
// cancel during its wait tells the tasks out of the cancel, a stop tells them nothing); an
// error that waiting does not mend (a damaged database) fails the job at once.
// runner_state_failure_test.cc has the commit that is not retried (a limit of 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/metrics.h"
#include "job_runner_fixture.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

class RunnerCommitRetryTest : public JobRunnerFixture {
 protected:
  FakeWorker& StartAStepThatWaitsToCommit();

  // From round `round`'s commit on, the next `count` writes of `kind` fail with `why`.
  void FailFromRound(StateWrite kind, uint32_t round, int count, Status why) {
    auto writes = std::make_shared<std::atomic<uint32_t>>(0);
    store_.SetWriteHook(kind, [this, kind, round, count, why, writes] {
      if (++*writes == round) store_.FailNextWrites(kind, count, why);
    });
  }

  // Waits for the runner to wait before try `tries` + 1 of round 2's commit, checks that the
  // wait is `delay`, and ends it.
  void PassRetryWait(int tries, milliseconds delay) {
    ASSERT_TRUE(AwaitEvent("waiting to commit round 2: cannot commit round 2 (try " + std::to_string(tries) + ")"))
        << Events();
    ASSERT_TRUE(AwaitRunnerWaiting());
    EXPECT_EQ(clock_.NextDeadline(), clock_.Now() + delay) << "waits " << delay.count() << " ms after try " << tries;
    clock_.Advance(delay);
  }

  // Asynchronous, two clients training at once, a step at each update.
  static v1::JobSpec TwoStepsOfOneUpdate() {
    v1::JobSpec spec = SmallSpec(2, 1);
    spec.set_rounds(2);
    spec.mutable_async()->set_buffer_size(1);
    spec.mutable_async()->set_max_staleness(1);
    spec.mutable_async()->set_concurrency(2);
    spec.mutable_async()->set_staleness_weighting("constant");
    return spec;
  }

  static v1::JobSpec ThreeRounds() {
    v1::JobSpec spec = SmallSpec(1, 1);
    spec.set_rounds(3);
    return spec;
  }
};

// The coordinator's count of failed commit tries of `job` (tessera_commit_failures_total),
// 0 before the first: the metrics are the process's, shared by every test here.
double CommitFailures(const std::string& job) {
  const std::string text = metrics::Global().Render();
  const std::string series = "\ntessera_commit_failures_total{job=\"" + job + "\"} ";
  const size_t at = text.find(series);
  return at == std::string::npos ? 0 : std::stod(text.substr(at + series.size(), 32));
}

TEST_F(RunnerCommitRetryTest, ACommitThatFailsTwiceIsRetriedAndTheJobEndsAsAnUninterruptedOne) {
  const double failures_before = CommitFailures(kJobId);
  FailFromRound(StateWrite::kCommitRound, 2, 2,
                ResourceExhaustedError("scripted: cannot write the round's record (the disk is full)"));
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  Submit(ThreeRounds());
  PassRetryWait(1, milliseconds(1000));
  PassRetryWait(2, milliseconds(2000));
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  const std::string events = Events();
  EXPECT_NE(events.find("waiting to commit round 2: cannot commit round 2 (try 1): its record: scripted: cannot "
                        "write the round's record (the disk is full); not committed (the previous checkpoint stays "
                        "the newest); retrying in 1 s, for up to 300 s in all"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("round 2 committed at try 3, 3 s after its first failure"), std::string::npos) << events;
  EXPECT_EQ(CommitFailures(kJobId) - failures_before, 2) << "tries 1 and 2 failed";
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 5) << "rounds 1 and 3 once, round 2 three times";
  EXPECT_EQ(store_.writes(StateWrite::kWriteCheckpoint), 3) << "a checkpoint written is not written again";
  const std::vector<v1::RoundRecord> retried = Rounds();
  ASSERT_EQ(retried.size(), 3u);
  auto retried_model = store_.LoadCheckpoint(kJobId, 3);
  ASSERT_TRUE(retried_model.ok()) << retried_model.status().ToString();

  // The same job again, with nothing failing.
  store_.SetWriteHook(StateWrite::kCommitRound, nullptr);
  v1::Job again;
  again.set_id("job-2-test");
  *again.mutable_spec() = ThreeRounds();
  again.set_state(v1::JOB_PENDING);
  ASSERT_TRUE(store_.InsertJob(again).ok());
  StartRunner(again);
  ASSERT_EQ(AwaitEnd().state(), v1::JOB_SUCCEEDED);
  auto uninterrupted = store_.ListRounds("job-2-test");
  ASSERT_TRUE(uninterrupted.ok());
  ASSERT_EQ(uninterrupted->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(retried[i].model_sha256(), (*uninterrupted)[i].model_sha256()) << "round " << i + 1;
    EXPECT_EQ(retried[i].test_accuracy(), (*uninterrupted)[i].test_accuracy()) << "round " << i + 1;
    EXPECT_EQ(retried[i].test_loss(), (*uninterrupted)[i].test_loss()) << "round " << i + 1;
  }
  auto uninterrupted_model = store_.LoadCheckpoint("job-2-test", 3);
  ASSERT_TRUE(uninterrupted_model.ok());
  EXPECT_EQ(EncodeCheckpoint(*retried_model), EncodeCheckpoint(*uninterrupted_model));
}

TEST_F(RunnerCommitRetryTest, ACheckpointThatKeepsFailingFailsTheJobAtTheLimitWithTheLastError) {
  options_.commit_retry_limit = milliseconds(10000);
  FailFromRound(StateWrite::kWriteCheckpoint, 2, 1000,
                ResourceExhaustedError("scripted: cannot write 'ckpt': No space left on device (the disk is full)"));
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  Submit(ThreeRounds());
  // Tries at 0, 1, 3 and 7 s, and the last at the limit, 10 s.
  int tries = 0;
  for (const int delay : {1000, 2000, 4000, 3000}) PassRetryWait(++tries, milliseconds(delay));
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(),
            "round 2 failed after 1 attempt(s): the commit of round 2 failed 5 times in 10 s (--commit-retry-s 10); "
            "the last error: scripted: cannot write 'ckpt': No space left on device (the disk is full)");
  const v1::Job stored = Stored();
  EXPECT_EQ(stored.state(), v1::JOB_FAILED);
  EXPECT_EQ(stored.error(), job.error());
  EXPECT_EQ(stored.rounds_committed(), 1u);
  EXPECT_EQ(Rounds().size(), 1u);
  EXPECT_TRUE(store_.HasCheckpoint(kJobId, 1));
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 2));
  EXPECT_EQ(store_.writes(StateWrite::kWriteCheckpoint), 6) << "round 1's, and round 2's five tries";
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 1) << "no record without its checkpoint";
}

TEST_F(RunnerCommitRetryTest, ACancelWhileTheCommitWaitsEndsTheJobCancelledAtOnce) {
  FailFromRound(StateWrite::kCommitRound, 2, 1000, InternalError("scripted: disk I/O error"));
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  Submit(ThreeRounds());
  ASSERT_TRUE(AwaitEvent("waiting to commit round 2")) << Events();
  ASSERT_TRUE(AwaitRunnerWaiting());
  runner()->Cancel();  // the clock does not move: the wait ends on the cancel
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED) << job.error();
  EXPECT_EQ(job.error(), "cancelled by the user");
  EXPECT_NE(Events().find("round 2 not committed: the job was cancelled"), std::string::npos) << Events();
  EXPECT_EQ(Stored().state(), v1::JOB_CANCELLED);
  EXPECT_EQ(Stored().rounds_committed(), 1u);
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 2);
}

TEST_F(RunnerCommitRetryTest, AStopWhileTheCommitWaitsLeavesTheRoundUncommittedAndTheResumedJobRunsItAgain) {
  FailFromRound(StateWrite::kCommitRound, 2, 1000, InternalError("scripted: disk I/O error"));
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  Submit(ThreeRounds());
  ASSERT_TRUE(AwaitEvent("waiting to commit round 2")) << Events();
  ASSERT_TRUE(AwaitRunnerWaiting());
  StopRunner();  // returns without the clock moving
  EXPECT_EQ(Stored().state(), v1::JOB_RUNNING);
  EXPECT_EQ(Stored().rounds_committed(), 1u);
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 2));

  // The disk has room again: the resumed job runs round 2 again and ends.
  store_.SetWriteHook(StateWrite::kCommitRound, nullptr);
  store_.FailNextWrites(StateWrite::kCommitRound, 0, Status::Ok());
  StartRunner(Stored());
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_EQ(Rounds().size(), 3u);
  EXPECT_EQ(Rounds()[1].round(), 2u);
}

TEST_F(RunnerCommitRetryTest, AnAsynchronousStepsCommitIsRetriedLikeARounds) {
  FailFromRound(StateWrite::kCommitRound, 1, 1, ResourceExhaustedError("scripted: the disk is full"));
  AddWorker("w1", Always(FakeAction::Upload()));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(2);
  spec.mutable_async()->set_buffer_size(1);
  spec.mutable_async()->set_max_staleness(1);
  spec.mutable_async()->set_concurrency(1);
  spec.mutable_async()->set_staleness_weighting("constant");
  Submit(spec);
  ASSERT_TRUE(AwaitEvent("waiting to commit step 1: cannot commit step 1 (try 1): its record: scripted: the disk is "
                         "full"))
      << Events();
  ASSERT_TRUE(AwaitRunnerWaiting());
  EXPECT_EQ(clock_.NextDeadline(), clock_.Now() + milliseconds(1000));
  clock_.Advance(milliseconds(1000));
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  EXPECT_NE(Events().find("step 1 committed at try 2, 1 s after its first failure"), std::string::npos) << Events();
  EXPECT_EQ(Stored().rounds_committed(), 2u);
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 3);
}

TEST_F(RunnerCommitRetryTest, AnErrorThatWaitingDoesNotMendFailsTheJobAtOnce) {
  // A damaged database fails every try alike: no wait, though the limit is 300 s.
  FailFromRound(StateWrite::kCommitRound, 2, 1000, DataLossError("scripted: database disk image is malformed"));
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  Submit(ThreeRounds());
  v1::Job job = AwaitEnd();  // the clock does not move
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(), "round 2 failed after 1 attempt(s): scripted: database disk image is malformed");
  EXPECT_EQ(Events().find("waiting to commit"), std::string::npos) << Events();
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 2);
  EXPECT_EQ(Stored().rounds_committed(), 1u);
}

TEST_F(RunnerCommitRetryTest, AnErrorThatWaitingDoesNotMendAtARetryFailsTheJobThen) {
  // Round 2's record: a full disk, then a damaged database.
  auto writes = std::make_shared<std::atomic<int>>(0);
  store_.SetWriteHook(StateWrite::kCommitRound, [this, writes] {
    const int write = ++*writes;
    if (write == 2) store_.FailNextWrites(StateWrite::kCommitRound, 1, ResourceExhaustedError("scripted: full"));
    if (write == 3) store_.FailNextWrites(StateWrite::kCommitRound, 1, DataLossError("scripted: malformed"));
  });
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  Submit(ThreeRounds());
  PassRetryWait(1, milliseconds(1000));
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(),
            "round 2 failed after 1 attempt(s): the commit of round 2 failed 2 times in 1 s; the last error, which "
            "waiting does not mend: scripted: malformed");
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 3);
}

// An asynchronous job whose first step's commit keeps failing with a disk error, waiting to
// try again, while w2's task is out (w2 never answers). A failure shows in HasFailure().
FakeWorker& RunnerCommitRetryTest::StartAStepThatWaitsToCommit() {
  FailFromRound(StateWrite::kCommitRound, 1, 1000, InternalError("scripted: disk I/O error"));
  AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& busy = AddWorker("w2", Always(FakeAction::Hang()));  // its task is out during the wait
  Submit(TwoStepsOfOneUpdate());
  EXPECT_TRUE(busy.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), [](const v1::Task& t) { return t.has_train(); });
  }));
  EXPECT_TRUE(AwaitEvent("waiting to commit step 1")) << Events();
  EXPECT_TRUE(AwaitRunnerWaiting());
  return busy;
}

TEST_F(RunnerCommitRetryTest, ACancelWhileAStepWaitsToCommitTellsTheTasksOutTheJobWasCancelled) {
  FakeWorker& busy = StartAStepThatWaitsToCommit();
  ASSERT_FALSE(HasFailure());
  runner()->Cancel();
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED) << job.error();
  ASSERT_TRUE(busy.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), IsTaskCancel);
  }));
  for (const v1::CancelTask& cancel : busy.cancels()) EXPECT_EQ(cancel.reason(), "the job was cancelled");
}

TEST_F(RunnerCommitRetryTest, AStopWhileAStepWaitsToCommitCancelsNoTaskOut) {
  FakeWorker& busy = StartAStepThatWaitsToCommit();
  ASSERT_FALSE(HasFailure());
  StopRunner();  // as the coordinator's shutdown: the job resumes at the next start
  EXPECT_EQ(Stored().state(), v1::JOB_RUNNING);
  // Whatever the runner sent came before this mark, on the same channel.
  v1::Task mark;
  mark.mutable_cancel()->set_reason("mark");
  ASSERT_TRUE(registry_.Send("w2", std::move(mark)).ok());
  ASSERT_TRUE(busy.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(),
                       [](const v1::Task& t) { return t.has_cancel() && t.cancel().reason() == "mark"; });
  }));
  for (const v1::CancelTask& cancel : busy.cancels()) ADD_FAILURE() << "task cancelled: " << cancel.reason();
}

}  // namespace
}  // namespace tessera::server
