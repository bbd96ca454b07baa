// The asynchronous driver (FedBuff): staleness weights, the buffered mean, and server steps
// driven by fake workers of different speeds on a ManualClock. A worker's speed is a gate
// per task that the test opens: nothing sleeps, and the order of events is the test's.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "async_driver_fixture.h"
#include "proto/record_bounds.h"
#include "server/jobs/async_driver.h"
#include "server/strategy/aggregation.h"
#include "test_strategies.h"

namespace tessera::server {
namespace {

v1::AsyncSpec Polynomial(double exponent) {
  v1::AsyncSpec spec;
  spec.set_staleness_weighting("polynomial");
  spec.set_staleness_exponent(exponent);
  return spec;
}

TEST(StalenessWeightTest, PolynomialIsOneOverOnePlusStalenessToTheExponent) {
  EXPECT_DOUBLE_EQ(StalenessWeight(Polynomial(0.5), 0), 1.0);
  EXPECT_DOUBLE_EQ(StalenessWeight(Polynomial(0.5), 3), 0.5);        // 1 / sqrt(4)
  EXPECT_DOUBLE_EQ(StalenessWeight(Polynomial(0.5), 8), 1.0 / 3.0);  // 1 / sqrt(9)
  EXPECT_DOUBLE_EQ(StalenessWeight(Polynomial(1.0), 4), 0.2);        // 1 / 5
  EXPECT_DOUBLE_EQ(StalenessWeight(Polynomial(2.0), 1), 0.25);       // 1 / 2^2
  EXPECT_DOUBLE_EQ(StalenessWeight(Polynomial(0.0), 1000), 1.0);     // a = 0 weighs all alike
}

TEST(StalenessWeightTest, ConstantIsOne) {
  v1::AsyncSpec spec;
  spec.set_staleness_weighting("constant");
  EXPECT_DOUBLE_EQ(StalenessWeight(spec, 0), 1.0);
  EXPECT_DOUBLE_EQ(StalenessWeight(spec, 50), 1.0);
}

// The sample-weighted mean with staleness factors: sum(n_i s_i d_i) / sum(n_i).
TEST(StalenessWeightTest, TheMeanScalesEachDeltaAndKeepsTheSamplesAsWeights) {
  const TensorSet layout = {{"w", {2}, {0.0f, 0.0f}}};
  auto aggregate = OpenAggregate(AggregationOptions{}, layout);
  const TensorSet fresh = {{"w", {2}, {1.0f, 2.0f}}};
  const TensorSet stale = {{"w", {2}, {4.0f, -2.0f}}};
  ClientUpdate a{.client = "a", .samples = 300, .delta = &fresh, .scale = 1.0};
  ClientUpdate b{.client = "b", .samples = 100, .delta = &stale, .scale = 0.5};
  ASSERT_TRUE(aggregate->Fold(a).ok());
  ASSERT_TRUE(aggregate->Fold(b).ok());
  std::vector<double> got;
  ASSERT_TRUE(aggregate->Combine([&](size_t, const std::vector<double>& delta) { got = delta; }).ok());
  // (300 * 1 * 1 + 100 * 0.5 * 4) / 400 = 1.25; (300 * 2 + 100 * 0.5 * -2) / 400 = 1.25.
  ASSERT_EQ(got.size(), 2u);
  EXPECT_DOUBLE_EQ(got[0], 1.25);
  EXPECT_DOUBLE_EQ(got[1], 1.25);
  ClientUpdate bad{.client = "c", .samples = 1, .delta = &fresh, .scale = 1.5};
  EXPECT_FALSE(aggregate->Fold(bad).ok());
  EXPECT_EQ(aggregate->updates(), 2u);
}

// Asynchronous tasks do not offer to take trained models, and refuse one, naming the field.
TEST_F(AsyncDriverTest, TakesDeltasOnly) {
  FakeWorker& w = AddWorker("w1", [](const v1::TrainTask&) {
    return FakeAction::Upload().WithTamper([](v1::UpdateHeader* h, TensorSet*) { h->set_trained_weights(true); });
  });
  Submit(AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1));
  EXPECT_FALSE(TrainTask(w, 0).takes_trained_weights());
  ASSERT_TRUE(w.Await([](const std::vector<v1::Task>&, const std::vector<FakeTurn>& turns) {
    return !turns.empty() && turns[0].admitted.has_value();
  }));
  const Status admitted = *w.turns()[0].admitted;
  EXPECT_EQ(admitted.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(admitted.message().find("field 'trained_weights': asynchronous rounds take deltas only"), std::string::npos)
      << admitted.message();
}

// Two fast clients, a slow one whose update is two versions stale (folded with 1/sqrt(3)), and
// one slower still, whose task is cancelled as too stale and whose late upload is refused.
TEST_F(AsyncDriverTest, FastClientsContributeMoreAndStaleUpdatesAreWeightedOrRefused) {
  GatedTasks fast1, fast2, slow, slowest;
  FakeWorker& f1 = AddWorker("fast-1", fast1.Script());
  FakeWorker& f2 = AddWorker("fast-2", fast2.Script());
  FakeWorker& s1 = AddWorker("slow", slow.Script());
  FakeWorker& s2 = AddWorker("slowest", slowest.Script());
  Submit(AsyncSpec(4, 4, /*buffer=*/2, /*max_staleness=*/2));
  // Four tasks on version 0, numbered 1 to 4.
  std::set<uint32_t> numbers;
  for (FakeWorker* w : {&f1, &f2, &s1, &s2}) {
    const v1::TrainTask task = TrainTask(*w, 0);
    EXPECT_EQ(task.model_version(), 0u);
    EXPECT_EQ(task.attempt(), 1u);
    numbers.insert(task.round());
  }
  EXPECT_EQ(numbers, (std::set<uint32_t>{1, 2, 3, 4}));

  // fast-1 reports: one update buffered; it trains again on version 0.
  fast1.Open(0);
  EXPECT_EQ(TrainTask(f1, 1).model_version(), 0u);
  EXPECT_EQ(TrainTask(f1, 1).round(), 5u);
  // fast-2 reports: the buffer is full, step 1 is made; fast-2 trains on version 1.
  fast2.Open(0);
  EXPECT_EQ(TrainTask(f2, 1).model_version(), 1u);
  ASSERT_TRUE(AwaitCommitted(1));

  // fast-1's second update was trained on version 0: one version stale.
  fast1.Open(1);
  EXPECT_EQ(TrainTask(f1, 2).model_version(), 1u);
  fast2.Open(1);
  EXPECT_EQ(TrainTask(f2, 2).model_version(), 2u);
  ASSERT_TRUE(AwaitCommitted(2));

  // slow's update of version 0 is two versions stale: still within max_staleness.
  slow.Open(0);
  EXPECT_EQ(TrainTask(s1, 1).model_version(), 2u);
  fast1.Open(2);  // version 1: one stale; step 3
  ASSERT_TRUE(AwaitCommitted(3));
  // Version 3 makes slowest's task (version 0) three versions stale: cancelled.
  ASSERT_TRUE(s2.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), IsTaskCancel);
  }));
  EXPECT_NE(s2.cancels().front().reason().find("too stale"), std::string::npos) << s2.cancels().front().reason();
  slowest.Open(0);  // its upload comes anyway, and is refused before its tensors are read
  ASSERT_TRUE(s2.AwaitFinished(4, 1));
  const FakeTurn late = s2.turns().front();
  ASSERT_TRUE(late.admitted.has_value());
  EXPECT_EQ(late.admitted->code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.admitted->message().find("too stale"), std::string::npos) << late.admitted->ToString();
  EXPECT_NE(late.admitted->message().find("max_staleness is 2"), std::string::npos) << late.admitted->ToString();

  fast2.Open(2);  // version 2, one stale
  slow.Open(1);   // version 2, one stale: step 4, the last
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  EXPECT_EQ(end.rounds_committed(), 4u);

  const auto folded = FoldedByWorker();
  ASSERT_EQ(folded.count("fast-1"), 1u);
  ASSERT_EQ(folded.count("slow"), 1u);
  EXPECT_EQ(folded.at("fast-1").size(), 3u);
  EXPECT_EQ(folded.at("fast-2").size(), 3u);
  EXPECT_EQ(folded.at("slow").size(), 2u);
  EXPECT_EQ(folded.count("slowest"), 0u);
  // Each update's staleness and weight, as the record keeps them.
  const auto& f1_folds = folded.at("fast-1");
  EXPECT_EQ(f1_folds[0].step, 1u);
  EXPECT_EQ(f1_folds[0].staleness, 0u);
  EXPECT_DOUBLE_EQ(f1_folds[0].weight, 1.0);
  EXPECT_EQ(f1_folds[1].step, 2u);
  EXPECT_EQ(f1_folds[1].staleness, 1u);
  EXPECT_DOUBLE_EQ(f1_folds[1].weight, 1.0 / std::sqrt(2.0));
  const auto& slow_folds = folded.at("slow");
  EXPECT_EQ(slow_folds[0].step, 3u);
  EXPECT_EQ(slow_folds[0].staleness, 2u);
  EXPECT_DOUBLE_EQ(slow_folds[0].weight, 1.0 / std::sqrt(3.0));

  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 4u);
  for (const auto& record : rounds) {
    ASSERT_TRUE(record.has_async_step()) << record.round();
    EXPECT_EQ(record.async_step().updates_folded(), 2u) << record.round();
    EXPECT_EQ(record.clients_reported(), 2u);
  }
  EXPECT_DOUBLE_EQ(rounds[2].async_step().mean_staleness(), 1.5);  // slow's 2 and fast-1's 1
  EXPECT_EQ(rounds[2].async_step().max_staleness(), 2u);
  // The cancelled task is in the record of the step that followed its cancellation.
  EXPECT_EQ(ReportOf(rounds[3], "slowest").outcome().rfind("dropped: too stale", 0), 0u)
      << ReportOf(rounds[3], "slowest").outcome();

  // Step 3's model is step 2's plus the staleness-weighted mean of its deltas (every delta is
  // 0.001 everywhere, 100 samples each): slow's two versions stale, fast-1's one,
  // 0.001 x (1/sqrt(3) + 1/sqrt(2)) / 2. (The store keeps the newest three checkpoints.)
  auto v2 = store_.LoadCheckpoint(kJobId, 2);
  auto v3 = store_.LoadCheckpoint(kJobId, 3);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  ASSERT_TRUE(v3.ok()) << v3.status().ToString();
  const double expected = 0.001 * (1.0 / std::sqrt(3.0) + 1.0 / std::sqrt(2.0)) / 2.0;
  EXPECT_NEAR((*v3)[0].values[0] - (*v2)[0].values[0], expected, 1e-6);
  EXPECT_GT(std::abs((*v3)[0].values[0] - (*v2)[0].values[0] - 0.001), 1e-5);  // not the unweighted mean
}

