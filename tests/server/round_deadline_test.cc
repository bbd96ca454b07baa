// A round's deadline and the workers that do not make it, on a ManualClock: at the deadline
// the pending workers are cancelled (job, round, attempt) and recorded as dropped, and the
// round commits with its quorum; an upload after it is refused and changes nothing; a worker
// whose channel closes is dropped as lost without waiting for the deadline; a channel
// reopened in the same session keeps the worker in its round, a new session does not.
//
// The same-session reopen is also tested in the registry alone
// (worker_registry_test.cc: AClosedTaskChannelLosesAWorkerAtOnceWhateverItsHeartbeats) and
// over gRPC (stream_scale_test.cc: AChannelReopenedInTheSameSessionKeepsTheWorkerAlive);
// here it is the round that must keep the worker.
#include <gtest/gtest.h>

#include <algorithm>

#include "job_runner_fixture.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

class RoundDeadlineTest : public JobRunnerFixture {
 protected:
  // The global model of `round` minus that of `round - 1`, element 0 of each tensor.
  std::vector<float> Step(uint32_t round) {
    auto before = store_.LoadCheckpoint(kJobId, round - 1);
    auto after = store_.LoadCheckpoint(kJobId, round);
    EXPECT_TRUE(before.ok() && after.ok());
    std::vector<float> step;
    if (!before.ok() || !after.ok()) return step;
    for (size_t i = 0; i < after->size(); ++i) step.push_back((*after)[i].values[0] - (*before)[i].values[0]);
    return step;
  }

  static bool HasCancel(const FakeWorker& worker) {
    return worker.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
      return std::any_of(received.begin(), received.end(), IsTaskCancel);
    });
  }
};

TEST_F(RoundDeadlineTest, AtTheDeadlineThePendingWorkerIsCancelledAndTheRoundCommitsWithTheQuorum) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload(0.5f)));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Upload(0.5f)));
  FakeWorker& w3 = AddWorker("w3", Always(FakeAction::Hang()));
  Submit(SmallSpec(3, 2, 60000));
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  ASSERT_TRUE(w2.AwaitFinished(1, 1));
  ASSERT_TRUE(w3.AwaitTrainTask(1, 1));
  // A millisecond before the deadline the round is still open, and w3 still awaited.
  ASSERT_TRUE(AwaitRunnerWaiting());
  clock_.Advance(milliseconds(59999));
  ASSERT_TRUE(AwaitRunnerWaiting());
  EXPECT_TRUE(runner()->SelectedRound("w3", "a check").ok());
  EXPECT_TRUE(w3.cancels().empty());
  clock_.Advance(milliseconds(1));
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_TRUE(HasCancel(w3));
  ASSERT_EQ(w3.cancels().size(), 1u);
  const v1::CancelTask cancel = w3.cancels()[0];
  EXPECT_EQ(cancel.job_id(), kJobId);
  EXPECT_EQ(cancel.round(), 1u);
  EXPECT_EQ(cancel.attempt(), 1u);
  EXPECT_EQ(cancel.reason(), "the round's deadline passed");
  EXPECT_TRUE(w1.cancels().empty());
  EXPECT_TRUE(w2.cancels().empty());
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].attempt(), 1u);
  EXPECT_EQ(rounds[0].clients_selected(), 3u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  EXPECT_EQ(ReportOf(rounds[0], "w3").outcome(), "dropped: deadline passed");
  // The quorum was there from the start; the round waited the whole deadline for w3.
  EXPECT_DOUBLE_EQ(rounds[0].latency().straggler_wait_ms(), 60000);
  for (float step : Step(1)) EXPECT_FLOAT_EQ(step, 0.5f);
}

