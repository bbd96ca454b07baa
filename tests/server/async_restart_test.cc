// The asynchronous driver across a coordinator's restart and over a long run: no task number
// is handed out twice (numbers are reserved in the job's row before they are sent), an update
// for a task of the previous process is refused as such, and a job whose every task ends
// without an update folded fails instead of handing out tasks for ever.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <string>

#include "async_driver_fixture.h"

namespace tessera::server {
namespace {

class AsyncRestartTest : public AsyncDriverTest {
 protected:
  // The turn of `worker` for task `number` (the first one), or an empty one.
  static FakeTurn TurnOf(const FakeWorker& worker, uint32_t number) {
    for (const auto& turn : worker.turns()) {
      if (turn.task.round() == number) return turn;
    }
    ADD_FAILURE() << worker.name() << " had no turn of task " << number;
    return FakeTurn();
  }
  // The largest task number `worker` received.
  static uint32_t LargestNumber(const FakeWorker& worker) {
    uint32_t largest = 0;
    for (const auto& task : worker.received()) {
      if (task.has_train()) largest = std::max(largest, task.train().round());
    }
    return largest;
  }
};

// A job stopped before its first step (no step's record tells how many tasks it handed out)
// and resumed numbers its tasks past every number the previous process handed out: the
// worker's update for its old task (same worker, same version 0) is refused as a task of
// before the resume, not taken as the answer to its new task, and not held against it.
TEST_F(AsyncRestartTest, AJobResumedBeforeItsFirstStepNeverHandsOutANumberAgain) {
  auto old_gate = std::make_shared<Gate>();
  // The resumed job's task waits for the old update's verdict: its update would otherwise
  // make the job's one step, and the old update could find the job ended.
  auto new_gate = std::make_shared<Gate>();
  OpenAtExit open_new_gate(new_gate);
  auto turns = std::make_shared<std::atomic<int>>(0);
  FakeWorker& a = AddWorker("a", [old_gate, new_gate, turns](const v1::TrainTask&) {
    if ((*turns)++ == 0) return FakeAction::UploadLate(old_gate).UploadToCurrentRunner();
    return FakeAction::UploadLate(new_gate);
  });
  Submit(AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1));
  const v1::TrainTask old_task = TrainTask(a, 0);
  EXPECT_EQ(old_task.model_version(), 0u);
  ASSERT_TRUE(old_gate->AwaitReached());  // downloaded from the first process
  StopRunner();
  const v1::Job stored = Stored();
  EXPECT_EQ(stored.rounds_committed(), 0u);
  EXPECT_GE(stored.async_tasks_reserved(), old_task.round()) << "sent before it was reserved";

  StartRunner(stored);
  const v1::TrainTask new_task = TrainTask(a, 1);
  EXPECT_EQ(new_task.model_version(), 0u);
  EXPECT_GT(new_task.round(), stored.async_tasks_reserved());
  EXPECT_NE(new_task.round(), old_task.round());
  // The old task's update arrives at the resumed coordinator, and is refused as such.
  old_gate->Open();
  ASSERT_TRUE(a.Await([&](const auto&, const std::vector<FakeTurn>& done) {
    return !done.empty() && done.front().finished;
  }));
  const FakeTurn old_turn = a.turns().front();
  ASSERT_EQ(old_turn.task.round(), old_task.round());
  ASSERT_TRUE(old_turn.admitted.has_value());
  EXPECT_FALSE(old_turn.admitted->ok());
  EXPECT_NE(old_turn.admitted->message().find("task " + std::to_string(old_task.round()) +
                                              " was handed out before the coordinator resumed the job"),
            std::string::npos)
      << old_turn.admitted->ToString();
  EXPECT_EQ(UpdatesRejected("a"), 0u) << "an update that crossed the restart is no fault of its worker's";
  new_gate->Open();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].async_step().updates_folded(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "a").outcome(), "accepted");
  EXPECT_EQ(UpdatesRejected("a"), 0u);
}

