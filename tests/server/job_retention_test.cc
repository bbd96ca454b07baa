// Ended jobs past their retention (server/jobs/job_retention.h): which jobs a sweep deletes,
// what a deletion takes from each store (and what it leaves), and a coordinator started with
// a retention deleting what has expired.
#include "server/jobs/job_retention.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "server/coordinator.h"
#include "server/state/memory_state_store.h"
#include "server/state/sqlite_state_store.h"
#include "server/workers/worker_registry.h"  // UnixMillis
#include "tests/server/edit_database.h"
#include "tests/server/job_runner_fixture.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

constexpr int64_t kDay = 24 * 3600 * 1000;
constexpr int64_t kNow = 1000 * kDay;

v1::Job MakeJob(const std::string& id, v1::JobState state, int64_t created, int64_t committed = 0) {
  v1::Job job;
  job.set_id(id);
  *job.mutable_spec() = JobRunnerFixture::SmallSpec(2, 2);
  job.set_state(state);
  job.set_created_unix_ms(created);
  if (committed > 0) {
    job.set_rounds_committed(1);
    job.mutable_last_round()->set_round(1);
    job.mutable_last_round()->set_committed_unix_ms(committed);
  }
  return job;
}

std::vector<std::string> Ids(const std::vector<ExpiredJob>& jobs) {
  std::vector<std::string> ids;
  for (const auto& job : jobs) ids.push_back(job.id);
  return ids;
}

TEST(JobRetentionTest, OnlyEndedJobsLastActiveBeforeTheRetentionExpireAndNeverTheNewest) {
  const std::vector<v1::Job> jobs = {
      MakeJob("job-1-a", v1::JOB_SUCCEEDED, kNow - 40 * kDay),                  // expired
      MakeJob("job-2-b", v1::JOB_FAILED, kNow - 40 * kDay, kNow - 29 * kDay),   // a round 29 days ago: kept
      MakeJob("job-3-c", v1::JOB_CANCELLED, kNow - 31 * kDay, kNow - 30 * kDay),  // exactly 30 days: expired
      MakeJob("job-4-d", v1::JOB_RUNNING, kNow - 90 * kDay),                    // running: kept
      MakeJob("job-5-e", v1::JOB_PENDING, kNow - 90 * kDay),                    // pending: kept
      MakeJob("job-6-f", v1::JOB_SUCCEEDED, kNow + 5 * kDay),                   // in the future: kept
      MakeJob("job-7-g", v1::JOB_SUCCEEDED, kNow - 90 * kDay),                  // the newest: kept
  };
  EXPECT_EQ(Ids(ExpiredJobs(jobs, {}, kNow, std::chrono::hours(30 * 24))), (std::vector<std::string>{"job-1-a", "job-3-c"}));
  EXPECT_TRUE(ExpiredJobs(jobs, {}, kNow, std::chrono::hours(0)).empty()) << "no retention: nothing expires";
  EXPECT_TRUE(ExpiredJobs({jobs[0]}, {}, kNow, std::chrono::hours(24)).empty()) << "a lone job is the newest";
}

// A job's age counts from its end where the store recorded it, not from its creation or its
// last round: a job that ran for months and just ended is kept for the whole retention.
TEST(JobRetentionTest, AJobsAgeCountsFromItsRecordedEnd) {
  const std::vector<v1::Job> jobs = {
      MakeJob("job-1-a", v1::JOB_SUCCEEDED, kNow - 90 * kDay, kNow - 89 * kDay),  // ended a day ago: kept
      MakeJob("job-2-b", v1::JOB_FAILED, kNow - 90 * kDay, kNow - 89 * kDay),     // ended 30 days ago: expired
      MakeJob("job-3-c", v1::JOB_CANCELLED, kNow - 90 * kDay),                    // no end recorded: its creation
      MakeJob("job-4-d", v1::JOB_SUCCEEDED, kNow - 90 * kDay),                    // the newest: kept
  };
  const std::map<std::string, int64_t> ended = {
      {"job-1-a", kNow - kDay}, {"job-2-b", kNow - 30 * kDay}, {"job-4-d", kNow - 90 * kDay}};
  const auto expired = ExpiredJobs(jobs, ended, kNow, std::chrono::hours(30 * 24));
  EXPECT_EQ(Ids(expired), (std::vector<std::string>{"job-2-b", "job-3-c"}));
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].ended_unix_ms, kNow - 30 * kDay);
  EXPECT_EQ(expired[1].ended_unix_ms, kNow - 90 * kDay);
}

