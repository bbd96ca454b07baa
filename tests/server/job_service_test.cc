// The job service as any client reaches it: calls made over gRPC to a coordinator on a free
// loopback port, with requests the command line would never send.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "proto/record_bounds.h"
#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "server/state/sqlite_state_store.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tests/server/fake_worker.h"
#include "tests/server/job_runner_fixture.h"
#include "tests/server/test_directory.h"
#include "tests/server/worst_round_record.h"

namespace tessera::server {
namespace {

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTestDirectory("tessera-job-service"); }
  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    options_ = LoopbackCoordinatorOptions(dir_, "job-service");
    auto started = Coordinator::Start(options_);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    // gRPC's default 4 MiB receive limit.
    jobs_ = v1::JobService::NewStub(*LoopbackAdminChannel(coordinator_->port(), options_.admin_token));
  }

  // Writes jobs and round records into the state directory before the coordinator starts.
  void Store(const std::vector<v1::Job>& jobs, const std::vector<v1::RoundRecord>& rounds = {}) {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (const auto& job : jobs) ASSERT_TRUE((*store)->InsertJob(job).ok());
    for (const auto& r : rounds) {
      v1::Job job;
      for (const auto& j : jobs) {
        if (j.id() == r.job_id()) job = j;
      }
      job.set_rounds_committed(r.round());
      const TensorSet model = {{"w", {2}, {1.0f, 2.0f}}};
      *job.mutable_last_round() = r;
      ASSERT_TRUE((*store)->CommitRound(job, r, model).ok());
    }
  }

  static v1::Job EndedJob(const std::string& id) {
    v1::Job job;
    job.set_id(id);
    *job.mutable_spec() = JobRunnerFixture::SmallSpec(2, 2);
    job.set_state(v1::JOB_SUCCEEDED);
    return job;
  }

  grpc::Status Submit(const v1::JobSpec& spec, v1::SubmitJobResponse* response) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    return jobs_->SubmitJob(&ctx, request, response);
  }

  std::filesystem::path dir_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

