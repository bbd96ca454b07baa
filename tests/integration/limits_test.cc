// The coordinator's bounds as a hostile caller meets them, over mutual TLS with raw calls:
// streams that idle are ended naming the timeout, one caller cannot hold more than its
// share of streams, a round's model goes only to that round's participants, rendezvous keys
// only under the caller's own round, and list replies stay bounded whatever is stored.
#include <gtest/gtest.h>

#include <sstream>

#include "cli/job_client.h"
#include "tests/integration/harness.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::testing {
namespace {

class LimitsTest : public ::testing::Test {
 protected:
  void Start(server::CoordinatorOptions options) {
    auto started = server::Coordinator::Start(std::move(options));
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    workers_ = WorkerStub(coordinator_->port(), "w1");
    jobs_ = JobStub(coordinator_->port());
  }

  v1::JoinResponse Join(const std::string& cohort = "") {
    v1::JoinRequest join;
    join.set_name("w1");
    join.set_join_token(kToken);
    join.set_cohort(cohort);
    grpc::ClientContext ctx;
    v1::JoinResponse joined;
    grpc::Status s = workers_->Join(&ctx, join, &joined);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return joined;
  }

  TempDir dir_{"limits"};
  std::unique_ptr<server::Coordinator> coordinator_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

TEST_F(LimitsTest, AnUploadThatNeverSendsItsHeaderIsEndedAtTheIdleTimeout) {
  auto options = TestCoordinatorOptions(dir_.str());
  options.streams.idle_timeout = std::chrono::milliseconds(300);
  Start(options);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::UploadResult result;
  auto writer = workers_->UploadUpdate(&ctx, &result);  // and then nothing
  grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.error_message(),
            "upload from caller 'tessera-worker/w1': nothing received or taken for 300 ms, its idle timeout (idle_timeout)");
  EXPECT_TRUE(WaitUntil([&] { return coordinator_->streams().open() == 0; }, std::chrono::seconds(30)));
}

TEST_F(LimitsTest, ACallerCannotHoldMoreStreamsThanItsShare) {
  auto options = TestCoordinatorOptions(dir_.str());
  options.streams.max_streams_per_caller = 4;
  Start(options);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::UpdateChunkMessage>>> held;
  v1::UploadResult results[4];
  for (int i = 0; i < 4; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    held.push_back(workers_->UploadUpdate(contexts.back().get(), &results[i]));
  }
  ASSERT_TRUE(WaitUntil([&] { return coordinator_->streams().open() == 4; }, std::chrono::seconds(30)));
  grpc::ClientContext ctx;
  v1::UploadResult result;
  grpc::Status s = workers_->UploadUpdate(&ctx, &result)->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            "upload refused: caller 'tessera-worker/w1' has 4 streams open, the limit per caller (max_streams_per_caller) is 4");
  for (auto& c : contexts) c->TryCancel();
  for (auto& w : held) w->Finish().ok();
}

TEST_F(LimitsTest, AWorkerThatIsNotSelectedCannotDownloadARunningJobsModel) {
  Start(TestCoordinatorOptions(dir_.str()));
  v1::JoinResponse joined = Join();
  // Two clients needed, one worker: the job runs, but no round opens.
  grpc::ClientContext submit_ctx;
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SmallJob(1, 2, 600);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(jobs_->SubmitJob(&submit_ctx, submit, &submitted).ok());
  const std::string job_id = submitted.job().id();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto runner = coordinator_->Runner(job_id);
        return runner && runner->Snapshot().state() == v1::JOB_RUNNING && runner->model_bytes() > 0;
      },
      std::chrono::seconds(60)));
  v1::DownloadModelRequest request;
  request.set_worker_id(joined.worker_id());
  request.set_session(joined.session());
  request.set_job_id(job_id);
  request.set_model_version(0);
  grpc::ClientContext ctx;
  auto reader = workers_->DownloadModel(&ctx, request);
  v1::ModelChunkMessage chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "download of model version 0 of job " + job_id + " refused for worker 'w1': job " +
                                   job_id + " has no round open");
}

TEST_F(LimitsTest, RendezvousKeysAreOnlyUnderTheCallersOwnOpenRound) {
  Start(TestCoordinatorOptions(dir_.str()));
  v1::JoinResponse joined = Join("site-a");
  v1::StoreRequest set;
  set.set_worker_id(joined.worker_id());
  set.set_session(joined.session());
  set.set_key("rendezvous/job-1-abcdef/7/1/site-a/rank0");  // its cohort's form, but no such round
  set.set_value("127.0.0.1:4000");
  grpc::ClientContext ctx;
  v1::StoreResponse response;
  grpc::Status s = workers_->StoreSet(&ctx, set, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "worker 'w1': key 'rendezvous/job-1-abcdef/7/1/site-a/rank0' is outside its cohort's rendezvous (expected "
            "rendezvous/JOB/ROUND/ATTEMPT/site-a/... of the round it takes part in; job 'job-1-abcdef' is not running)");
  EXPECT_EQ(coordinator_->rendezvous().size(), 0u);
}

TEST_F(LimitsTest, AWorkerListLongerThanTheReplyBoundSaysHowManyMoreThereAre) {
  Start(TestCoordinatorOptions(dir_.str()));
  // Straight into the registry: a thousand certificates would only slow the test down.
  for (int i = 0; i < 1005; ++i) {
    v1::JoinRequest join;
    join.set_name("worker-" + std::to_string(i));
    ASSERT_TRUE(coordinator_->registry().Join(join).ok());
  }
  grpc::ClientContext ctx;
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok());
  EXPECT_EQ(listed.workers_size(), 1000);
  std::ostringstream out;
  ASSERT_TRUE(cli::WorkersCommand(*jobs_, out).ok());
  EXPECT_NE(out.str().find("(5 more workers not shown)"), std::string::npos) << out.str().substr(0, 2000);
}

TEST_F(LimitsTest, AWorkerListOfLargeDevicesStaysUnderTheCommandLinesReceiveLimit) {
  Start(TestCoordinatorOptions(dir_.str()));
  for (int i = 0; i < 300; ++i) {
    v1::JoinRequest join;
    join.set_name("worker-" + std::to_string(i));
    for (int p = 0; p < 64; ++p) (*join.mutable_device()->mutable_properties())["p" + std::to_string(p)] = std::string(256, 'v');
    ASSERT_TRUE(coordinator_->registry().Join(join).ok());
  }
  std::ostringstream out;
  Status listed = cli::WorkersCommand(*jobs_, out);
  ASSERT_TRUE(listed.ok()) << listed.ToString();
  EXPECT_NE(out.str().find("more workers not shown)"), std::string::npos);
}

}  // namespace
}  // namespace tessera::testing
