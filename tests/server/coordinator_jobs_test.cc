// A coordinator's jobs across its own restarts and shutdown: a cancel answered Ok is never
// lost, a stored row that cannot be read stops no other job, no job starts once shutdown has
// begun, the lists and the job counts come from memory and stay bounded, only an ended job
// that is not the newest is deleted, and jobs submitted at once get numbers of their own.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/coordinator.h"
#include "server/state/sqlite_state_store.h"
#include "tests/server/job_runner_fixture.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

class CoordinatorJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-jobs");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  CoordinatorOptions Options() { return LoopbackCoordinatorOptions(dir_, "jobs-test"); }

  static v1::Job StoredJob(const std::string& id, v1::JobState state) {
    v1::Job job;
    job.set_id(id);
    *job.mutable_spec() = JobRunnerFixture::SmallSpec(2, 2);
    job.set_state(state);
    return job;
  }

  // Writes the jobs into the state directory as a coordinator would have left them.
  void Store(const std::vector<v1::Job>& jobs, const std::vector<std::string>& cancelled = {}) {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (const auto& job : jobs) ASSERT_TRUE((*store)->InsertJob(job).ok());
    for (const auto& id : cancelled) ASSERT_TRUE((*store)->RequestCancel(id).ok());
  }

  // Overwrites a job's row with bytes that are no job.
  void DamageRow(const std::string& id) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "coordinator.db").c_str(), &db), SQLITE_OK);
    const std::string sql = "UPDATE jobs SET job = X'FFFFFFFF0A' WHERE id = '" + id + "'";
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    EXPECT_EQ(sqlite3_changes(db), 1);
    sqlite3_close(db);
  }

  static v1::Job AwaitState(Coordinator& c, const std::string& id, v1::JobState state) {
    v1::Job job;
    for (int i = 0; i < 500; ++i) {
      auto got = c.GetJob(id);
      if (got.ok()) {
        job = *got;
        if (job.state() == state) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return job;
  }

  // Waits until the job's runner, if this process holds one, has finished (its end recorded).
  static void AwaitFinished(Coordinator& c, const std::string& id) {
    for (int i = 0; i < 500; ++i) {
      auto runner = c.Runner(id);
      if (runner == nullptr || runner->finished()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::filesystem::path dir_;
};

TEST_F(CoordinatorJobsTest, ACancelRecordedBeforeTheCoordinatorDiedEndsTheJobAtTheNextStart) {
  // What a coordinator killed right after answering a cancel leaves: the job's row still
  // running, the cancel recorded beside it.
  Store({StoredJob("job-1-aaa", v1::JOB_RUNNING), StoredJob("job-2-bbb", v1::JOB_PENDING)}, {"job-1-aaa"});
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  v1::Job job = AwaitState(**c, "job-1-aaa", v1::JOB_CANCELLED);
  EXPECT_EQ(job.state(), v1::JOB_CANCELLED);
  EXPECT_EQ(job.error(), "cancelled by the user");
  EXPECT_EQ(job.rounds_committed(), 0u);
  // The other job runs on (it waits for workers), and is not cancelled.
  auto other = (*c)->GetJob("job-2-bbb");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->cancel_requested());
  EXPECT_NE(other->state(), v1::JOB_CANCELLED);
  // A cancel of the running one is recorded before it is answered.
  auto cancelled = (*c)->CancelJob("job-2-bbb");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  // Pending until the job ends, which it may have done by the reply: then its state says so.
  EXPECT_TRUE(cancelled->cancel_requested() || cancelled->state() == v1::JOB_CANCELLED)
      << v1::JobState_Name(cancelled->state());
  EXPECT_EQ(AwaitState(**c, "job-2-bbb", v1::JOB_CANCELLED).state(), v1::JOB_CANCELLED);
  const auto counts = (*c)->JobCounts();
  EXPECT_EQ(counts.count(v1::JOB_CANCELLED) ? counts.at(v1::JOB_CANCELLED) : 0u, 2u);
  (*c)->Shutdown();
  c->reset();
  // Ended for good: a third start resumes neither.
  auto again = Coordinator::Start(Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->GetJob("job-1-aaa")->state(), v1::JOB_CANCELLED);
  EXPECT_EQ((*again)->GetJob("job-2-bbb")->state(), v1::JOB_CANCELLED);
  EXPECT_EQ((*again)->Runner("job-1-aaa"), nullptr);
  EXPECT_EQ((*again)->JobCounts().at(v1::JOB_CANCELLED), 2u);
  // Their cancels are recorded still, and are no cancels pending: they ended by them.
  for (const char* id : {"job-1-aaa", "job-2-bbb"}) {
    EXPECT_FALSE((*again)->GetJob(id)->cancel_requested()) << id;
  }
  auto listed = (*again)->JobsReply();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  for (const auto& job : listed->jobs()) EXPECT_FALSE(job.cancel_requested()) << job.id();
}

TEST_F(CoordinatorJobsTest, AJobRowThatCannotBeReadStopsNoOtherJobAndKeepsItsFiles) {
  Store({StoredJob("job-1-aaa", v1::JOB_SUCCEEDED), StoredJob("job-2-bbb", v1::JOB_RUNNING),
         StoredJob("job-3-ccc", v1::JOB_RUNNING)});
  DamageRow("job-2-bbb");
  // Its checkpoint stays for an operator to look at.
  const auto checkpoint = dir_ / "checkpoints" / "job-2-bbb-round-3.ckpt";
  { std::ofstream(checkpoint) << "kept"; }
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << "one damaged row kept the coordinator from starting: " << c.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(checkpoint));
  EXPECT_NE((*c)->Runner("job-3-ccc"), nullptr) << "the readable running job is resumed";
  EXPECT_EQ((*c)->Runner("job-2-bbb"), nullptr);
  auto listed = (*c)->ListJobs(SIZE_MAX);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->jobs.size(), 2u);
  EXPECT_EQ(listed->jobs[0].id(), "job-1-aaa");
  EXPECT_EQ(listed->jobs[1].id(), "job-3-ccc");
  EXPECT_EQ(listed->total, 3u);
  ASSERT_EQ(listed->damaged.size(), 1u);
  EXPECT_EQ(listed->damaged[0], "job-2-bbb");
  auto reply = (*c)->JobsReply();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->jobs_size(), 2);
  EXPECT_EQ(reply->more(), 1u) << "the damaged job is counted as not listed";
  EXPECT_EQ((*c)->UnreadableJobs(), 1u);
  auto damaged = (*c)->GetJob("job-2-bbb");
  EXPECT_EQ(damaged.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(damaged.status().message().find("job-2-bbb"), std::string::npos) << damaged.status().ToString();
}

// An export names why a round's model cannot be had: a round whose checkpoint is no longer
// kept is NotFound saying what is kept, a checkpoint that is there but damaged is its own error.
TEST_F(CoordinatorJobsTest, AnExportTellsARoundNotKeptFromADamagedCheckpoint) {
  v1::Job job = StoredJob("job-1-aaa", v1::JOB_SUCCEEDED);
  job.set_rounds_committed(5);
  Store({job});
  { std::ofstream(dir_ / "checkpoints" / "job-1-aaa-round-5.ckpt") << "not a checkpoint"; }
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto gone = (*c)->ExportModel("job-1-aaa", 1u, 1u << 20);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("the model of round 1 is not kept"), std::string::npos)
      << gone.status().ToString();
  EXPECT_EQ(gone.status().message().find(dir_.string()), std::string::npos)
      << "a round not kept needs no path on the coordinator's disk: " << gone.status().ToString();
  auto damaged = (*c)->ExportModel("job-1-aaa", std::nullopt, 1u << 20);
  EXPECT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().code(), StatusCode::kNotFound) << damaged.status().ToString();
  EXPECT_NE(damaged.status().message().find("the model of round 5 cannot be read"), std::string::npos)
      << damaged.status().ToString();
}