// An update that arrives while a step is being committed goes into the step after it: one
// version more stale than the version the job is still on says, and weighted so.
TEST_F(AsyncDriverTest, AnUpdateFoldedWhileAStepIsCommittedCountsThatStep) {
  GatedTasks a_tasks, b_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", b_tasks.Script());
  // Step 1's checkpoint write waits for the test; later writes go through.
  HeldThread hold;
  store_.SetWriteHook(StateWrite::kWriteCheckpoint, hold.Hook(/*first_only=*/true));
  Submit(AsyncSpec(2, 3, /*buffer=*/1, /*max_staleness=*/1));
  TrainTask(a, 0);
  const v1::TrainTask b_first = TrainTask(b, 0);
  EXPECT_EQ(b_first.model_version(), 0u);
  a_tasks.Open(0);  // fills the buffer: step 1 is applied, and its commit waits
  ASSERT_TRUE(hold.AwaitEntered()) << "step 1 was never committed";
  b_tasks.Open(0);  // trained on version 0; it goes into step 2, made on version 1
  const bool b_done = b.AwaitFinished(b_first.round(), 1);
  hold.Release();
  ASSERT_TRUE(b_done);
  a_tasks.OpenAll();
  b_tasks.OpenAll();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto folded = FoldedByWorker();
  ASSERT_EQ(folded.count("b"), 1u);
  const Folded& first = folded.at("b").front();
  EXPECT_EQ(first.step, 2u);
  EXPECT_EQ(first.staleness, 1u);
  EXPECT_DOUBLE_EQ(first.weight, 1.0 / std::sqrt(2.0));
}

