// One suite for the StateStore interface (server/state/state_store.h), run on every store: SQLite
// in a temporary directory, and in memory. What the runner and the services rely on: jobs
// numbered and listed in order, rounds committed with their checkpoints, the newest kept and
// a damaged one falling back naming where it was read, rewinding, seats (given back as
// stored, a job holding too many refused), workers, names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "server/state/memory_state_store.h"
#include "server/state/sqlite_state_store.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

// A store under test, and how to damage a checkpoint it holds (as a disk or a bug would).
struct StoreBackend {
  std::string name;
  std::function<std::unique_ptr<StateStore>(const std::filesystem::path& dir)> open;
  std::function<void(StateStore&, const std::filesystem::path& dir, const std::string& job, uint32_t round)> damage;
};

void PrintTo(const StoreBackend& backend, std::ostream* os) { *os << backend.name; }

std::string CheckpointFile(const std::filesystem::path& dir, const std::string& job, uint32_t round) {
  return (dir / "checkpoints" / (job + "-round-" + std::to_string(round) + ".ckpt")).string();
}

const StoreBackend kSqlite{
    "Sqlite",
    [](const std::filesystem::path& dir) -> std::unique_ptr<StateStore> {
      auto store = SqliteStateStore::Open(dir.string());
      EXPECT_TRUE(store.ok()) << store.status().ToString();
      return store.ok() ? std::move(store).value() : nullptr;
    },
    [](StateStore&, const std::filesystem::path& dir, const std::string& job, uint32_t round) {
      std::ofstream(CheckpointFile(dir, job, round), std::ios::trunc) << "TSRCKPT1 but nothing after";
    }};

const StoreBackend kMemory{
    "Memory", [](const std::filesystem::path&) -> std::unique_ptr<StateStore> { return std::make_unique<MemoryStateStore>(); },
    [](StateStore& store, const std::filesystem::path&, const std::string& job, uint32_t round) {
      ASSERT_TRUE(static_cast<MemoryStateStore&>(store).DamageCheckpoint(job, round));
    }};

class StateStoreConformanceTest : public ::testing::TestWithParam<StoreBackend> {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-store-" + GetParam().name);
    store_ = GetParam().open(dir_);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  static TensorSet Model(float v) { return {{"w", {2, 2}, {v, v + 1, v + 2, v + 3}}, {"b", {2}, {v, -v}}}; }

  static v1::Job RunningJob(const std::string& id) {
    v1::Job job;
    job.set_id(id);
    job.set_state(v1::JOB_RUNNING);
    job.mutable_spec()->set_rounds(9);
    return job;
  }

  // Commits rounds 1..`rounds` of `job` (checkpoint r holds Model(r), record r accuracy r/10).
  void CommitRounds(v1::Job* job, uint32_t rounds) {
    ASSERT_TRUE(store_->SaveInitialModel(job->id(), Model(0)).ok());
    for (uint32_t r = 1; r <= rounds; ++r) {
      v1::RoundRecord record;
      record.set_job_id(job->id());
      record.set_round(r);
      record.set_test_accuracy(0.1 * r);
      job->set_rounds_committed(r);
      *job->mutable_last_round() = record;
      ASSERT_TRUE(store_->CommitRound(*job, record, Model(static_cast<float>(r))).ok());
    }
  }

  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
};

TEST_P(StateStoreConformanceTest, JobsAreNumberedListedInOrderAndUpdated) {
  EXPECT_EQ(store_->NextJobNumber().value(), 1u);
  for (const char* id : {"job-1-b", "job-2-a", "job-3-c"}) ASSERT_TRUE(store_->InsertJob(RunningJob(id)).ok());
  EXPECT_EQ(store_->NextJobNumber().value(), 4u);
  const Status twice = store_->InsertJob(RunningJob("job-2-a"));
  EXPECT_EQ(twice.code(), StatusCode::kAlreadyExists) << "a job is inserted once: " << twice.ToString();
  EXPECT_NE(twice.message().find("job-2-a"), std::string::npos) << twice.message();
  auto jobs = store_->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[0].id(), "job-1-b");
  EXPECT_EQ((*jobs)[1].id(), "job-2-a");
  EXPECT_EQ((*jobs)[2].id(), "job-3-c");
  v1::Job failed = RunningJob("job-2-a");
  failed.set_state(v1::JOB_FAILED);
  failed.set_error("round 1 failed");
  ASSERT_TRUE(store_->UpdateJob(failed).ok());
  EXPECT_EQ(store_->GetJob("job-2-a")->state(), v1::JOB_FAILED);
  EXPECT_EQ(store_->GetJob("job-2-a")->error(), "round 1 failed");
  EXPECT_TRUE(store_->UpdateJob(RunningJob("job-9-never")).ok());
  EXPECT_EQ(store_->GetJob("job-9-never").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->ListJobs()->size(), 3u) << "updating a job never inserted inserts nothing";
}