// After a step, tasks that fail are replaced at once: more than a step's worth of work
// (concurrency + K) can be handed out after the last step. A job resumed then still numbers
// its tasks past all of them, and the update of the last one is refused.
TEST_F(AsyncRestartTest, AJobResumedAfterManyReplacedTasksNeverHandsOutANumberAgain) {
  constexpr int kFailures = 4;  // more than concurrency 1 + K 1
  auto old_gate = std::make_shared<Gate>();
  auto new_gate = std::make_shared<Gate>();  // the resumed job's task waits for the old update's verdict
  OpenAtExit open_new_gate(new_gate);
  auto turns = std::make_shared<std::atomic<int>>(0);
  FakeWorker& a = AddWorker("a", [old_gate, new_gate, turns](const v1::TrainTask&) {
    const int turn = (*turns)++;
    if (turn == 0) return FakeAction::Upload();  // step 1
    if (turn <= kFailures) return FakeAction::Fail("its data is unreadable (test)");
    if (turn == kFailures + 1) return FakeAction::UploadLate(old_gate).UploadToCurrentRunner();
    return FakeAction::UploadLate(new_gate);  // step 2, after the resume
  });
  v1::JobSpec spec = AsyncSpec(1, 2, /*buffer=*/1, /*max_staleness=*/1);
  spec.set_max_round_attempts(10);  // the failures do not end the job
  Submit(spec);
  ASSERT_TRUE(AwaitCommitted(1));
  for (int i = 1; i <= kFailures; ++i) {
    const v1::TrainTask failed = TrainTask(a, i);
    ASSERT_TRUE(a.AwaitFinished(failed.round(), 1)) << "failure " << i;
    ASSERT_TRUE(AwaitRunnerWaiting());
    clock_.Advance(std::chrono::milliseconds(1100));  // past the failed client's rest
  }
  const v1::TrainTask old_task = TrainTask(a, kFailures + 1);
  ASSERT_TRUE(old_gate->AwaitReached());
  StopRunner();
  const uint32_t handed_out = LargestNumber(a);
  EXPECT_EQ(handed_out, old_task.round());
  const v1::Job stored = Stored();
  ASSERT_EQ(stored.rounds_committed(), 1u);
  const uint32_t counted = stored.last_round().async_step().tasks_sent();
  EXPECT_GT(handed_out, counted + 1 + 1) << "more than a step's worth of tasks after the step";
  EXPECT_GE(stored.async_tasks_reserved(), handed_out);

  StartRunner(stored);
  const v1::TrainTask new_task = TrainTask(a, kFailures + 2);
  EXPECT_EQ(new_task.model_version(), 1u);
  EXPECT_GT(new_task.round(), handed_out);
  const uint64_t rejected = UpdatesRejected("a");  // its failures count against it
  old_gate->Open();
  ASSERT_TRUE(a.AwaitFinished(old_task.round(), 1));
  EXPECT_EQ(UpdatesRejected("a"), rejected) << "an update that crossed the restart is no fault of its worker's";
  const FakeTurn old_turn = TurnOf(a, old_task.round());
  ASSERT_TRUE(old_turn.admitted.has_value());
  EXPECT_NE(old_turn.admitted->message().find("was handed out before the coordinator resumed the job"),
            std::string::npos)
      << old_turn.admitted->ToString();
  new_gate->Open();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  EXPECT_GE(end.async_tasks_reserved(), LargestNumber(a));
}

// A job resumed from an older checkpoint than its last step's (the newest one damaged) is at
// a version older than the tasks the previous process handed out: the update for one of
// those is refused as a task of before the resume, as any other is, not as trained from a
// version newer than the current one, and is not held against its worker.
TEST_F(AsyncRestartTest, AnUpdateFromBeforeAResumeToAnOlderCheckpointIsNoFaultOfItsWorker) {
  auto old_gate = std::make_shared<Gate>();
  auto new_gate = std::make_shared<Gate>();  // the resumed job's tasks wait for the old update's verdict
  OpenAtExit open_new_gate(new_gate);
  auto turns = std::make_shared<std::atomic<int>>(0);
  FakeWorker& a = AddWorker("a", [old_gate, new_gate, turns](const v1::TrainTask&) {
    const int turn = (*turns)++;
    if (turn == 0) return FakeAction::Upload();  // step 1
    if (turn == 1) return FakeAction::UploadLate(old_gate).UploadToCurrentRunner();
    return FakeAction::UploadLate(new_gate);
  });
  Submit(AsyncSpec(1, 2, /*buffer=*/1, /*max_staleness=*/1));
  ASSERT_TRUE(AwaitCommitted(1));
  const v1::TrainTask old_task = TrainTask(a, 1);
  EXPECT_EQ(old_task.model_version(), 1u);
  ASSERT_TRUE(old_gate->AwaitReached());  // downloaded version 1 from the first process
  StopRunner();
  const v1::Job stored = Stored();
  ASSERT_EQ(stored.rounds_committed(), 1u);
  ASSERT_TRUE(store_.DamageCheckpoint(kJobId, 1));

  StartRunner(stored);
  const v1::TrainTask new_task = TrainTask(a, 2);
  EXPECT_EQ(new_task.model_version(), 0u) << "not resumed from the checkpoint before the damaged one";
  EXPECT_GT(new_task.round(), old_task.round());
  const uint64_t rejected = UpdatesRejected("a");
  old_gate->Open();
  ASSERT_TRUE(a.AwaitFinished(old_task.round(), 1));
  const FakeTurn old_turn = TurnOf(a, old_task.round());
  ASSERT_TRUE(old_turn.admitted.has_value());
  EXPECT_FALSE(old_turn.admitted->ok());
  EXPECT_NE(old_turn.admitted->message().find("task " + std::to_string(old_task.round()) +
                                              " was handed out before the coordinator resumed the job"),
            std::string::npos)
      << old_turn.admitted->ToString();
  EXPECT_EQ(UpdatesRejected("a"), rejected) << "an update that crossed the restart is no fault of its worker's";
  new_gate->Open();
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
}