// A job cancelled while an upload sits between its check and its fold: its workers are told,
// the upload is refused when it goes on, and the job ends (its strategy released) only after.
TEST_F(AsyncDriverTest, AnUploadBeingCheckedWhenTheJobIsCancelledIsRefusedBeforeTheJobEnds) {
  HeldThread hold;
  options_.async_checked_hook = hold.Hook();
  GatedTasks a_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  Submit(AsyncSpec(1, 3, /*buffer=*/1, /*max_staleness=*/1));
  const v1::TrainTask first = TrainTask(a, 0);
  a_tasks.Open(0);  // its update fills the buffer once folded
  ASSERT_TRUE(hold.AwaitEntered()) << "the upload was never checked";
  runner()->Cancel();
  EXPECT_TRUE(a.Await([](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), IsTaskCancel);
  })) << "the cancelled job's worker is told";
  hold.Release();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_CANCELLED) << end.error();
  EXPECT_EQ(Stored().rounds_committed(), 0u) << "nothing was folded into a step";
  ASSERT_TRUE(a.AwaitFinished(first.round(), 1));
  const auto turns = a.turns();
  ASSERT_FALSE(turns.empty());
  ASSERT_TRUE(turns.front().verdict.has_value());
  EXPECT_NE(turns.front().verdict->message().find("the job ended while the update was checked"), std::string::npos)
      << turns.front().verdict->ToString();
}