// A job takes one past the largest number stored: the newest job's number, once it is
// deleted, is given again (the coordinator keeps the newest job for that reason); an older
// deleted job's is not. Only a job id is deleted.
TEST_P(StateStoreConformanceTest, AJobTakesOnePastTheLargestNumberStored) {
  for (const char* id : {"job-1-b", "job-2-a", "job-3-c"}) ASSERT_TRUE(store_->InsertJob(RunningJob(id)).ok());
  ASSERT_TRUE(store_->DeleteJob("job-3-c").value());
  EXPECT_EQ(store_->NextJobNumber().value(), 3u);
  ASSERT_TRUE(store_->DeleteJob("job-1-b").value());
  EXPECT_EQ(store_->NextJobNumber().value(), 3u);
  ASSERT_TRUE(store_->InsertJob(RunningJob("job-3-d")).ok());
  EXPECT_EQ(store_->NextJobNumber().value(), 4u);
  auto jobs = store_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[1].id(), "job-3-d");
  EXPECT_EQ(store_->DeleteJob("../job-2-a").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->GetJob("job-2-a").ok());
}

TEST_P(StateStoreConformanceTest, TheNewestJobsAreListedOldestFirstWithTheTotal) {
  for (const char* id : {"job-1-a", "job-2-b", "job-3-c", "job-4-d"}) ASSERT_TRUE(store_->InsertJob(RunningJob(id)).ok());
  auto newest = store_->ListNewestJobs(2);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  ASSERT_EQ(newest->jobs.size(), 2u);
  EXPECT_EQ(newest->jobs[0].id(), "job-3-c");
  EXPECT_EQ(newest->jobs[1].id(), "job-4-d");
  EXPECT_EQ(newest->total, 4u);
  EXPECT_TRUE(newest->damaged.empty());
  EXPECT_EQ(store_->ListNewestJobs(SIZE_MAX)->jobs.size(), 4u);
  EXPECT_TRUE(store_->ListNewestJobs(0)->jobs.empty());
}

TEST_P(StateStoreConformanceTest, ARecordedCancelOutlivesTheJobsOwnWrites) {
  ASSERT_TRUE(store_->InsertJob(RunningJob("job-1-a")).ok());
  ASSERT_TRUE(store_->InsertJob(RunningJob("job-2-b")).ok());
  EXPECT_FALSE(store_->GetJob("job-1-a")->cancel_requested());
  ASSERT_TRUE(store_->RequestCancel("job-1-a").ok());
  ASSERT_TRUE(store_->RequestCancel("job-1-a").ok()) << "asked twice is still one cancel";
  EXPECT_EQ(store_->RequestCancel("job-9-never").code(), StatusCode::kNotFound);
  // The job's thread writes its row from a copy taken before the cancel: the cancel stays.
  ASSERT_TRUE(store_->UpdateJob(RunningJob("job-1-a")).ok());
  EXPECT_TRUE(store_->GetJob("job-1-a")->cancel_requested());
  EXPECT_FALSE(store_->GetJob("job-2-b")->cancel_requested());
  auto jobs = store_->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_TRUE((*jobs)[0].cancel_requested());
  EXPECT_FALSE((*jobs)[1].cancel_requested());
}

