// A round's streams on a real coordinator over gRPC: a model download stops at its next chunk
// boundary once its round has ended, and a rendezvous wait whose caller goes away gives its
// place among the caller's streams back at once, not at the wait's timeout.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "tests/server/fake_worker.h"
#include "tests/server/job_runner_fixture.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

constexpr char kName[] = "round-streams";

// Polls `done` until it holds or kWaitLimit passes; returns whether it holds.
template <typename Done>
bool PollUntil(Done done) {
  const auto limit = std::chrono::steady_clock::now() + kWaitLimit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

class RoundStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-round-streams");
    CoordinatorOptions options = LoopbackCoordinatorOptions(dir_, kName);
    options.registry.heartbeat_timeout_ms = 600000;  // this worker never heartbeats
    // A wait far longer than any bound of this test: only its caller's cancel can end it.
    options.rendezvous.max_wait = std::chrono::milliseconds(600000);
    auto started = Coordinator::Start(options);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    wire::ClientTls plaintext;
    plaintext.insecure = true;
    // The client's receive window stays small (no BDP probing): a download that the test does
    // not read holds the coordinator's next write, as a slow worker does.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
    auto channel = wire::MakeChannel("127.0.0.1:" + std::to_string(coordinator_->port()), plaintext, args);
    ASSERT_TRUE(channel.ok()) << channel.status().ToString();
    workers_ = v1::WorkerService::NewStub(*channel);
  }

  void TearDown() override {
    if (channel_ctx_) channel_ctx_->TryCancel();
    if (channel_reader_.joinable()) channel_reader_.join();
    if (coordinator_) coordinator_->Shutdown();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Joins one worker (in `cohort`, when given) and opens its task channel.
  void JoinWorker(const std::string& cohort = "") {
    v1::JoinRequest join;
    join.set_name("w1");
    join.set_join_token(std::string(kName) + "-token");
    join.set_cohort(cohort);
    grpc::ClientContext ctx;
    grpc::Status s = workers_->Join(&ctx, join, &joined_);
    ASSERT_TRUE(s.ok()) << s.error_message();
    channel_ctx_ = std::make_unique<grpc::ClientContext>();
    v1::TaskChannelRequest open;
    open.set_worker_id(joined_.worker_id());
    open.set_session(joined_.session());
    channel_reader_ = std::thread([this, open] {
      auto reader = workers_->OpenTaskChannel(channel_ctx_.get(), open);
      v1::Task task;
      while (reader->Read(&task)) {
        if (!task.has_train()) continue;
        std::lock_guard<std::mutex> lock(mu_);
        if (!train_) train_ = task.train();
        cv_.notify_all();
      }
      reader->Finish().ok();
    });
  }

  // Submits `spec` and waits for the worker's train task.
  v1::TrainTask RunUntilTrainTask(const v1::JobSpec& spec) {
    auto job = coordinator_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, kWaitLimit, [&] { return train_.has_value(); })) << "no train task";
    return train_.value_or(v1::TrainTask());
  }

  std::filesystem::path dir_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  v1::JoinResponse joined_;
  std::unique_ptr<grpc::ClientContext> channel_ctx_;
  std::thread channel_reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<v1::TrainTask> train_;
};

TEST_F(RoundStreamsTest, ADownloadStopsAtItsNextChunkBoundaryOnceItsRoundHasEnded) {
  ASSERT_NO_FATAL_FAILURE(JoinWorker());
  v1::JobSpec spec = JobRunnerFixture::SmallSpec(1, 1, 600000);
  spec.mutable_model()->clear_hidden();
  spec.mutable_model()->add_hidden(2048);  // about 6.5 MB: far more than the client's window
  const v1::TrainTask task = RunUntilTrainTask(spec);
  ASSERT_EQ(task.round(), 1u);
  const size_t streams_before = coordinator_->streams().open();

  v1::DownloadModelRequest request;
  request.set_worker_id(joined_.worker_id());
  request.set_session(joined_.session());
  request.set_job_id(task.job_id());
  request.set_model_version(task.model_version());
  grpc::ClientContext ctx;
  auto reader = workers_->DownloadModel(&ctx, request);
  v1::ModelChunkMessage message;
  ASSERT_TRUE(reader->Read(&message));
  ASSERT_TRUE(message.has_manifest());
  EXPECT_EQ(coordinator_->streams().open(), streams_before + 1);

  // The round ends (the job is cancelled) while the coordinator waits for the worker to take
  // its next write.
  ASSERT_TRUE(coordinator_->CancelJob(task.job_id()).ok());
  ASSERT_TRUE(PollUntil([&] {
    auto runner = coordinator_->Runner(task.job_id());
    return runner == nullptr || runner->finished();
  }));
  while (reader->Read(&message)) {
  }
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(s.error_message(), "download of model version 0 of job " + task.job_id() + " by worker '" +
                                   joined_.worker_id() + "' stopped: job " + task.job_id() +
                                   " round 1 attempt 1 has ended for this worker");
  // Its place among the caller's streams is given back.
  EXPECT_TRUE(PollUntil([&] { return coordinator_->streams().open() == streams_before; }))
      << coordinator_->streams().open() << " streams open, " << streams_before << " before the download";
}

TEST_F(RoundStreamsTest, ARendezvousWaitWhoseCallerCancelsGivesItsStreamBackAtOnce) {
  ASSERT_NO_FATAL_FAILURE(JoinWorker("site"));
  const v1::TrainTask task = RunUntilTrainTask(JobRunnerFixture::SmallSpec(1, 1, 600000));
  ASSERT_FALSE(task.rendezvous_prefix().empty());
  const size_t streams_before = coordinator_->streams().open();

  v1::StoreRequest request;
  request.set_worker_id(joined_.worker_id());
  request.set_session(joined_.session());
  request.set_key(task.rendezvous_prefix() + "never-set");
  request.set_wait_ms(600000);
  grpc::ClientContext ctx;
  v1::StoreResponse response;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<grpc::Status> answered;
  workers_->async()->StoreGet(&ctx, &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    answered = s;
    cv.notify_all();
  });
  ASSERT_TRUE(PollUntil([&] { return coordinator_->streams().open() == streams_before + 1; }))
      << "the wait holds no stream";

  ctx.TryCancel();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWaitLimit, [&] { return answered.has_value(); }));
    EXPECT_EQ(answered->error_code(), grpc::StatusCode::CANCELLED);
  }
  // Long before the wait's own timeout (600 s, past this bound), the coordinator lets it go.
  EXPECT_TRUE(PollUntil([&] { return coordinator_->streams().open() == streams_before; }))
      << coordinator_->streams().open() << " streams open, " << streams_before << " before the wait";
}

}  // namespace
}  // namespace tessera::server