// A task whose update is being checked when its deadline passes is not ended by it (its update
// has come): the job's thread goes on waiting for what is still ahead, instead of waking at
// once, again and again, for a deadline already past until the fold is done.
TEST_F(AsyncDriverTest, ADeadlinePassingWhileItsUpdateIsCheckedLeavesTheJobWaiting) {
  HeldThread hold;
  options_.async_checked_hook = hold.Hook();
  GatedTasks a_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  v1::JobSpec spec = AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1);
  spec.set_round_deadline_ms(1000);
  Submit(spec);
  TrainTask(a, 0);
  a_tasks.Open(0);
  ASSERT_TRUE(hold.AwaitEntered()) << "the upload was never checked";
  clock_.Advance(std::chrono::milliseconds(2000));  // past the task's deadline, its update in hand
  const bool waiting = AwaitRunnerWaiting();
  hold.Release();
  EXPECT_TRUE(waiting) << "the job's thread never slept while the update was checked";
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "a").outcome(), "accepted");
}

// A coordinator stopped mid-job resumes at the last committed version: its buffered update is
// lost, task numbers go on past those the previous process reserved, and an update for a task
// of the previous process is refused.
TEST_F(AsyncDriverTest, ResumesFromTheLastCommittedVersionAndNumbersTasksOn) {
  GatedTasks a_tasks, b_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", b_tasks.Script());
  Submit(AsyncSpec(2, 3, /*buffer=*/2, /*max_staleness=*/5));
  TrainTask(a, 0);
  TrainTask(b, 0);
  a_tasks.Open(0);
  TrainTask(a, 1);
  b_tasks.Open(0);
  ASSERT_TRUE(AwaitCommitted(1));
  const v1::TrainTask b_second = TrainTask(b, 1);
  EXPECT_EQ(b_second.model_version(), 1u);
  a_tasks.Open(1);  // buffered (version 0, one stale), never applied
  TrainTask(a, 2);
  StopRunner();
  const v1::Job stored = Stored();
  EXPECT_EQ(stored.rounds_committed(), 1u);
  // Tasks 1, 2 and a's second, 3, were handed out when step 1 was made; b's 4 and a's 5 after.
  EXPECT_EQ(stored.last_round().async_step().tasks_sent(), 3u);
  // Reserved in the job's row before the first task was sent: a block of 1024 numbers.
  EXPECT_EQ(stored.async_tasks_reserved(), 1024u);

  StartRunner(stored);
  // New tasks on version 1, numbered past every number the previous process reserved: 1025
  // and 1026.
  const v1::TrainTask a_resumed = TrainTask(a, 3);
  EXPECT_EQ(a_resumed.model_version(), 1u);
  EXPECT_EQ(a_resumed.round(), 1025u);
  EXPECT_EQ(TrainTask(b, 2).round(), 1026u);
  // b's update for its task of the previous process (task 4, version 1) is refused.
  b_tasks.Open(1);
  ASSERT_TRUE(b.AwaitFinished(b_second.round(), 1));
  // Refused wherever it meets the resumed coordinator first (its download, as the task is not
  // one the new process handed out, or its upload's admission), or cancelled: never taken.
  bool seen = false, taken = false;
  for (const auto& turn : b.turns()) {
    if (turn.task.round() != b_second.round()) continue;
    seen = true;
    taken = taken || (turn.admitted && turn.admitted->ok() && turn.verdict && turn.verdict->ok());
  }
  EXPECT_TRUE(seen);
  EXPECT_FALSE(taken) << "the previous process's task went through";
  a_tasks.OpenAll();
  b_tasks.OpenAll();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 3u);
  // No update of the previous process is in the steps after the restart: step 2 folds two
  // updates trained on the resumed version 1 (a's version-0 update buffered before the stop
  // was lost with the buffer).
  for (size_t i = 1; i < rounds.size(); ++i) EXPECT_GE(rounds[i].async_step().tasks_sent(), 1026u);
  EXPECT_EQ(rounds[1].async_step().updates_folded(), 2u);
  EXPECT_EQ(rounds[1].async_step().max_staleness(), 0u);
  for (const auto& report : rounds[1].workers()) {
    if (report.outcome() == "accepted") {
      EXPECT_EQ(report.staleness(), 0u) << report.worker_id();
    }
  }
}

