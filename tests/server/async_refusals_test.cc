// The asynchronous driver's refusals and failures around a fold: an update too stale to be
// folded (on arrival, or found so after its check), a fold that fails, and an exception while
// a folded update's report is made. Each leaves no task in flight and no step short of its
// updates.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include "async_driver_fixture.h"
#include "test_strategies.h"

namespace tessera::server {
namespace {

// The job's strategy, whose first fold (of any buffer) fails, as an aggregate that cannot take
// the update would; the aggregate is left as it was.
class FailingFirstFold final : public Strategy {
 public:
  explicit FailingFirstFold(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return std::make_unique<Aggregate>(inner_->BeginRound(global), failed_);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    return inner_->Finish(global, *static_cast<const Aggregate&>(aggregate).inner);
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  struct Aggregate final : RoundAggregate {
    Aggregate(std::unique_ptr<RoundAggregate> a, std::shared_ptr<std::atomic<bool>> f)
        : inner(std::move(a)), failed(std::move(f)) {}
    Status Fold(const ClientUpdate& update) override {
      if (!failed->exchange(true)) return InternalError("the fold failed (test)");
      return inner->Fold(update);
    }
    uint64_t updates() const override { return inner->updates(); }
    std::unique_ptr<RoundAggregate> inner;
    std::shared_ptr<std::atomic<bool>> failed;
  };

  std::unique_ptr<Strategy> inner_;
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
};

class AsyncRefusalsTest : public AsyncDriverTest {
 protected:
  // Whether `worker` was sent a cancel of task `number`.
  static bool CancelledTask(const FakeWorker& worker, uint32_t number) {
    for (const auto& cancel : worker.cancels()) {
      if (cancel.round() == number) return true;
    }
    return false;
  }
};

// b's update reaches the coordinator while step 1 is committed: with max_staleness 0 it is too
// stale for step 2. Its task ends with the refusal (not later, as dropped, by the commit), it
// is not held against b, and b is given a new task without resting.
TEST_F(AsyncRefusalsTest, AnUpdateTooStaleOnArrivalEndsItsTaskAndIsNotHeldAgainstItsWorker) {
  GatedTasks a_tasks, b_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", b_tasks.Script());
  HeldThread hold;  // step 1's checkpoint write waits for the test
  store_.SetWriteHook(StateWrite::kWriteCheckpoint, hold.Hook(/*first_only=*/true));
  Submit(AsyncSpec(2, 2, /*buffer=*/1, /*max_staleness=*/0));
  TrainTask(a, 0);
  const v1::TrainTask b_first = TrainTask(b, 0);
  a_tasks.Open(0);  // fills the buffer: step 1 is applied, and its commit waits
  ASSERT_TRUE(hold.AwaitEntered()) << "step 1 was never committed";
  b_tasks.Open(0);
  const bool b_done = b.AwaitFinished(b_first.round(), 1);
  hold.Release();
  ASSERT_TRUE(b_done);
  const FakeTurn refused = b.turns().front();
  ASSERT_TRUE(refused.admitted.has_value());
  EXPECT_NE(refused.admitted->message().find("too stale"), std::string::npos) << refused.admitted->ToString();
  // The clock does not move: b does not rest.
  EXPECT_EQ(TrainTask(b, 1).model_version(), 1u);
  EXPECT_FALSE(CancelledTask(b, b_first.round())) << "b's task was left in flight, and cancelled later";
  EXPECT_EQ(UpdatesRejected("b"), 0u);
  a_tasks.OpenAll();
  const v1::Job end = AwaitEnd();
  b_tasks.OpenAll();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  const std::string outcome = ReportOf(rounds[1], "b").outcome();
  EXPECT_EQ(outcome.rfind("rejected: ", 0), 0u) << outcome;
  EXPECT_NE(outcome.find("too stale"), std::string::npos) << outcome;
  EXPECT_EQ(rounds[1].async_step().updates_refused(), 1u);
  EXPECT_EQ(rounds[1].async_step().tasks_dropped(), 0u);
}

// b's update is admitted, and step 1 is committed while it is checked: it is then too stale.
// b is given a new task without resting, and the refusal is not held against it.
TEST_F(AsyncRefusalsTest, AnUpdateFoundTooStaleAfterItsCheckLetsItsClientTrainAgainAtOnce) {
  HeldThread hold;
  options_.async_checked_hook = hold.Hook(/*first_only=*/true);  // b's upload, after its check
  GatedTasks a_tasks, b_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", b_tasks.Script());
  Submit(AsyncSpec(2, 2, /*buffer=*/1, /*max_staleness=*/0));
  TrainTask(a, 0);
  const v1::TrainTask b_first = TrainTask(b, 0);
  b_tasks.Open(0);
  ASSERT_TRUE(hold.AwaitEntered()) << "b's upload was never checked";
  a_tasks.Open(0);  // step 1
  const bool committed = AwaitCommitted(1);
  hold.Release();
  ASSERT_TRUE(committed);
  ASSERT_TRUE(b.AwaitFinished(b_first.round(), 1));
  const FakeTurn refused = b.turns().front();
  ASSERT_TRUE(refused.verdict.has_value());
  EXPECT_NE(refused.verdict->message().find("too stale"), std::string::npos) << refused.verdict->ToString();
  EXPECT_EQ(TrainTask(b, 1).model_version(), 1u);  // the clock does not move: b does not rest
  EXPECT_EQ(UpdatesRejected("b"), 0u);
  a_tasks.OpenAll();
  const v1::Job end = AwaitEnd();
  b_tasks.OpenAll();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
}

// b's update is admitted on arrival; before it is submitted (its tensors still arriving), a's
// update fills the buffer and step 1 is being applied: with max_staleness 0, b's update is too
// stale for step 2 when it is submitted. Refused as if it had arrived then: its task ends with
// the refusal (not later, cancelled as dropped by the commit), it is not held against b, and b
// is given a new task without resting.
TEST_F(AsyncRefusalsTest, AnUpdateMadeTooStaleWhileItArrivesEndsItsTaskAndIsNotHeldAgainstItsWorker) {
  GatedTasks a_tasks;
  auto b_gate = std::make_shared<Gate>();  // b's first upload, admitted, waits before its submission
  auto b_tasks = std::make_shared<std::atomic<int>>(0);
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", [b_gate, b_tasks](const v1::TrainTask&) {
    FakeAction action = FakeAction::Upload();
    if (b_tasks->fetch_add(1) == 0) action.StopBeforeSubmit(b_gate);
    return action;
  });
  OpenAtExit open_b(b_gate);
  HeldThread hold;  // step 1's checkpoint write waits for the test
  store_.SetWriteHook(StateWrite::kWriteCheckpoint, hold.Hook(/*first_only=*/true));
  Submit(AsyncSpec(2, 2, /*buffer=*/1, /*max_staleness=*/0));
  TrainTask(a, 0);
  const v1::TrainTask b_first = TrainTask(b, 0);
  ASSERT_TRUE(b_gate->AwaitReached()) << "b's update was never admitted";
  a_tasks.Open(0);  // fills the buffer: step 1 is applied, and its commit waits
  ASSERT_TRUE(hold.AwaitEntered()) << "step 1 was never committed";
  b_gate->Open();
  const bool b_done = b.AwaitFinished(b_first.round(), 1);
  hold.Release();
  ASSERT_TRUE(b_done);
  const FakeTurn refused = b.turns().front();
  ASSERT_TRUE(refused.admitted.has_value());
  EXPECT_TRUE(refused.admitted->ok()) << refused.admitted->ToString();
  ASSERT_TRUE(refused.verdict.has_value());
  EXPECT_NE(refused.verdict->message().find("too stale"), std::string::npos) << refused.verdict->ToString();
  // The clock does not move: b does not rest.
  EXPECT_EQ(TrainTask(b, 1).model_version(), 1u);
  EXPECT_FALSE(CancelledTask(b, b_first.round())) << "b's task was left in flight, and cancelled later";
  EXPECT_EQ(UpdatesRejected("b"), 0u);
  a_tasks.OpenAll();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  const std::string outcome = ReportOf(rounds[1], "b").outcome();
  EXPECT_EQ(outcome.rfind("rejected: ", 0), 0u) << outcome;
  EXPECT_NE(outcome.find("too stale"), std::string::npos) << outcome;
  EXPECT_EQ(rounds[1].async_step().tasks_dropped(), 0u);
}

// The fold of the update that filled the buffer (K = 1) fails: its place is free again, and
// the step waits for the client's next update, instead of being made of no update and
// discarded (its record, with the refusal, lost). max_staleness 0: the next update, on the
// same version, is not too stale for the buffer it fills. max_round_attempts 2: one task
// ended without a fold does not reach the job's bound (2 x concurrency 1).
TEST_F(AsyncRefusalsTest, AFoldThatFailsFreesItsPlaceAndTheStepWaitsForItsUpdates) {
  options_.strategy_factory = WrapStrategy<FailingFirstFold>();
  FakeWorker& a = AddWorker("a", Always(FakeAction::Upload()));
  v1::JobSpec spec = AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/0);
  spec.set_max_round_attempts(2);
  Submit(spec);
  ExpectRefusedAndTrainedAgain(a, "the fold failed (test)");
  EXPECT_EQ(Rounds().at(0).clients_reported(), 1u);
}

