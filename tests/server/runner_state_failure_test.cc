// What the round driver does when the state store fails, with MemoryStateStore's failure
// injection and a ManualClock: a commit that cannot be written, with no retry of commits
// (JobRunnerOptions::commit_retry_limit 0; runner_commit_retry_test.cc retries), ends the job
// FAILED and keeps the last committed round; the job's end is retried with doubling delays until durable, and
// given up (the job left as last recorded) when the runner stops; a record that cannot be
// rewritten after its commit, a seat or an initial model that cannot be saved.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>
#include <vector>

#include "job_runner_fixture.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

class RunnerStateFailureTest : public JobRunnerFixture {};

TEST_F(RunnerStateFailureTest, ACommitThatCannotBeWrittenEndsTheJobFailedAndKeepsTheLastCommittedRound) {
  options_.commit_retry_limit = milliseconds(0);  // --commit-retry-s 0
  // Round 1 commits; round 2's commit fails once.
  int commits = 0;
  store_.SetWriteHook(StateWrite::kCommitRound, [this, &commits] {
    if (++commits == 2) {
      store_.FailNextWrites(StateWrite::kCommitRound, 1,
                            ResourceExhaustedError("scripted: cannot write the checkpoint (the disk is full)"));
    }
  });
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(3);
  v1::Job job = Run(spec);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(), "round 2 failed after 1 attempt(s): scripted: cannot write the checkpoint (the disk is full)");
  const v1::Job stored = Stored();
  EXPECT_EQ(stored.state(), v1::JOB_FAILED);
  EXPECT_EQ(stored.error(), job.error());
  EXPECT_EQ(stored.rounds_committed(), 1u);
  EXPECT_EQ(stored.last_round().round(), 1u);
  ASSERT_EQ(Rounds().size(), 1u);
  EXPECT_TRUE(store_.HasCheckpoint(kJobId, 1));
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 2));
  EXPECT_EQ(store_.writes(StateWrite::kCommitRound), 2) << "a failed commit is not retried";
}

TEST_F(RunnerStateFailureTest, TheCheckpointIsWrittenBesideTheEvaluationAndOneNotWrittenFailsTheRound) {
  // The checkpoint's write runs on a thread of its own (beside the evaluation and the
  // encoding), the round's record is committed on the job's thread after it; round 2's
  // checkpoint cannot be written.
  options_.commit_retry_limit = milliseconds(0);
  std::mutex mu;
  std::vector<std::thread::id> write_threads, commit_threads;
  store_.SetWriteHook(StateWrite::kWriteCheckpoint, [this, &mu, &write_threads] {
    std::lock_guard<std::mutex> lock(mu);
    write_threads.push_back(std::this_thread::get_id());
    if (write_threads.size() == 2) {
      store_.FailNextWrites(StateWrite::kWriteCheckpoint, 1, ResourceExhaustedError("scripted: the disk is full"));
    }
  });
  store_.SetWriteHook(StateWrite::kCommitRound, [&mu, &commit_threads] {
    std::lock_guard<std::mutex> lock(mu);
    commit_threads.push_back(std::this_thread::get_id());
  });
  AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(3);
  v1::Job job = Run(spec);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(), "round 2 failed after 1 attempt(s): scripted: the disk is full");
  EXPECT_EQ(Stored().rounds_committed(), 1u);
  EXPECT_TRUE(store_.HasCheckpoint(kJobId, 1));
  EXPECT_FALSE(store_.HasCheckpoint(kJobId, 2));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(write_threads.size(), 2u);
  ASSERT_EQ(commit_threads.size(), 1u) << "round 2's record is never committed without its checkpoint";
  EXPECT_NE(write_threads[0], commit_threads[0]) << "round 1's checkpoint was written on the job's thread";
}