// A step's record lists every update it folded, however many tasks ended unfolded before it:
// a client failing task after task (each failure rests it for a second) fills the record's
// list of the others, which is bounded; the folded update is still named, with its staleness.
TEST_F(AsyncDriverTest, AStepsRecordNamesItsFoldedUpdatesWhateverEndedBeforeThem) {
  constexpr size_t kFailures = 300;  // more than a step's record lists of the tasks not folded
  FakeWorker& failing = AddWorker("failing", Always(FakeAction::Fail("its data is unreadable")));
  GatedTasks good_tasks;
  FakeWorker& good = AddWorker("good", good_tasks.Script());
  // Concurrency 3 (of which the two workers take two) and 100 attempts: the job's bound on
  // tasks in a row ended without a fold, 300, lets every failure be replaced.
  v1::JobSpec spec = AsyncSpec(3, 1, /*buffer=*/1, /*max_staleness=*/1);
  spec.set_max_round_attempts(100);
  spec.set_round_deadline_ms(24 * 3600 * 1000);  // the good task outlives every failure
  Submit(spec);
  TrainTask(good, 0);
  for (size_t i = 0; i < kFailures; ++i) {
    const v1::TrainTask task = TrainTask(failing, i);
    ASSERT_TRUE(failing.AwaitFinished(task.round(), 1)) << "failure " << i;
    ASSERT_TRUE(AwaitRunnerWaiting());
    clock_.Advance(std::chrono::milliseconds(1100));  // past the failed client's rest
  }
  good_tasks.Open(0);
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  const v1::RoundRecord& step = rounds[0];
  EXPECT_EQ(step.async_step().updates_folded(), 1u);
  EXPECT_GE(step.async_step().tasks_dropped(), kFailures);
  EXPECT_EQ(step.clients_reported(), 1u);
  EXPECT_LT(static_cast<size_t>(step.workers_size()), kFailures) << "the failures listed are bounded";
  const v1::WorkerRoundReport folded = ReportOf(step, "good");
  EXPECT_EQ(folded.outcome(), "accepted");
  EXPECT_EQ(folded.staleness(), 0u);
  EXPECT_DOUBLE_EQ(folded.staleness_weight(), 1.0);
}

// A step's record holds a worker's long failure message cut to its bound, as a round's does
// (proto/record_bounds.h): the records of a step of thousands of such clients stay readable.
TEST_F(AsyncDriverTest, AStepsRecordCutsALongFailureToItsBound) {
  FakeWorker& failing = AddWorker("failing", Always(FakeAction::Fail(std::string(1 << 20, 'x'))));
  GatedTasks good_tasks;
  FakeWorker& good = AddWorker("good", good_tasks.Script());
  v1::JobSpec spec = AsyncSpec(2, 1, /*buffer=*/1, /*max_staleness=*/1);
  spec.set_round_deadline_ms(24 * 3600 * 1000);  // the good task outlives the failure
  Submit(spec);
  TrainTask(good, 0);
  const v1::TrainTask task = TrainTask(failing, 0);
  ASSERT_TRUE(failing.AwaitFinished(task.round(), 1));
  ASSERT_TRUE(AwaitRunnerWaiting());
  good_tasks.Open(0);
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  const v1::WorkerRoundReport failed = ReportOf(rounds[0], "failing");
  EXPECT_LE(failed.outcome().size(), wire::kMaxOutcomeBytes);
  EXPECT_EQ(failed.outcome().rfind("failed: xxx", 0), 0u) << failed.outcome().substr(0, 64);
  EXPECT_EQ(ReportOf(rounds[0], "good").outcome(), "accepted");
}

