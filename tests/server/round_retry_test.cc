// Round retries, on a ManualClock: an attempt that ends short of min_clients (too few
// reports by the deadline or lost before it, or too few workers ready within the wait) is retried as a new
// attempt with the next attempt number, up to max_round_attempts; an aggregated model that is
// not finite is retried without the clients blamed for it, who are back in the next round.
#include <gtest/gtest.h>

#include <algorithm>

#include "job_runner_fixture.h"
#include "test_strategies.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

class RoundRetryTest : public JobRunnerFixture {};

// The (round, attempt) of every train task `worker` received, in order.
std::vector<std::pair<uint32_t, uint32_t>> TrainTasks(const FakeWorker& worker) {
  std::vector<std::pair<uint32_t, uint32_t>> tasks;
  for (const auto& turn : worker.turns()) tasks.emplace_back(turn.task.round(), turn.task.attempt());
  return tasks;
}

TEST_F(RoundRetryTest, ARoundShortOfReportsIsRetriedAsANewAttemptAndTheStragglerIsCancelledForItsAttemptOnly) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Upload()));
  // w3 misses attempt 1's deadline and answers attempt 2.
  FakeWorker& w3 = AddWorker("w3", [](const v1::TrainTask& t) {
    return t.attempt() == 1 ? FakeAction::Hang() : FakeAction::Upload();
  });
  Submit(SmallSpec(3, 3, 60000));
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  ASSERT_TRUE(w2.AwaitFinished(1, 1));
  ASSERT_TRUE(w3.AwaitTrainTask(1, 1));
  clock_.Advance(milliseconds(60000));  // attempt 1's deadline
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].attempt(), 2u);
  EXPECT_EQ(rounds[0].clients_reported(), 3u);
  for (const FakeWorker* w : {&w1, &w2, &w3}) {
    EXPECT_EQ(TrainTasks(*w), (std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {1, 2}})) << w->name();
  }
  ASSERT_TRUE(w3.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), IsTaskCancel);
  }));
  ASSERT_EQ(w3.cancels().size(), 1u);
  EXPECT_EQ(w3.cancels()[0].job_id(), kJobId);
  EXPECT_EQ(w3.cancels()[0].round(), 1u);
  EXPECT_EQ(w3.cancels()[0].attempt(), 1u) << "a cancel must name the attempt it ends";
  EXPECT_TRUE(w1.cancels().empty()) << "w1 reported in time";
  // w1 and w2 were accepted in both attempts, but only attempt 2 committed: one round each.
  for (const v1::WorkerStatus& status : registry_.List()) {
    EXPECT_EQ(status.rounds_completed(), 1u) << status.worker_id();
    EXPECT_EQ(status.updates_rejected(), 0u) << status.worker_id();
  }
  EXPECT_NE(Events().find("round 1 attempt 1: 2 of 3 selected clients reported by the deadline; min_clients is 3; "
                          "retrying"),
            std::string::npos)
      << Events();
}

TEST_F(RoundRetryTest, AnAttemptLeftShortByALostWorkerBeforeItsDeadlineSaysSoAndNamesTheWorker) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Vanish()));  // lost mid-round
  v1::JobSpec spec = SmallSpec(2, 2, 60000);
  spec.set_max_round_attempts(1);
  Submit(spec);
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  ASSERT_TRUE(w2.AwaitFinished(1, 1));
  // The runner looks for lost workers every liveness_check_interval, far before the deadline:
  // w2 is lost at its first look or at one a liveness_check_interval on.
  ASSERT_TRUE(AdvanceUntilEnded(options_.liveness_check_interval));
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_EQ(job.error(),
            "round 1 failed after 1 attempt(s): round 1 attempt 1: 1 of 2 selected clients reported; the round "
            "closed before its deadline with none left to wait for: w2 (dropped: worker 'w2' lost (no heartbeat, "
            "disconnected or restarted)); min_clients is 2");
  EXPECT_EQ(job.error().find("by the deadline"), std::string::npos) << "its deadline was 60 s away";
}