// The same with K = 2: the step is made of two folded updates, not of one.
TEST_F(AsyncRefusalsTest, AFoldThatFailsInTheOpenBufferLeavesItsPlaceToAnother) {
  options_.strategy_factory = WrapStrategy<FailingFirstFold>();
  GatedTasks a_tasks, b_tasks;
  FakeWorker& a = AddWorker("a", a_tasks.Script());
  FakeWorker& b = AddWorker("b", b_tasks.Script());
  v1::JobSpec spec = AsyncSpec(2, 1, /*buffer=*/2, /*max_staleness=*/1);
  Submit(spec);
  const v1::TrainTask a_first = TrainTask(a, 0);
  TrainTask(b, 0);
  a_tasks.Open(0);  // its fold fails
  ASSERT_TRUE(a.AwaitFinished(a_first.round(), 1));
  b_tasks.Open(0);  // one folded update of two
  ASSERT_TRUE(AwaitRunnerWaiting());
  clock_.Advance(std::chrono::milliseconds(1100));  // past a's rest
  TrainTask(a, 1);
  a_tasks.Open(1);  // the second
  const v1::Job end = AwaitEnd();
  b_tasks.OpenAll();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].async_step().updates_folded(), 2u);
  EXPECT_EQ(rounds[0].async_step().updates_refused(), 1u);
}