// A cancel recorded as the job ended, before its end was written or after, is no cancel
// pending on the ended job: an ended job is given without cancel_requested (a cancel that
// ended it says so by its state), and a job still running keeps it.
TEST_P(StateStoreConformanceTest, AnEndedJobIsGivenWithoutACancelPendingWhenEverItWasRecorded) {
  for (const char* id : {"job-1-a", "job-2-b", "job-3-c"}) ASSERT_TRUE(store_->InsertJob(RunningJob(id)).ok());
  ASSERT_TRUE(store_->RequestCancel("job-1-a").ok());  // recorded, then the job ended otherwise
  v1::Job succeeded = RunningJob("job-1-a");
  succeeded.set_state(v1::JOB_SUCCEEDED);
  succeeded.set_cancel_requested(true);  // a copy the job's thread took after the cancel
  ASSERT_TRUE(store_->UpdateJob(succeeded).ok());
  v1::Job cancelled = RunningJob("job-2-b");
  cancelled.set_state(v1::JOB_CANCELLED);
  ASSERT_TRUE(store_->RequestCancel("job-2-b").ok());  // the cancel that ended it
  ASSERT_TRUE(store_->UpdateJob(cancelled).ok());
  ASSERT_TRUE(store_->RequestCancel("job-2-b").ok()) << "recorded again after the end";
  ASSERT_TRUE(store_->RequestCancel("job-3-c").ok());
  for (const char* id : {"job-1-a", "job-2-b"}) {
    auto job = store_->GetJob(id);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_FALSE(job->cancel_requested()) << id << " ended " << v1::JobState_Name(job->state());
  }
  EXPECT_EQ(store_->GetJob("job-2-b")->state(), v1::JOB_CANCELLED);
  EXPECT_TRUE(store_->GetJob("job-3-c")->cancel_requested()) << "a running job's cancel is pending";
  auto listed = store_->ListNewestJobs(SIZE_MAX);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->jobs.size(), 3u);
  EXPECT_FALSE(listed->jobs[0].cancel_requested());
  EXPECT_FALSE(listed->jobs[1].cancel_requested());
  EXPECT_TRUE(listed->jobs[2].cancel_requested());
}

// When a job ended is the time of the first write of its row in an ended state, kept by the
// writes after it (a round's record rewritten), forgotten by a write of a state not ended;
// a job inserted already ended has none.
TEST_P(StateStoreConformanceTest, TheFirstWriteOfAnEndedStateRecordsWhenTheJobEnded) {
  const auto now = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  v1::Job job = RunningJob("job-1-a");
  job.set_created_unix_ms(1);  // created, and last active, long ago
  ASSERT_TRUE(store_->InsertJob(job).ok());
  v1::Job inserted_ended = RunningJob("job-2-b");
  inserted_ended.set_state(v1::JOB_FAILED);
  ASSERT_TRUE(store_->InsertJob(inserted_ended).ok());
  const auto ended_of = [this](const std::string& id) -> std::optional<int64_t> {
    auto listed = store_->ListNewestJobs(SIZE_MAX);
    EXPECT_TRUE(listed.ok()) << listed.status().ToString();
    if (!listed.ok() || !listed->ended_unix_ms.count(id)) return std::nullopt;
    return listed->ended_unix_ms.at(id);
  };
  EXPECT_FALSE(ended_of("job-1-a").has_value()) << "running";
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  EXPECT_FALSE(ended_of("job-1-a").has_value()) << "still running";
  const int64_t before = now();
  job.set_state(v1::JOB_FAILED);
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  const int64_t after = now();
  const auto ended = ended_of("job-1-a");
  ASSERT_TRUE(ended.has_value()) << "the end was not recorded";
  EXPECT_GE(*ended, before);
  EXPECT_LE(*ended, after);
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  EXPECT_EQ(ended_of("job-1-a"), ended) << "a later write moved the end";
  EXPECT_FALSE(ended_of("job-2-b").has_value()) << "inserted ended: its end was never written";
  job.set_state(v1::JOB_RUNNING);
  ASSERT_TRUE(store_->UpdateJob(job).ok());
  EXPECT_FALSE(ended_of("job-1-a").has_value()) << "running again";
}