TEST_F(RunnerStateFailureTest, AnEndThatCannotBeWrittenIsRetriedWithDoublingDelaysUntilItIsDurable) {
  options_.data_dir = "/nonexistent/no-dataset-here";  // the job cannot start: it ends FAILED
  store_.FailNextWrites(StateWrite::kUpdateJob, 2, ResourceExhaustedError("scripted: database or disk is full"));
  Submit(SmallSpec(1, 1));
  for (const milliseconds delay : {options_.record_retry_delay, options_.record_retry_delay * 2}) {
    ASSERT_TRUE(AwaitRunnerWaiting());
    EXPECT_EQ(clock_.NextDeadline(), clock_.Now() + delay) << "waits " << delay.count() << " ms before the next try";
    clock_.Advance(delay);
  }
  v1::Job ended = AwaitEnd();
  EXPECT_EQ(ended.state(), v1::JOB_FAILED);
  EXPECT_NE(ended.error().find("no-dataset-here"), std::string::npos) << ended.error();
  const std::string events = Events();
  EXPECT_NE(events.find("cannot record the job's end (failed) at try 1: scripted: database or disk is full; "
                        "retrying in 100 ms"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("at try 2: scripted: database or disk is full; retrying in 200 ms"), std::string::npos)
      << events;
  EXPECT_NE(events.find("the job's end (failed) is recorded, at try 3"), std::string::npos) << events;
  EXPECT_EQ(store_.writes(StateWrite::kUpdateJob), 3);
  EXPECT_EQ(Stored().state(), v1::JOB_FAILED);
  EXPECT_NE(Stored().error().find("no-dataset-here"), std::string::npos) << Stored().error();
}

TEST_F(RunnerStateFailureTest, StoppingWhileTheEndCannotBeWrittenGivesUpAndLeavesTheJobAsLastRecorded) {
  options_.data_dir = "/nonexistent/no-dataset-here";
  store_.FailNextWrites(StateWrite::kUpdateJob, 1000, UnavailableError("scripted: the store is gone"));
  Submit(SmallSpec(1, 1));
  ASSERT_TRUE(AwaitRunnerWaiting());  // between tries
  StopRunner();  // ends the wait at once; one last try, then it gives up
  EXPECT_EQ(store_.writes(StateWrite::kUpdateJob), 2);
  EXPECT_NE(Events().find("not retried: the coordinator is stopping"), std::string::npos) << Events();
  EXPECT_EQ(Stored().state(), v1::JOB_PENDING) << "resumed at the next start, where it fails again";
}

TEST_F(RunnerStateFailureTest, ARecordThatCannotBeRewrittenAfterItsCommitLeavesTheRoundCommitted) {
  store_.FailNextWrites(StateWrite::kUpdateRoundRecord, 1, InternalError("scripted: the row is locked"));
  AddWorker("w1", Always(FakeAction::Upload()));
  v1::Job job = Run(SmallSpec(1, 1));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  EXPECT_EQ(store_.writes(StateWrite::kUpdateRoundRecord), 1);
  EXPECT_EQ(Stored().rounds_committed(), 1u);
  ASSERT_EQ(Rounds().size(), 1u);
  EXPECT_EQ(Rounds()[0].clients_reported(), 1u);
}

TEST_F(RunnerStateFailureTest, ASeatThatCannotBeSavedFailsTheJobNamingTheRound) {
  store_.FailNextWrites(StateWrite::kSaveSeat, 1, ResourceExhaustedError("scripted: the disk is full"));
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  v1::Job job = Run(SmallSpec(1, 1));
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(), "round 1 failed after 1 attempt(s): scripted: the disk is full");
  EXPECT_TRUE(w1.turns().empty()) << "no task before the seats are saved";
  EXPECT_TRUE(store_.LoadSeats(kJobId)->empty());
}

TEST_F(RunnerStateFailureTest, AnInitialModelThatCannotBeSavedFailsTheJobBeforeAnyRound) {
  store_.FailNextWrites(StateWrite::kSaveInitialModel, 1, ResourceExhaustedError("scripted: the disk is full"));
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  v1::Job job = Run(SmallSpec(1, 1));
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_NE(job.error().find("scripted: the disk is full"), std::string::npos) << job.error();
  EXPECT_TRUE(w1.turns().empty());
  EXPECT_EQ(Stored().state(), v1::JOB_FAILED);
}

// A store that answers UNAVAILABLE while the job is prepared is tried again after a delay; a
// cancel in that delay ends the job CANCELLED at once (the user was answered Ok), not FAILED
// after the retries.
TEST_F(RunnerStateFailureTest, ACancelWhilePreparingIsRetriedEndsTheJobCancelled) {
  store_.FailNextWrites(StateWrite::kSaveInitialModel, 1000, UnavailableError("scripted: the store is busy"));
  Submit(SmallSpec(1, 1));
  ASSERT_TRUE(AwaitRunnerWaiting()) << "the runner waits before trying again";
  EXPECT_GE(store_.writes(StateWrite::kSaveInitialModel), 1);
  runner()->Cancel();
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED) << job.error();
  EXPECT_EQ(job.error(), "cancelled by the user");
  EXPECT_EQ(Stored().state(), v1::JOB_CANCELLED);
}

}  // namespace
}  // namespace tessera::server