TEST_F(RoundDeadlineTest, AnUploadAfterTheDeadlineIsRefusedAndChangesNothing) {
  auto late = std::make_shared<Gate>();
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload(0.25f)));
  // Round 1: w2 downloads, then uploads only after the deadline; round 2: it hangs.
  FakeWorker& w2 = AddWorker("w2", [late](const v1::TrainTask& t) {
    return t.round() == 1 ? FakeAction::UploadLate(late, 100.0f) : FakeAction::Hang();
  });
  v1::JobSpec spec = SmallSpec(2, 1, 60000);
  spec.set_rounds(2);
  Submit(spec);
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  ASSERT_TRUE(late->AwaitReached());
  clock_.Advance(milliseconds(60000));
  // Round 2 is open (w2 hangs in it) when the late upload for round 1 comes.
  ASSERT_TRUE(w1.AwaitFinished(2, 1));
  ASSERT_TRUE(w2.AwaitTrainTask(2, 1));
  late->Open();
  ASSERT_TRUE(w2.AwaitFinished(1, 1));
  const FakeTurn turn = w2.turns()[0];
  ASSERT_TRUE(turn.downloaded->ok());
  EXPECT_EQ(turn.admitted->code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(turn.admitted->message().find("it is for a past round (round 1 attempt 1); the open round is 2 attempt 1"),
            std::string::npos)
      << turn.admitted->message();
  EXPECT_FALSE(turn.verdict.has_value());
  clock_.Advance(milliseconds(60000));
  ASSERT_EQ(AwaitEnd().state(), v1::JOB_SUCCEEDED);
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(ReportOf(rounds[0], "w2").outcome(), "dropped: deadline passed");
  EXPECT_EQ(ReportOf(rounds[1], "w2").outcome(), "dropped: deadline passed") << "round 2 does not count it either";
  for (uint32_t round : {1u, 2u}) {
    for (float step : Step(round)) EXPECT_FLOAT_EQ(step, 0.25f) << "round " << round;
  }
}

TEST_F(RoundDeadlineTest, AWorkerWhoseChannelClosesIsDroppedAsLostWithoutWaitingForTheDeadline) {
  auto held = std::make_shared<Gate>();
  AddWorker("w1", Always(FakeAction::UploadLate(held)));  // keeps the round open
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Vanish()));
  Submit(SmallSpec(2, 1, 60000));
  ASSERT_TRUE(held->AwaitReached());
  ASSERT_TRUE(w2.AwaitFinished(1, 1));
  // The runner looks for lost workers every liveness_check_interval.
  ASSERT_TRUE(AwaitRunnerWaiting());
  clock_.Advance(options_.liveness_check_interval);
  ASSERT_TRUE(AwaitRunnerWaiting());
  held->Open();
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "w1").outcome(), "accepted");
  EXPECT_EQ(ReportOf(rounds[0], "w2").outcome(), "dropped: worker 'w2' lost (no heartbeat, disconnected or restarted)");
  EXPECT_DOUBLE_EQ(rounds[0].latency().total_ms(), options_.liveness_check_interval.count())
      << "closed when w1 reported, not at the deadline";
  EXPECT_TRUE(w2.cancels().empty()) << "a lost worker is not pending at the close";
}

TEST_F(RoundDeadlineTest, AChannelReopenedInTheSameSessionKeepsTheWorkerInItsRound) {
  auto held = std::make_shared<Gate>();
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::UploadLate(held)));
  Submit(SmallSpec(2, 2, 60000));
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  ASSERT_TRUE(held->AwaitReached());  // w2 has its model and trains
  // Its stream looked dead to it: it opens another channel, and the old one's close comes late.
  ASSERT_TRUE(w2.ReopenChannel().ok());
  ASSERT_TRUE(AwaitRunnerWaiting());
  clock_.Advance(options_.liveness_check_interval);
  ASSERT_TRUE(AwaitRunnerWaiting());  // it has looked for lost workers, and waits again
  EXPECT_TRUE(runner()->SelectedRound("w2", "a check").ok()) << "w2 was dropped from its round";
  held->Open();
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "w2").outcome(), "accepted");
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
}

TEST_F(RoundDeadlineTest, ARejoinInANewSessionLosesTheWorkersPlaceInItsRound) {
  auto held1 = std::make_shared<Gate>();
  auto held2 = std::make_shared<Gate>();
  AddWorker("w1", Always(FakeAction::UploadLate(held1)));  // keeps the round open
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::UploadLate(held2)));
  Submit(SmallSpec(2, 1, 60000));
  ASSERT_TRUE(held1->AwaitReached());
  ASSERT_TRUE(held2->AwaitReached());
  ASSERT_TRUE(w2.Rejoin().ok());  // a restarted worker: its work of the old session is lost
  ASSERT_TRUE(AwaitRunnerWaiting());
  clock_.Advance(options_.liveness_check_interval);
  ASSERT_TRUE(AwaitRunnerWaiting());
  EXPECT_FALSE(runner()->SelectedRound("w2", "a check").ok()) << "w2 kept its place";
  held1->Open();
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "w2").outcome(), "dropped: worker 'w2' lost (no heartbeat, disconnected or restarted)");
  held2->Open();
  ASSERT_TRUE(w2.AwaitFinished(1, 1));
  EXPECT_EQ(w2.turns()[0].admitted->code(), StatusCode::kFailedPrecondition) << w2.turns()[0].admitted->ToString();
}

}  // namespace
}  // namespace tessera::server