TEST_P(StateStoreConformanceTest, AJobsRowHoldsItsLastRoundWithoutTheWorkersReports) {
  v1::Job job = RunningJob("job-1-abc");
  ASSERT_TRUE(store_->InsertJob(job).ok());
  v1::RoundRecord record;
  record.set_job_id(job.id());
  record.set_round(1);
  record.set_test_accuracy(0.5);
  for (int i = 0; i < 3; ++i) record.add_workers()->set_worker_id("w" + std::to_string(i));
  job.set_rounds_committed(1);
  *job.mutable_last_round() = record;
  ASSERT_TRUE(store_->CommitRound(job, record, Model(1)).ok());
  auto stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_DOUBLE_EQ(stored->last_round().test_accuracy(), 0.5);
  EXPECT_EQ(stored->last_round().workers_size(), 0);
  EXPECT_EQ(store_->ListJobs()->at(0).last_round().workers_size(), 0);
  // The round's own record keeps them.
  EXPECT_EQ(store_->ListRounds(job.id())->at(0).workers_size(), 3);
  record.mutable_latency()->set_commit_ms(2.5);
  *job.mutable_last_round() = record;
  ASSERT_TRUE(store_->UpdateRoundRecord(job, record).ok());
  EXPECT_DOUBLE_EQ(store_->GetJob(job.id())->last_round().latency().commit_ms(), 2.5);
  EXPECT_EQ(store_->GetJob(job.id())->last_round().workers_size(), 0);
  EXPECT_EQ(store_->ListRounds(job.id())->at(0).workers_size(), 3);
}

TEST_P(StateStoreConformanceTest, ACommittedRoundHasItsRecordCheckpointAndJobRow) {
  v1::Job job = RunningJob("job-1-abc");
  ASSERT_TRUE(store_->InsertJob(job).ok());
  CommitRounds(&job, 2);
  auto stored = store_->GetJob(job.id());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->rounds_committed(), 2u);
  EXPECT_EQ(stored->last_round().round(), 2u);
  auto rounds = store_->ListRounds(job.id());
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_DOUBLE_EQ((*rounds)[1].test_accuracy(), 0.2);
  EXPECT_EQ(store_->ListRounds(job.id(), 2)->size(), 1u);
  EXPECT_TRUE(store_->ListRounds("job-9-other")->empty());
  // A byte budget: it stops after the first record past it (one record past a budget of 0).
  EXPECT_EQ(store_->ListRounds(job.id(), 0, 0)->size(), 1u);
  EXPECT_EQ(store_->ListRounds(job.id(), 0, (*rounds)[0].ByteSizeLong())->size(), 2u);
  EXPECT_EQ(store_->ListRounds(job.id(), 2, 0)->front().round(), 2u);
  auto checkpoint = store_->LoadCheckpoint(job.id(), 2);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ((*checkpoint)[0].values, Model(2)[0].values);
  EXPECT_EQ((*checkpoint)[1].values, Model(2)[1].values);
  // The commit's latency is added to the record afterwards.
  v1::RoundRecord record = (*rounds)[1];
  record.mutable_latency()->set_commit_ms(12.5);
  *job.mutable_last_round() = record;
  ASSERT_TRUE(store_->UpdateRoundRecord(job, record).ok());
  EXPECT_DOUBLE_EQ(store_->ListRounds(job.id(), 2)->front().latency().commit_ms(), 12.5);
  EXPECT_DOUBLE_EQ(store_->GetJob(job.id())->last_round().latency().commit_ms(), 12.5);
  EXPECT_EQ(store_->LoadCheckpoint(job.id(), 3).status().code(), StatusCode::kNotFound);
}