// Time that passes while the job's thread is between its look at the clients' rests and its
// sleep is not slept through: here the clock passes a failed client's rest while the thread
// is held sending another client's task, and the rested client gets its next task at once.
TEST_F(AsyncDriverTest, TimePassingWhileATaskIsSentEndsTheNextWait) {
  FakeWorker& failing = AddWorker("failing", Always(FakeAction::Fail("its data is unreadable")));
  GatedTasks good_tasks, other_tasks;
  FakeWorker& good = AddWorker("good", good_tasks.Script());
  FakeWorker& other = AddWorker("other", other_tasks.Script());
  v1::JobSpec spec = AsyncSpec(3, 1, /*buffer=*/2, /*max_staleness=*/1);
  spec.set_round_deadline_ms(24 * 3600 * 1000);  // no task ends at its deadline here
  Submit(spec);
  TrainTask(good, 0);
  TrainTask(other, 0);
  const v1::TrainTask failed = TrainTask(failing, 0);
  ASSERT_TRUE(failing.AwaitFinished(failed.round(), 1));  // it rests for a second from now
  // other's update fills half the buffer and frees other: the job's thread, which finds
  // failing still resting, hands other a new task and is held sending it.
  auto held = std::make_shared<Gate>();
  OpenAtExit release(held);
  other.HoldNextDelivery(held);
  other_tasks.Open(0);
  ASSERT_TRUE(held->AwaitReached()) << "other's second task was never sent";
  clock_.Advance(std::chrono::milliseconds(1100));  // past failing's rest
  held->Open();
  EXPECT_EQ(TrainTask(failing, 1).model_version(), 0u) << "the rested client got no new task";
  good_tasks.OpenAll();
  other_tasks.OpenAll();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
}

// The job's strategy, whose `throw_at`-th BeginRound (counting from 1) throws, as a model-sized
// allocation that fails would.
class ThrowingBeginRound final : public Strategy {
 public:
  ThrowingBeginRound(std::unique_ptr<Strategy> inner, int throw_at) : inner_(std::move(inner)), throw_at_(throw_at) {}
  std::string_view name() const override { return inner_->name(); }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    if (++calls_ == throw_at_) throw std::bad_alloc();
    return inner_->BeginRound(global);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    return inner_->Finish(global, aggregate);
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  std::unique_ptr<Strategy> inner_;
  const int throw_at_;
  mutable std::atomic<int> calls_{0};
};

// The one update `worker` had refused for `expected`, its client's next task taken up: what
// is thrown between an update's check and its fold refuses that update, and leaves neither its
// task nor a buffer waiting for a fold that never ends. The job then makes its step.

// Thrown after the update's check (here by the test's hook, as by a clipped copy that cannot
// be allocated): the update is refused, its client rests, trains again and makes the step.
TEST_F(AsyncDriverTest, AnExceptionAfterTheCheckRefusesTheUpdateAndItsClientTrainsAgain) {
  auto thrown = std::make_shared<std::atomic<bool>>(false);
  options_.async_checked_hook = [thrown] {
    if (!thrown->exchange(true)) throw std::runtime_error("no memory left (test)");
  };
  FakeWorker& a = AddWorker("a", Always(FakeAction::Upload()));
  Submit(AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1));
  ExpectRefusedAndTrainedAgain(a, "checking it failed: no memory left (test)");
}