// A task number is reserved in the job's row before it is sent: when the row cannot be
// written, no task goes out and the job fails saying why.
TEST_F(AsyncRestartTest, NoTaskIsSentBeforeItsNumberIsReserved) {
  FakeWorker& a = AddWorker("a", Always(FakeAction::Upload()));
  // The job's row is written as the job starts running (a failure there is only logged), then
  // for the first block of task numbers.
  store_.FailNextWrites(StateWrite::kUpdateJob, 2, UnavailableError("the disk is gone (test)"));
  Submit(AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1));
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_FAILED);
  EXPECT_NE(end.error().find("reserving task numbers 1 to"), std::string::npos) << end.error();
  EXPECT_NE(end.error().find("the disk is gone (test)"), std::string::npos) << end.error();
  EXPECT_EQ(LargestNumber(a), 0u) << "a task was sent before its number was reserved";
}

// Every update refused (here: not finite): after max_round_attempts x concurrency tasks in a
// row ended without an update folded, the job fails naming the step, the count and the last
// refusal, instead of handing out tasks for ever.
TEST_F(AsyncRestartTest, AJobWhoseEveryUpdateIsRefusedFails) {
  FakeWorker& a = AddWorker("a", Always(FakeAction::Upload(std::nanf(""))));
  FakeWorker& b = AddWorker("b", Always(FakeAction::Upload(std::nanf(""))));
  v1::JobSpec spec = AsyncSpec(2, 1, /*buffer=*/1, /*max_staleness=*/1);
  spec.set_max_round_attempts(2);  // 2 x concurrency 2: the fourth ending in a row fails the job
  Submit(spec);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.AwaitFinished(TrainTask(a, i).round(), 1));
    ASSERT_TRUE(b.AwaitFinished(TrainTask(b, i).round(), 1));
    if (i == 0) {
      ASSERT_TRUE(AwaitRunnerWaiting());
      clock_.Advance(std::chrono::milliseconds(1100));  // past the refused clients' rest
    }
  }
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_FAILED);
  EXPECT_NE(end.error().find("step 1: 4 tasks in a row ended without an update folded (max_round_attempts 2 x "
                             "concurrency 2); the last: task "),
            std::string::npos)
      << end.error();
  EXPECT_NE(end.error().find("rejected: "), std::string::npos) << end.error();
  EXPECT_NE(end.error().find("finite"), std::string::npos) << end.error();
  EXPECT_EQ(a.turns().size() + b.turns().size(), 4u) << "tasks were handed out after the bound";
}

// The bound reached while a task is still out: no new task is handed out, and the task out
// may still fold, which lets the job go on.
TEST_F(AsyncRestartTest, ATaskStillOutWhenTheBoundIsReachedMayStillFold) {
  FakeWorker& failing = AddWorker("failing", Always(FakeAction::Fail("its data is unreadable (test)")));
  GatedTasks good_tasks;
  FakeWorker& good = AddWorker("good", good_tasks.Script());
  v1::JobSpec spec = AsyncSpec(2, 1, /*buffer=*/1, /*max_staleness=*/1);
  spec.set_max_round_attempts(1);  // 1 x concurrency 2: two failures in a row reach the bound
  Submit(spec);
  TrainTask(good, 0);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(failing.AwaitFinished(TrainTask(failing, i).round(), 1));
    ASSERT_TRUE(AwaitRunnerWaiting());
    clock_.Advance(std::chrono::milliseconds(1100));  // past the failed client's rest
  }
  ASSERT_TRUE(AwaitRunnerWaiting());  // it looked for idle clients past the rest, and sent none
  good_tasks.Open(0);
  const v1::Job end = AwaitEnd();
  EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
  EXPECT_EQ(failing.turns().size(), 2u) << "a task was handed out past the bound";
  const auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "good").outcome(), "accepted");
}

}  // namespace
}  // namespace tessera::server