// What a job keeps beside its model (a strategy's state, a selection's history) is written
// after the model's tensors, as one checkpoint, and read back with them in that order.
TEST_P(StateStoreConformanceTest, ACheckpointHoldsTheModelThenTheTensorsWrittenBesideIt) {
  v1::Job job = RunningJob("job-1-abc");
  ASSERT_TRUE(store_->InsertJob(job).ok());
  ASSERT_TRUE(store_->SaveInitialModel(job.id(), Model(0)).ok());
  const TensorSet extra = {{"strategy/momentum/w", {2, 2}, {9, 8, 7, 6}}, {"selection/history", {3}, {1, 2, 3}}};
  ASSERT_TRUE(store_->WriteCheckpoint(job.id(), 1, Model(1), extra).ok());
  v1::RoundRecord record;
  record.set_job_id(job.id());
  record.set_round(1);
  job.set_rounds_committed(1);
  ASSERT_TRUE(store_->CommitWrittenRound(job, record).ok());
  auto checkpoint = store_->LoadCheckpoint(job.id(), 1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  TensorSet expected = Model(1);
  expected.insert(expected.end(), extra.begin(), extra.end());
  ASSERT_EQ(checkpoint->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ((*checkpoint)[i].name, expected[i].name);
    EXPECT_EQ((*checkpoint)[i].shape, expected[i].shape);
    EXPECT_EQ((*checkpoint)[i].values, expected[i].values) << expected[i].name;
  }
}

TEST_P(StateStoreConformanceTest, AWrittenCheckpointIsPartOfTheJobOnlyOnceItsRoundIsCommitted) {
  v1::Job job = RunningJob("job-1-abc");
  ASSERT_TRUE(store_->InsertJob(job).ok());
  ASSERT_TRUE(store_->SaveInitialModel(job.id(), Model(0)).ok());
  v1::RoundRecord record;
  record.set_job_id(job.id());
  record.set_round(1);
  v1::Job committed = job;
  committed.set_rounds_committed(1);
  *committed.mutable_last_round() = record;
  // No checkpoint written: the commit is refused, naming the round and the job, and changes nothing.
  Status refused = store_->CommitWrittenRound(committed, record);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("round 1 of job 'job-1-abc'"), std::string::npos) << refused.message();
  EXPECT_EQ(store_->GetJob(job.id())->rounds_committed(), 0u);
  // Written and not committed: the job has no round 1.
  ASSERT_TRUE(store_->WriteCheckpoint(job.id(), 1, Model(1)).ok());
  EXPECT_EQ(store_->GetJob(job.id())->rounds_committed(), 0u);
  EXPECT_TRUE(store_->ListRounds(job.id())->empty());
  // Written again (the round tried again): the newer checkpoint is the one committed.
  ASSERT_TRUE(store_->WriteCheckpoint(job.id(), 1, Model(7)).ok());
  ASSERT_TRUE(store_->CommitWrittenRound(committed, record).ok());
  EXPECT_EQ(store_->GetJob(job.id())->rounds_committed(), 1u);
  EXPECT_EQ(store_->ListRounds(job.id())->size(), 1u);
  auto checkpoint = store_->LoadCheckpoint(job.id(), 1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  EXPECT_EQ((*checkpoint)[0].values, Model(7)[0].values);
  // A written checkpoint is committed once: committing the round again needs a new write.
  EXPECT_EQ(store_->CommitWrittenRound(committed, record).code(), StatusCode::kFailedPrecondition);
  // A job has one written checkpoint waiting at most: round 3's write drops round 2's.
  ASSERT_TRUE(store_->WriteCheckpoint(job.id(), 2, Model(2)).ok());
  ASSERT_TRUE(store_->WriteCheckpoint(job.id(), 3, Model(3)).ok());
  record.set_round(2);
  EXPECT_EQ(store_->CommitWrittenRound(committed, record).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->GetJob(job.id())->rounds_committed(), 1u);
}

// A deletion takes the checkpoint written for the job and not committed with the rest: a
// commit of it afterwards is refused and records no round of a job that is gone.
TEST_P(StateStoreConformanceTest, ADeletedJobsWrittenCheckpointCannotBeCommitted) {
  v1::Job job = RunningJob("job-1-abc");
  ASSERT_TRUE(store_->InsertJob(job).ok());
  ASSERT_TRUE(store_->SaveInitialModel(job.id(), Model(0)).ok());
  ASSERT_TRUE(store_->WriteCheckpoint(job.id(), 1, Model(1)).ok());
  auto deleted = store_->DeleteJob(job.id());
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_TRUE(*deleted);
  v1::RoundRecord record;
  record.set_job_id(job.id());
  record.set_round(1);
  job.set_rounds_committed(1);
  Status refused = store_->CommitWrittenRound(job, record);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  auto rounds = store_->ListRounds(job.id());
  ASSERT_TRUE(rounds.ok()) << rounds.status().ToString();
  EXPECT_TRUE(rounds->empty());
  EXPECT_EQ(store_->LoadCheckpoint(job.id(), 1).status().code(), StatusCode::kNotFound);
}

TEST_P(StateStoreConformanceTest, TheNewestCheckpointsAreKeptAndADamagedOneFallsBackNamingIt) {
  v1::Job job = RunningJob("job-1-abc");
  ASSERT_TRUE(store_->InsertJob(job).ok());
  CommitRounds(&job, 5);
  for (uint32_t r : {0u, 3u, 4u, 5u}) EXPECT_TRUE(store_->LoadCheckpoint(job.id(), r).ok()) << r;
  for (uint32_t r : {1u, 2u}) EXPECT_EQ(store_->LoadCheckpoint(job.id(), r).status().code(), StatusCode::kNotFound) << r;
  GetParam().damage(*store_, dir_, job.id(), 5);
  GetParam().damage(*store_, dir_, job.id(), 4);
  auto damaged5 = store_->LoadCheckpoint(job.id(), 5);
  EXPECT_EQ(damaged5.status().code(), StatusCode::kDataLoss);
  std::vector<Status> damaged;
  auto newest = store_->LoadNewestCheckpoint(job.id(), 5, &damaged);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->round, 3u);
  EXPECT_EQ(newest->tensors[0].values, Model(3)[0].values);
  ASSERT_EQ(damaged.size(), 2u);
  for (const Status& why : damaged) EXPECT_EQ(why.code(), StatusCode::kDataLoss) << why.ToString();
  EXPECT_NE(damaged[0].message().find(job.id()), std::string::npos) << damaged[0].message();
  EXPECT_NE(damaged[0].message().find("5"), std::string::npos) << damaged[0].message();
  // Rewinding to round 3 forgets the records of rounds 4 and 5.
  job.set_rounds_committed(3);
  ASSERT_TRUE(store_->RewindJob(job).ok());
  EXPECT_EQ(store_->GetJob(job.id())->rounds_committed(), 3u);
  EXPECT_EQ(store_->ListRounds(job.id())->size(), 3u);
}