// A sweep reads the end the store recorded when the job's end was written: a job created and
// last active 90 days ago, whose end was written just now, outlives a 30-day retention until
// 30 days after its end.
TEST(JobRetentionTest, AJobThatRanLongAndJustEndedIsKeptForTheWholeRetention) {
  MemoryStateStore store;
  const int64_t now = UnixMillis();
  v1::Job job = MakeJob("job-1-long", v1::JOB_RUNNING, now - 90 * kDay, now - 90 * kDay);
  ASSERT_TRUE(store.InsertJob(job).ok());
  ASSERT_TRUE(store.InsertJob(MakeJob("job-2-newest", v1::JOB_PENDING, now)).ok());
  job.set_state(v1::JOB_SUCCEEDED);
  ASSERT_TRUE(store.UpdateJob(job).ok());  // as its runner records its end
  JobRetention retention(&store, std::chrono::hours(30 * 24), nullptr);
  EXPECT_TRUE(retention.Sweep(now + kDay).empty()) << "deleted a day after its end";
  EXPECT_TRUE(store.GetJob("job-1-long").ok());
  EXPECT_TRUE(retention.Sweep(now + 29 * kDay).empty()) << "deleted 29 days after its end";
  EXPECT_EQ(retention.Sweep(now + 31 * kDay), std::vector<std::string>{"job-1-long"});
}