TEST_F(RoundRetryTest, TooFewWorkersReadyWithinTheWaitIsRetriedAsANewAttempt) {
  options_.worker_wait_timeout = milliseconds(30000);
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  Submit(SmallSpec(2, 2));
  // Selection looks at the registry every worker_poll_interval, on the clock.
  ASSERT_TRUE(AwaitRunnerWaiting());
  EXPECT_EQ(clock_.NextDeadline(), clock_.Now() + options_.worker_poll_interval);
  clock_.Advance(milliseconds(30001));
  ASSERT_TRUE(AwaitEvent("round 1: only 1 clients ready, min_clients is 2; retrying")) << Events();
  // Attempt 2 waits for workers in turn; a second one joins, and is seen at the next look.
  ASSERT_TRUE(AwaitRunnerWaiting());
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Upload()));
  clock_.Advance(options_.worker_poll_interval);
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].attempt(), 2u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  // Attempt 1 never opened: no task carries it.
  EXPECT_EQ(TrainTasks(w1), (std::vector<std::pair<uint32_t, uint32_t>>{{1, 2}}));
  EXPECT_EQ(TrainTasks(w2), (std::vector<std::pair<uint32_t, uint32_t>>{{1, 2}}));
}

TEST_F(RoundRetryTest, TooFewReportsEveryAttemptFailsTheJobNamingTheRound) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Hang()));
  v1::JobSpec spec = SmallSpec(2, 2, 60000);
  spec.set_max_round_attempts(2);
  Submit(spec);
  for (uint32_t attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(w1.AwaitFinished(1, attempt));
    ASSERT_TRUE(w2.AwaitTrainTask(1, attempt));
    clock_.Advance(milliseconds(60000));
  }
  v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_NE(job.error().find("round 1 failed after 2 attempt(s)"), std::string::npos) << job.error();
  ASSERT_TRUE(w2.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::count_if(received.begin(), received.end(), IsTaskCancel) == 2;
  }));
  EXPECT_NE(job.error().find("min_clients is 2"), std::string::npos) << job.error();
  EXPECT_EQ(Stored().state(), v1::JOB_FAILED);
  EXPECT_TRUE(Rounds().empty());
  ASSERT_EQ(w2.cancels().size(), 2u);
  EXPECT_EQ(w2.cancels()[0].attempt(), 1u);
  EXPECT_EQ(w2.cancels()[1].attempt(), 2u);
}

TEST_F(RoundRetryTest, AModelThatIsNotFiniteIsRetriedWithoutTheBlamedClientWhoIsBackInTheNextRound) {
  options_.strategy_factory = WrapStrategy<AmplifiedFedAvg>();
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::UploadUnchanged()));
  // Within the norm bound (6,370 values of 10: norm about 800), but amplified past float.
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Upload(10.0f)));
  v1::JobSpec spec = SmallSpec(2, 1);
  spec.set_rounds(2);
  v1::Job job = Run(spec);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  for (const auto& record : rounds) {
    EXPECT_EQ(record.attempt(), 2u);
    ASSERT_EQ(record.workers_size(), 1);
    EXPECT_EQ(record.workers(0).worker_id(), "w1");
  }
  // Left out of round 1's attempt 2, selected again in round 2.
  EXPECT_EQ(TrainTasks(w2), (std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {2, 1}}));
  EXPECT_EQ(TrainTasks(w1), (std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {1, 2}, {2, 1}, {2, 2}}));
  const std::string events = Events();
  EXPECT_NE(events.find("round 1 attempt 1: the aggregated model"), std::string::npos) << events;
  EXPECT_NE(events.find("not committed; left out of the round's next attempts: worker 'w2' (the largest update"),
            std::string::npos)
      << events;
  for (uint32_t round : {1u, 2u}) {
    auto model = store_.LoadCheckpoint(kJobId, round);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    EXPECT_TRUE(CheckFinite(*model, "committed model").ok());
  }
}

}  // namespace
}  // namespace tessera::server