TEST_P(StateStoreConformanceTest, WithNothingLoadableTheNewestCheckpointIsDataLoss) {
  std::vector<Status> damaged;
  auto newest = store_->LoadNewestCheckpoint("job-1-none", 2, &damaged);
  EXPECT_EQ(newest.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(damaged.size(), 3u);  // rounds 2, 1 and the initial model
}

TEST_P(StateStoreConformanceTest, SeatsWorkersAndNamesAreKept) {
  ASSERT_TRUE(store_->SaveSeat("job-1-a", "w2", 1).ok());
  ASSERT_TRUE(store_->SaveSeat("job-1-a", "w1", 0).ok());
  ASSERT_TRUE(store_->SaveSeat("job-2-b", "w1", 5).ok());
  auto seats = store_->LoadSeats("job-1-a");
  ASSERT_TRUE(seats.ok());
  EXPECT_EQ(*seats, (std::vector<std::pair<std::string, uint32_t>>{{"w1", 0}, {"w2", 1}}));
  EXPECT_TRUE(store_->LoadSeats("job-3-none")->empty());
  v1::WorkerStatus b, a;
  b.set_worker_id("b");
  a.set_worker_id("a");
  a.mutable_device()->set_kind("cuda");
  ASSERT_TRUE(store_->SaveWorker(b).ok());
  ASSERT_TRUE(store_->SaveWorker(a).ok());
  auto workers = store_->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[0].worker_id(), "a");
  EXPECT_EQ((*workers)[0].device().kind(), "cuda");
  EXPECT_EQ(store_->BindWorkerName("w1", "token:site-a").value(), "token:site-a");
  EXPECT_EQ(store_->BindWorkerName("w1", "token:site-b").value(), "token:site-a") << "the first binding stays";
}

