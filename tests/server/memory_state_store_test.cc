// MemoryStateStore's failure injection: the next writes of one kind fail with the status
// given and change nothing, other kinds go through, a hook holds a write mid-way, and every
// attempt is counted.
#include "server/state/memory_state_store.h"

#include <gtest/gtest.h>

#include <future>

namespace tessera::server {
namespace {

constexpr std::chrono::milliseconds kWaitLimit{60000};  // reached only when a test fails

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-1-abc");
  job.set_state(v1::JOB_RUNNING);
  return job;
}

TensorSet Model(float v) { return {{"w", {2}, {v, v}}}; }

TEST(MemoryStateStoreTest, InjectedFailuresFailTheNextWritesOfTheirKindThenStop) {
  MemoryStateStore store;
  v1::Job job = RunningJob();
  ASSERT_TRUE(store.InsertJob(job).ok());
  store.FailNextWrites(StateWrite::kUpdateJob, 2, ResourceExhaustedError("scripted: the disk is full"));
  job.set_state(v1::JOB_FAILED);
  EXPECT_EQ(store.UpdateJob(job).message(), "scripted: the disk is full");
  EXPECT_EQ(store.UpdateJob(job).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store.GetJob(job.id())->state(), v1::JOB_RUNNING) << "a failed write changes nothing";
  // Another kind of write goes through meanwhile.
  EXPECT_TRUE(store.SaveSeat(job.id(), "w1", 0).ok());
  EXPECT_TRUE(store.UpdateJob(job).ok());
  EXPECT_EQ(store.GetJob(job.id())->state(), v1::JOB_FAILED);
  EXPECT_EQ(store.writes(StateWrite::kUpdateJob), 3);
  EXPECT_EQ(store.writes(StateWrite::kCommitRound), 0);
}

TEST(MemoryStateStoreTest, AFailedCommitLeavesNoRecordNoCheckpointAndTheOldJobRow) {
  MemoryStateStore store;
  v1::Job job = RunningJob();
  ASSERT_TRUE(store.InsertJob(job).ok());
  store.FailNextWrites(StateWrite::kCommitRound, 1, InternalError("scripted: commit lost"));
  v1::RoundRecord record;
  record.set_round(1);
  job.set_rounds_committed(1);
  EXPECT_EQ(store.CommitRound(job, record, Model(1)).message(), "scripted: commit lost");
  EXPECT_EQ(store.GetJob(job.id())->rounds_committed(), 0u);
  EXPECT_TRUE(store.ListRounds(job.id())->empty());
  EXPECT_FALSE(store.HasCheckpoint(job.id(), 1));
  ASSERT_TRUE(store.CommitRound(job, record, Model(1)).ok());
  EXPECT_EQ(store.GetJob(job.id())->rounds_committed(), 1u);
  EXPECT_TRUE(store.HasCheckpoint(job.id(), 1));
}

TEST(MemoryStateStoreTest, AFailedCheckpointWriteLeavesNothingToCommitNotEvenAnEarlierWrite) {
  MemoryStateStore store;
  v1::Job job = RunningJob();
  ASSERT_TRUE(store.InsertJob(job).ok());
  v1::RoundRecord record;
  record.set_round(1);
  job.set_rounds_committed(1);
  ASSERT_TRUE(store.WriteCheckpoint(job.id(), 1, Model(1)).ok());
  store.FailNextWrites(StateWrite::kWriteCheckpoint, 1, ResourceExhaustedError("scripted: the disk is full"));
  EXPECT_EQ(store.WriteCheckpoint(job.id(), 1, Model(2)).message(), "scripted: the disk is full");
  EXPECT_EQ(store.CommitWrittenRound(job, record).code(), StatusCode::kFailedPrecondition)
      << "the first write is not what the round's latest attempt wrote";
  EXPECT_EQ(store.GetJob(job.id())->rounds_committed(), 0u);
  EXPECT_FALSE(store.HasCheckpoint(job.id(), 1));
}

TEST(MemoryStateStoreTest, AWriteHookHoldsTheWriteUntilItReturns) {
  MemoryStateStore store;
  v1::Job job = RunningJob();
  ASSERT_TRUE(store.InsertJob(job).ok());
  std::promise<void> reached, open;
  std::shared_future<void> opened = open.get_future().share();
  store.SetWriteHook(StateWrite::kCommitRound, [&reached, opened] {
    reached.set_value();
    opened.wait();
  });
  v1::RoundRecord record;
  record.set_round(1);
  job.set_rounds_committed(1);
  auto commit = std::async(std::launch::async, [&] { return store.CommitRound(job, record, Model(1)); });
  struct OpenAtExit {
    std::promise<void>* open;
    bool opened = false;
    ~OpenAtExit() {
      if (!opened) open->set_value();
    }
  } open_at_exit{&open};
  ASSERT_EQ(reached.get_future().wait_for(kWaitLimit), std::future_status::ready);
  EXPECT_EQ(store.GetJob(job.id())->rounds_committed(), 0u) << "held before anything is written";
  v1::Job other = job;
  other.set_rounds_committed(0);
  other.set_error("written while the commit is held");
  EXPECT_TRUE(store.UpdateJob(other).ok()) << "other writes are not held";
  open.set_value();
  open_at_exit.opened = true;
  ASSERT_EQ(commit.wait_for(kWaitLimit), std::future_status::ready);
  EXPECT_TRUE(commit.get().ok());
  EXPECT_EQ(store.ListRounds(job.id())->size(), 1u);
}

TEST(MemoryStateStoreTest, EveryKindOfWriteCanBeMadeToFail) {
  MemoryStateStore store;
  const v1::Job job = RunningJob();
  v1::RoundRecord record;
  record.set_round(1);
  v1::WorkerStatus worker;
  worker.set_worker_id("w1");
  const std::vector<std::pair<StateWrite, std::function<Status()>>> writes = {
      {StateWrite::kInsertJob, [&] { return store.InsertJob(job); }},
      {StateWrite::kUpdateJob, [&] { return store.UpdateJob(job); }},
      {StateWrite::kWriteCheckpoint, [&] { return store.WriteCheckpoint(job.id(), 1, Model(1)); }},
      {StateWrite::kCommitRound, [&] { return store.CommitRound(job, record, Model(1)); }},
      {StateWrite::kSaveInitialModel, [&] { return store.SaveInitialModel(job.id(), Model(0)); }},
      {StateWrite::kUpdateRoundRecord, [&] { return store.UpdateRoundRecord(job, record); }},
      {StateWrite::kRewindJob, [&] { return store.RewindJob(job); }},
      {StateWrite::kSaveWorker, [&] { return store.SaveWorker(worker); }},
      {StateWrite::kBindWorkerName, [&] { return store.BindWorkerName("w1", "token:a").status(); }},
      {StateWrite::kSaveSeat, [&] { return store.SaveSeat(job.id(), "w1", 0); }},
      {StateWrite::kRequestCancel, [&] { return store.RequestCancel(job.id()); }},
      {StateWrite::kForgetWorker, [&] { return store.ForgetWorker("w1").status(); }},
      {StateWrite::kDeleteJob, [&] { return store.DeleteJob(job.id()).status(); }},  // last: the job goes
  };
  ASSERT_EQ(writes.size(), kStateWriteKinds);
  for (const auto& [kind, write] : writes) {
    store.FailNextWrites(kind, 1, UnavailableError("scripted " + std::string(StateWriteName(kind))));
    EXPECT_EQ(write().message(), "scripted " + std::string(StateWriteName(kind)));
    EXPECT_TRUE(write().ok()) << StateWriteName(kind);
  }
}

}  // namespace
}  // namespace tessera::server