// Thrown after the update was folded, as its report is made (here by the test's hook): the
// update stays folded and accepted, and its task ends, so that its client trains again.
TEST_F(AsyncRefusalsTest, AnExceptionWhileAFoldedUpdatesReportIsMadeLeavesItsTaskEnded) {
  auto thrown = std::make_shared<std::atomic<bool>>(false);
  options_.async_folded_hook = [thrown] {
    if (!thrown->exchange(true)) throw std::runtime_error("no memory left (test)");
  };
  FakeWorker& a = AddWorker("a", Always(FakeAction::Upload()));
  Submit(AsyncSpec(1, 2, /*buffer=*/1, /*max_staleness=*/1));
  const v1::TrainTask first = TrainTask(a, 0);
  ASSERT_TRUE(a.AwaitFinished(first.round(), 1));
  const FakeTurn turn = a.turns().front();
  ASSERT_TRUE(turn.verdict.has_value());
  EXPECT_TRUE(turn.verdict->ok()) << turn.verdict->ToString();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  for (const auto& record : rounds) EXPECT_EQ(record.async_step().updates_folded(), 1u) << record.round();
}

// Reports that name another task than the one the worker holds (an older number, or its number
// on another version, as after a restart) leave the worker's task alone: a failure report is
// refused, and a malformed update's refusal ends nothing. The worker's own update is then
// taken.
TEST_F(AsyncRefusalsTest, AReportOfAnotherTaskLeavesTheWorkersTaskAlone) {
  GatedTasks tasks;
  FakeWorker& a = AddWorker("a", tasks.Script());
  Submit(AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1));
  const v1::TrainTask task = TrainTask(a, 0);
  ASSERT_GT(task.round(), 0u);
  v1::UpdateHeader other;
  other.set_job_id(task.job_id());
  other.set_worker_id("a");
  other.set_attempt(1);
  other.set_failure("its data is unreadable");
  // An older task's failure.
  other.set_round(task.round() - 1);
  other.set_base_model_version(task.model_version());
  EXPECT_EQ(runner()->ReportFailure(other).code(), StatusCode::kFailedPrecondition);
  // Its number, on another version: the failure, then a malformed update's refusal.
  other.set_round(task.round());
  other.set_base_model_version(task.model_version() + 1);
  EXPECT_EQ(runner()->ReportFailure(other).code(), StatusCode::kFailedPrecondition);
  other.clear_failure();
  runner()->RejectUpload(other, InvalidArgumentError("a malformed update of another task (test)"));
  tasks.Open(0);
  ASSERT_TRUE(a.AwaitFinished(task.round(), 1));
  const FakeTurn turn = a.turns().front();
  ASSERT_TRUE(turn.verdict.has_value());
  EXPECT_TRUE(turn.verdict->ok()) << turn.verdict->ToString();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].async_step().updates_folded(), 1u);
  EXPECT_EQ(rounds[0].async_step().updates_refused(), 0u);
}

}  // namespace
}  // namespace tessera::server