// A forgotten worker's row and its name's binding go together, so that the name binds anew;
// another worker's, and the job's seats, stay.
TEST_P(StateStoreConformanceTest, AForgottenWorkerLosesItsRowAndItsNamesBinding) {
  v1::WorkerStatus w1, w2;
  w1.set_worker_id("w1");
  w2.set_worker_id("w2");
  ASSERT_TRUE(store_->SaveWorker(w1).ok());
  ASSERT_TRUE(store_->SaveWorker(w2).ok());
  ASSERT_EQ(store_->BindWorkerName("w1", "token:site-a").value(), "token:site-a");
  ASSERT_EQ(store_->BindWorkerName("w2", "token:site-a").value(), "token:site-a");
  ASSERT_TRUE(store_->SaveSeat("job-1-a", "w1", 0).ok());

  auto forgot = store_->ForgetWorker("w1");
  ASSERT_TRUE(forgot.ok()) << forgot.status().ToString();
  EXPECT_TRUE(*forgot);
  auto workers = store_->LoadWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id(), "w2");
  EXPECT_EQ(store_->BindWorkerName("w1", "token:site-b").value(), "token:site-b") << "the name binds anew";
  EXPECT_EQ(store_->BindWorkerName("w2", "token:site-b").value(), "token:site-a") << "another's binding stays";
  EXPECT_EQ(store_->LoadSeats("job-1-a").value().size(), 1u) << "a seat belongs to the job";

  // A name bound with no row (a join that failed after binding it) is forgotten too.
  ASSERT_TRUE(store_->ForgetWorker("w1").value());
  EXPECT_EQ(store_->BindWorkerName("w1", "token:site-c").value(), "token:site-c");
  // A name with neither: nothing to forget.
  auto unknown = store_->ForgetWorker("nobody");
  ASSERT_TRUE(unknown.ok());
  EXPECT_FALSE(*unknown);
}

TEST_P(StateStoreConformanceTest, SeatsAreGivenBackAsStoredSortedByPartyThenSeat) {
  // The store does not judge a seat (SeatTable::Load does): a name no worker can hold, a
  // party no partition has, two seats on one party come back as they were saved.
  const std::string with_nul("w1\0x", 4);
  ASSERT_TRUE(store_->SaveSeat("job-1-a", "w3", 2).ok());
  ASSERT_TRUE(store_->SaveSeat("job-1-a", "w2", 2).ok());
  ASSERT_TRUE(store_->SaveSeat("job-1-a", with_nul, 4000000000u).ok());
  ASSERT_TRUE(store_->SaveSeat("job-1-a", "w\n0", 0).ok());
  auto seats = store_->LoadSeats("job-1-a");
  ASSERT_TRUE(seats.ok()) << seats.status().ToString();
  EXPECT_EQ(*seats, (std::vector<std::pair<std::string, uint32_t>>{
                        {"w\n0", 0}, {"w2", 2}, {"w3", 2}, {with_nul, 4000000000u}}))
      << "a name is not cut at a NUL, where it could pass for worker w1's";
}

TEST_P(StateStoreConformanceTest, AJobHoldingMoreSeatsThanAskedForIsDataLossNotAShorterList) {
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(store_->SaveSeat("job-1-a", "w" + std::to_string(i), i).ok());
  ASSERT_TRUE(store_->SaveSeat("job-2-b", "w1", 0).ok());
  auto bounded = store_->LoadSeats("job-1-a", 3);
  ASSERT_FALSE(bounded.ok()) << "gave " << bounded->size() << " of 4 seats";
  EXPECT_EQ(bounded.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(bounded.status().message(), "seats table: job 'job-1-a': more than 3 seats stored; expected at most 3");
  EXPECT_EQ(store_->LoadSeats("job-1-a", 4)->size(), 4u);
  EXPECT_EQ(store_->LoadSeats("job-2-b", 1)->size(), 1u) << "another job's seats do not count";
}

INSTANTIATE_TEST_SUITE_P(Stores, StateStoreConformanceTest, ::testing::Values(kSqlite, kMemory),
                         [](const ::testing::TestParamInfo<StoreBackend>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::server