TEST_F(CoordinatorJobsTest, NoJobStartsOnceShutdownHasBegun) {
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  (*c)->Shutdown();
  auto refused = (*c)->SubmitJob(JobRunnerFixture::SmallSpec(2, 2));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("shutting down"), std::string::npos) << refused.status().ToString();
  EXPECT_TRUE((*c)->JobCounts().empty());
}

TEST_F(CoordinatorJobsTest, ACancelAfterShutdownBeganIsRefusedAndAnEndedJobsIsNamed) {
  Store({StoredJob("job-1-aaa", v1::JOB_SUCCEEDED)});
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto ended = (*c)->CancelJob("job-1-aaa");
  EXPECT_EQ(ended.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(ended.status().message().find("is succeeded; only a pending or running job"), std::string::npos)
      << ended.status().ToString();
  (*c)->Shutdown();
  auto late = (*c)->CancelJob("job-1-aaa");
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable) << late.status().ToString();
}

TEST_F(CoordinatorJobsTest, OnlyAnEndedJobThatIsNotTheNewestIsDeletedAndItsCountGoesWithIt) {
  Store({StoredJob("job-1-aaa", v1::JOB_SUCCEEDED), StoredJob("job-2-bbb", v1::JOB_PENDING),
         StoredJob("job-3-ccc", v1::JOB_PENDING)});
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // Running (it waits for workers): refused, and it runs on.
  auto running = (*c)->DeleteJob("job-2-bbb");
  EXPECT_EQ(running.status().code(), StatusCode::kFailedPrecondition) << running.status().ToString();
  EXPECT_NE(running.status().message().find("only an ended job can be deleted (cancel it first: tessera cancel "
                                            "job-2-bbb)"),
            std::string::npos)
      << running.status().ToString();
  // Ended before this start: deleted, and no longer counted.
  auto deleted = (*c)->DeleteJob("job-1-aaa");
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(deleted->state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ((*c)->GetJob("job-1-aaa").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*c)->DeleteJob("job-1-aaa").status().code(), StatusCode::kNotFound);
  auto counts = (*c)->JobCounts();
  EXPECT_EQ(counts.count(v1::JOB_SUCCEEDED) ? counts.at(v1::JOB_SUCCEEDED) : 0u, 0u);
  // Ended in this process, its runner still held: the runner goes with the job.
  ASSERT_TRUE((*c)->CancelJob("job-2-bbb").ok());
  ASSERT_EQ(AwaitState(**c, "job-2-bbb", v1::JOB_CANCELLED).state(), v1::JOB_CANCELLED);
  AwaitFinished(**c, "job-2-bbb");
  ASSERT_NE((*c)->Runner("job-2-bbb"), nullptr);
  ASSERT_TRUE((*c)->DeleteJob("job-2-bbb").ok());
  EXPECT_EQ((*c)->Runner("job-2-bbb"), nullptr);
  EXPECT_EQ((*c)->GetJob("job-2-bbb").status().code(), StatusCode::kNotFound);
  counts = (*c)->JobCounts();
  EXPECT_EQ(counts.count(v1::JOB_CANCELLED) ? counts.at(v1::JOB_CANCELLED) : 0u, 0u);
  // The newest is kept, ended or not.
  ASSERT_TRUE((*c)->CancelJob("job-3-ccc").ok());
  ASSERT_EQ(AwaitState(**c, "job-3-ccc", v1::JOB_CANCELLED).state(), v1::JOB_CANCELLED);
  AwaitFinished(**c, "job-3-ccc");
  auto newest = (*c)->DeleteJob("job-3-ccc");
  EXPECT_EQ(newest.status().code(), StatusCode::kFailedPrecondition) << newest.status().ToString();
  EXPECT_NE(newest.status().message().find("is the newest job"), std::string::npos) << newest.status().ToString();
  EXPECT_TRUE((*c)->GetJob("job-3-ccc").ok());
  // After a restart, the deleted jobs stay deleted.
  (*c)->Shutdown();
  c->reset();
  auto again = Coordinator::Start(Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->GetJob("job-1-aaa").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*again)->GetJob("job-2-bbb").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*again)->JobCounts().at(v1::JOB_CANCELLED), 1u);
}