// A job whose row says it ended while its runner is still finishing (telling its workers) is
// busy: a sweep leaves it, as DeleteJob does, and deletes it once it is not. Deleted under its
// runner, the job would still be answered (and counted) from that runner.
TEST(JobRetentionTest, ABusyJobIsLeftForALaterSweep) {
  MemoryStateStore store;
  for (const std::string id : {"job-1-busy", "job-2-idle", "job-3-newest"}) {
    ASSERT_TRUE(store.InsertJob(MakeJob(id, v1::JOB_CANCELLED, kNow - 40 * kDay)).ok());
  }
  bool finishing = true;
  std::vector<std::string> told;
  JobRetention retention(
      &store, std::chrono::hours(30 * 24), [&told](const ExpiredJob& job) { told.push_back(job.id); },
      [&finishing](const std::string& id) { return finishing && id == "job-1-busy"; });
  EXPECT_EQ(retention.Sweep(kNow), std::vector<std::string>{"job-2-idle"});
  EXPECT_TRUE(store.GetJob("job-1-busy").ok()) << "deleted while its runner was finishing";
  finishing = false;
  EXPECT_EQ(retention.Sweep(kNow), std::vector<std::string>{"job-1-busy"});
  EXPECT_EQ(store.GetJob("job-1-busy").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(told, (std::vector<std::string>{"job-2-idle", "job-1-busy"}));
}

class SqliteDeleteJobTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTestDirectory("tessera-retention"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// A deletion takes the job's checkpoints (kept rounds and a write left unfinished), rows,
// round records and seats, and nothing of another job, even one whose id begins with its id.
TEST_F(SqliteDeleteJobTest, ADeletedJobLeavesNothingAndTakesNothingOfAnother) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StateStore& s = **store;
  const TensorSet model = {NamedTensor{"w", {2}, {1.0f, 2.0f}}};
  for (const std::string id : {"job-1-ab", "job-1-abc"}) {
    ASSERT_TRUE(s.InsertJob(MakeJob(id, v1::JOB_SUCCEEDED, 1)).ok());
    ASSERT_TRUE(s.SaveInitialModel(id, model).ok());
    v1::Job job = MakeJob(id, v1::JOB_SUCCEEDED, 1);
    job.set_rounds_committed(1);
    v1::RoundRecord record;
    record.set_round(1);
    ASSERT_TRUE(s.CommitRound(job, record, model).ok());
    ASSERT_TRUE(s.SaveSeat(id, "w1", 0).ok());
    ASSERT_TRUE(s.RequestCancel(id).ok());
  }
  const auto checkpoints = dir_ / "checkpoints";
  { std::ofstream(checkpoints / "job-1-ab-round-2.ckpt.tmp") << "an unfinished write"; }
  { std::ofstream(checkpoints / "job-1-ab-notes.txt") << "not a checkpoint"; }

  auto deleted = s.DeleteJob("job-1-ab");
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_TRUE(*deleted);
  EXPECT_EQ(s.GetJob("job-1-ab").status().code(), StatusCode::kNotFound);
  auto rounds = s.ListRounds("job-1-ab");
  ASSERT_TRUE(rounds.ok());
  EXPECT_TRUE(rounds->empty());
  auto seats = s.LoadSeats("job-1-ab");
  ASSERT_TRUE(seats.ok());
  EXPECT_TRUE(seats->empty());
  for (const char* gone : {"job-1-ab-round-0.ckpt", "job-1-ab-round-1.ckpt", "job-1-ab-round-2.ckpt.tmp"}) {
    EXPECT_FALSE(std::filesystem::exists(checkpoints / gone)) << gone;
  }
  EXPECT_TRUE(std::filesystem::exists(checkpoints / "job-1-ab-notes.txt")) << "a file no checkpoint's name";
  // The other job is whole.
  EXPECT_TRUE(s.GetJob("job-1-abc").ok());
  EXPECT_TRUE(s.LoadCheckpoint("job-1-abc", 0).ok());
  EXPECT_TRUE(s.LoadCheckpoint("job-1-abc", 1).ok());
  auto other_rounds = s.ListRounds("job-1-abc");
  ASSERT_TRUE(other_rounds.ok());
  EXPECT_EQ(other_rounds->size(), 1u);
  auto other_seats = s.LoadSeats("job-1-abc");
  ASSERT_TRUE(other_seats.ok());
  EXPECT_EQ(other_seats->size(), 1u);

  auto again = s.DeleteJob("job-1-ab");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again) << "nothing left to delete";
  EXPECT_EQ(s.DeleteJob("../job").status().code(), StatusCode::kInvalidArgument);
}