// The next step's buffer cannot be opened when an update fills the one before: the update is
// refused, the open buffer is not sealed, and the next update fills it.
TEST_F(AsyncDriverTest, ANextBufferThatCannotBeOpenedRefusesTheUpdateThatFillsTheOpenOne) {
  options_.strategy_factory = WrapStrategy<ThrowingBeginRound>(/*throw_at=*/2);  // the first upload's
  FakeWorker& a = AddWorker("a", Always(FakeAction::Upload()));
  Submit(AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1));
  ExpectRefusedAndTrainedAgain(a, "opening the next step's buffer failed: std::bad_alloc");
}

// The job's strategy, whose Finish throws, as a model-sized copy that fails would.
class ThrowingFinish final : public Strategy {
 public:
  explicit ThrowingFinish(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return inner_->BeginRound(global);
  }
  Result<StrategyStep> Finish(const TensorSet&, const RoundAggregate&) const override {
    throw std::runtime_error("the step cannot be made (test)");
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  std::unique_ptr<Strategy> inner_;
};

// An exception that ends the job's thread (here from its strategy's Finish) ends the job
// failed only once no upload is inside the driver: the tasks still out are cancelled, and an
// upload between its check and its fold is refused before the job releases its strategy.
TEST_F(AsyncDriverTest, AnExceptionInTheJobsThreadEndsTheJobOnlyOnceNoUploadIsInsideTheDriver) {
  options_.strategy_factory = WrapStrategy<ThrowingFinish>();
  HeldThread hold;
  options_.async_checked_hook = hold.Hook(/*first_only=*/true);
  GatedTasks a_tasks, b_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", b_tasks.Script());
  Submit(AsyncSpec(2, 1, /*buffer=*/1, /*max_staleness=*/1));
  TrainTask(a, 0);
  const v1::TrainTask b_first = TrainTask(b, 0);
  b_tasks.Open(0);
  ASSERT_TRUE(hold.AwaitEntered()) << "b's upload was never checked";
  a_tasks.Open(0);  // fills the buffer; the step's Finish throws
  EXPECT_TRUE(b.Await([&](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(),
                       [&](const v1::Task& t) { return IsTaskCancel(t) && t.cancel().round() == b_first.round(); });
  })) << "b's task was never cancelled";
  EXPECT_EQ(Stored().state(), v1::JOB_RUNNING) << "the job ended while b's upload was inside its driver";
  hold.Release();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_FAILED);
  EXPECT_NE(end.error().find("the step cannot be made (test)"), std::string::npos) << end.error();
  ASSERT_TRUE(b.AwaitFinished(b_first.round(), 1));
  const auto turns = b.turns();
  ASSERT_FALSE(turns.empty());
  ASSERT_TRUE(turns.front().verdict.has_value());
  EXPECT_NE(turns.front().verdict->message().find("the job ended while the update was checked"), std::string::npos)
      << turns.front().verdict->ToString();
}

// A step whose model is not finite is discarded, not committed, and max_round_attempts of them
// in a row end the job. Its message names the first eight of the step's updates and counts the
// rest: a buffer may hold 10,000, and the message becomes the job's error.
TEST_F(AsyncDriverTest, ADiscardedStepNamesEightOfItsUpdatesAndCountsTheRest) {
  options_.strategy_factory = WrapStrategy<AmplifiedFedAvg>();  // every update amplified past float
  // Each worker answers its first task only: the step's ten updates come from ten workers.
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) {
    names.push_back("w" + std::to_string(i));
    AddWorker(names.back(), [first = std::make_shared<std::atomic<bool>>(true)](const v1::TrainTask&) {
      return first->exchange(false) ? FakeAction::Upload(10.0f) : FakeAction::Hang();
    });
  }
  v1::JobSpec spec = AsyncSpec(10, 1, /*buffer=*/10, /*max_staleness=*/1);
  spec.set_max_round_attempts(1);
  Submit(spec);
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_FAILED);
  const std::string& error = end.error();
  EXPECT_NE(error.find("not committed, its 10 buffered updates ('"), std::string::npos) << error;
  EXPECT_NE(error.find(" and 2 more) discarded; 1 steps in a row discarded"), std::string::npos) << error;
  size_t named = 0;
  for (const std::string& name : names) named += error.find("'" + name + "'") != std::string::npos ? 1 : 0;
  EXPECT_EQ(named, 8u) << error;
  EXPECT_EQ(Stored().rounds_committed(), 0u);
}

}  // namespace
}  // namespace tessera::server