TEST_F(CoordinatorJobsTest, TheJobsReplyListsTheNewestWithinItsBoundsAndCountsTheRest) {
  std::vector<v1::Job> jobs;
  for (int i = 1; i <= 1005; ++i) jobs.push_back(StoredJob("job-" + std::to_string(i) + "-abc", v1::JOB_SUCCEEDED));
  Store(jobs);
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto reply = (*c)->JobsReply();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->jobs_size(), 1000);
  EXPECT_EQ(reply->jobs(0).id(), "job-6-abc");
  EXPECT_EQ(reply->jobs(999).id(), "job-1005-abc");
  EXPECT_EQ(reply->more(), 5u);
  EXPECT_EQ((*c)->JobCounts().at(v1::JOB_SUCCEEDED), 1005u);
}

// A job's number (job-N-...) is read and stored in one step: submissions racing one
// another each get a number of their own, 1 to N with none skipped.
TEST_F(CoordinatorJobsTest, JobsSubmittedAtOnceGetDistinctNumbers) {
  auto c = Coordinator::Start(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  constexpr int kThreads = 8, kEach = 4;
  std::mutex mu;
  std::vector<std::string> ids;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        auto job = (*c)->SubmitJob(JobRunnerFixture::SmallSpec(2, 2));
        std::lock_guard<std::mutex> lock(mu);
        if (job.ok()) {
          ids.push_back(job->id());
        } else {
          errors.push_back(job.status().ToString());
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(errors.empty()) << errors.front();
  std::set<uint64_t> numbers;
  for (const std::string& id : ids) {
    ASSERT_EQ(id.rfind("job-", 0), 0u) << id;
    numbers.insert(std::stoull(id.substr(4, id.find('-', 4) - 4)));
  }
  std::set<uint64_t> expected;
  for (uint64_t n = 1; n <= kThreads * kEach; ++n) expected.insert(n);
  EXPECT_EQ(numbers, expected) << "a number was given to two jobs, or one was skipped";
  (*c)->Shutdown();
}

}  // namespace
}  // namespace tessera::server