TEST(MemoryDeleteJobTest, ADeletedJobLeavesNothingOfItself) {
  MemoryStateStore s;
  const TensorSet model = {NamedTensor{"w", {1}, {1.0f}}};
  for (const std::string id : {"job-1-a", "job-2-b"}) {
    ASSERT_TRUE(s.InsertJob(MakeJob(id, v1::JOB_SUCCEEDED, 1)).ok());
    ASSERT_TRUE(s.SaveInitialModel(id, model).ok());
    ASSERT_TRUE(s.SaveSeat(id, "w1", 0).ok());
  }
  auto deleted = s.DeleteJob("job-1-a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  EXPECT_EQ(s.GetJob("job-1-a").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(s.HasCheckpoint("job-1-a", 0));
  EXPECT_TRUE(s.HasCheckpoint("job-2-b", 0));
  EXPECT_TRUE(s.LoadSeats("job-1-a")->empty());
  EXPECT_EQ(s.writes(StateWrite::kDeleteJob), 1);
}

// The end a store recorded survives its reopening (a coordinator's restart); a database from
// before ends were recorded has its ended jobs' ends taken as its first opening that records
// them, so that none is deleted sooner than its end, read now, allows.
TEST_F(SqliteDeleteJobTest, AJobsEndIsRecordedDurablyAndAnOlderDatabaseTakesItsEndedJobsEndAsNow) {
  v1::Job ended = MakeJob("job-1-old", v1::JOB_SUCCEEDED, 1, 2);
  v1::Job running = MakeJob("job-2-run", v1::JOB_RUNNING, 1);
  std::string values;
  int number = 0;
  for (const v1::Job* job : {&ended, &running}) {
    std::string hex;
    for (const unsigned char c : job->SerializeAsString()) {
      static const char kDigits[] = "0123456789abcdef";
      hex += kDigits[c >> 4];
      hex += kDigits[c & 15];
    }
    values += std::string(values.empty() ? "" : ", ") + "('" + job->id() + "', " + std::to_string(++number) + ", X'" +
              hex + "')";
  }
  // The jobs table as it was before the end's column.
  std::filesystem::create_directories(dir_);
  EditDatabase(dir_, ("CREATE TABLE jobs (id TEXT PRIMARY KEY, number INTEGER, job BLOB NOT NULL);"
                      "INSERT INTO jobs (id, number, job) VALUES " + values + ";").c_str());
  const int64_t before = UnixMillis();
  int64_t first_end = 0;
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto listed = (*store)->ListNewestJobs(SIZE_MAX);
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    ASSERT_EQ(listed->jobs.size(), 2u);
    ASSERT_TRUE(listed->ended_unix_ms.count("job-1-old")) << "the ended job got no end";
    first_end = listed->ended_unix_ms.at("job-1-old");
    EXPECT_GE(first_end, before);
    EXPECT_FALSE(listed->ended_unix_ms.count("job-2-run")) << "a running job has not ended";
    running.set_state(v1::JOB_FAILED);
    ASSERT_TRUE((*store)->UpdateJob(running).ok());
  }
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto listed = (*store)->ListNewestJobs(SIZE_MAX);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->ended_unix_ms.at("job-1-old"), first_end) << "a reopening moved the end";
  ASSERT_TRUE(listed->ended_unix_ms.count("job-2-run")) << "the end written was not kept";
  EXPECT_GE(listed->ended_unix_ms.at("job-2-run"), before);
  // Under a 7-day retention neither expires a day from now, although both were created and
  // last active in 1970.
  EXPECT_TRUE(ExpiredJobs(listed->jobs, listed->ended_unix_ms, UnixMillis() + kDay, std::chrono::hours(7 * 24)).empty());
}

// A coordinator started with a retention deletes, at once, the ended jobs whose end (here,
// with none recorded, their last activity) is older, and keeps the others; its job counts
// follow.
TEST_F(SqliteDeleteJobTest, ACoordinatorWithARetentionDeletesTheExpiredJobsAtStart) {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->InsertJob(MakeJob("job-1-old", v1::JOB_SUCCEEDED, now - 10 * kDay)).ok());
    ASSERT_TRUE((*store)->InsertJob(MakeJob("job-2-recent", v1::JOB_FAILED, now - 10 * kDay, now - kDay)).ok());
    ASSERT_TRUE((*store)->InsertJob(MakeJob("job-3-newest", v1::JOB_CANCELLED, now - 10 * kDay)).ok());
  }
  CoordinatorOptions options = LoopbackCoordinatorOptions(dir_, "retention-test");
  options.ended_job_retention = std::chrono::hours(7 * 24);
  auto c = Coordinator::Start(options);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // The sweep's thread deletes the rows, then the count: both are waited for.
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = (*c)->GetJob("job-1-old").status().code() == StatusCode::kNotFound &&
           (*c)->JobCounts()[v1::JOB_SUCCEEDED] == 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "the job ended 10 days ago was not deleted (and uncounted) under a 7-day retention";
  EXPECT_TRUE((*c)->GetJob("job-2-recent").ok()) << "last active a day ago";
  EXPECT_TRUE((*c)->GetJob("job-3-newest").ok()) << "the newest job is kept";
  auto counts = (*c)->JobCounts();
  EXPECT_EQ(counts[v1::JOB_SUCCEEDED], 0u);
  EXPECT_EQ(counts[v1::JOB_FAILED], 1u);
  EXPECT_EQ(counts[v1::JOB_CANCELLED], 1u);
}

}  // namespace
}  // namespace tessera::server