// A running job's last round as GetJob and CancelJob answer it: its summary, as the list and
// the store give it, not every client's report again (they are in the round's own record).
// A worker's long failure is cut to its bound in the round's record.
TEST_F(JobServiceTest, ARunningJobsRepliesCarryItsLastRoundWithoutTheClientsReports) {
  Start();
  v1::JobSpec spec = JobRunnerFixture::SmallSpec(2, 1);
  spec.set_rounds(2);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(Submit(spec, &submitted).ok());
  const std::string id = submitted.job().id();
  auto runner = [this, id] { return coordinator_->Runner(id); };
  const std::string long_failure(5 << 20, 'x');
  std::vector<std::shared_ptr<FakeWorker>> workers;
  for (const std::string name : {"alpha", "beta"}) {
    workers.push_back(std::make_shared<FakeWorker>(
        &coordinator_->registry(), name,
        [name, &long_failure](const v1::TrainTask& task) {
          if (task.round() > 1) return FakeAction::Hang();
          return name == "alpha" ? FakeAction::Upload() : FakeAction::Fail(long_failure);
        },
        runner));
    ASSERT_TRUE(workers.back()->Start().ok());
  }
  ASSERT_TRUE(workers[0]->AwaitTrainTask(2, 1)) << "round 1 was not committed";
  auto job = coordinator_->GetJob(id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->rounds_committed(), 1u);
  // The failure is in the round's record cut to its bound (proto/record_bounds.h).
  ASSERT_EQ(job->last_round().workers_size(), 2);
  for (const auto& report : job->last_round().workers()) {
    if (report.worker_id() != "beta") continue;
    EXPECT_LE(report.outcome().size(), wire::kMaxOutcomeBytes);
    EXPECT_EQ(report.outcome().rfind("failed: xxx", 0), 0u) << report.outcome().substr(0, 64);
    EXPECT_EQ(report.outcome().substr(report.outcome().size() - 3), "\xE2\x80\xA6");
  }

  grpc::ClientContext get_ctx;
  v1::GetJobRequest get;
  get.set_job_id(id);
  v1::GetJobResponse got;
  grpc::Status s = jobs_->GetJob(&get_ctx, get, &got);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(got.job().last_round().round(), 1u);
  EXPECT_EQ(got.job().last_round().workers_size(), 0);

  // With its rounds: the round's record, once.
  grpc::ClientContext rounds_ctx;
  get.set_include_rounds(true);
  get.set_from_round(2);
  s = jobs_->GetJob(&rounds_ctx, get, &got);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(got.job().last_round().workers_size(), 0);
  EXPECT_EQ(got.rounds_size(), 0);

  grpc::ClientContext cancel_ctx;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  s = jobs_->CancelJob(&cancel_ctx, cancel, &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  // Pending until the job ends, which it may have done by the reply: then its state says so.
  EXPECT_TRUE(cancelled.job().cancel_requested() || cancelled.job().state() == v1::JOB_CANCELLED)
      << v1::JobState_Name(cancelled.job().state());
  EXPECT_EQ(cancelled.job().last_round().workers_size(), 0);
  for (auto& w : workers) w->Stop();
}

// The largest round a job can have, clients_per_round = 10,000 doubled by over-selection,
// every report's text past its bound (as a record stored before the bounds held could be):
// GetJob and WatchJob serve it bounded, and the command line's channel reads it whole, where
// gRPC's default 4 MiB receive limit refuses it.
TEST_F(JobServiceTest, TheLargestRoundIsReadWholeThroughTheCommandLinesChannel) {
  v1::Job job = EndedJob("worst-round");
  v1::RoundRecord stored = wire::testing::WorstRecord(job.id(), 1, /*over=*/100);
  ASSERT_GT(stored.ByteSizeLong(), wire::kMaxRoundRecordBytes);
  Store({job}, {stored});
  stored.Clear();
  Start();
  auto channel = LoopbackAdminChannel(coordinator_->port(), options_.admin_token, wire::OperatorChannelArguments());
  ASSERT_TRUE(channel.ok()) << channel.status().ToString();
  auto cli = v1::JobService::NewStub(*channel);

  auto check = [](const v1::RoundRecord& round) {
    EXPECT_EQ(round.round(), 1u);
    ASSERT_EQ(static_cast<size_t>(round.workers_size()), wire::kMaxRoundReports);
    EXPECT_LE(round.ByteSizeLong(), wire::kMaxRoundRecordBytes);
    EXPECT_GT(round.ByteSizeLong(), size_t{4} << 20);
    const v1::WorkerRoundReport& last = round.workers(round.workers_size() - 1);
    EXPECT_EQ(last.outcome().size(), wire::kMaxOutcomeBytes);
    EXPECT_EQ(static_cast<size_t>(last.members_size()), wire::kMaxListedMembers);
    EXPECT_EQ(last.worker_id().size(), kMaxNameBytes);
  };
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest get;
    get.set_job_id(job.id());
    get.set_include_rounds(true);
    v1::GetJobResponse got;
    const grpc::Status s = cli->GetJob(&ctx, get, &got);
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    ASSERT_EQ(got.rounds_size(), 1);
    check(got.rounds(0));
  }
  {
    grpc::ClientContext ctx;
    v1::WatchJobRequest watch;
    watch.set_job_id(job.id());
    auto reader = cli->WatchJob(&ctx, watch);
    v1::JobEvent event;
    int rounds = 0;
    while (reader->Read(&event)) {
      if (!event.has_round()) continue;
      ++rounds;
      check(event.round());
    }
    const grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_EQ(rounds, 1);
  }
  {  // gRPC's default receive limit: the record passes it.
    grpc::ClientContext ctx;
    v1::GetJobRequest get;
    get.set_job_id(job.id());
    get.set_include_rounds(true);
    v1::GetJobResponse got;
    EXPECT_EQ(jobs_->GetJob(&ctx, get, &got).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
}

}  // namespace
}  // namespace tessera::server
