// WatchJob against a coordinator on a free loopback port: a round committed while a watch
// starts (between its read of the committed rounds and its first look at the live log) is
// sent, once.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tests/server/fake_worker.h"
#include "tests/server/job_runner_fixture.h"
#include "tests/server/stream_reader.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

constexpr auto kWait = std::chrono::seconds(60);

class JobWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-job-watch");
    options_ = LoopbackCoordinatorOptions(dir_, "job-watch");
  }
  void TearDown() override {
    for (auto& worker : workers_) worker->Stop();
    if (coordinator_) coordinator_->Shutdown();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    auto started = Coordinator::Start(options_);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    wire::ClientTls plaintext;
    plaintext.insecure = true;
    plaintext.admin_token = options_.admin_token;
    jobs_ = v1::JobService::NewStub(*wire::MakeChannel("127.0.0.1:" + std::to_string(coordinator_->port()), plaintext));
  }

  std::string Submit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    grpc::Status s = jobs_->SubmitJob(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job().id();
  }

  // A watch of `job_id` from `from_round`, begun.
  std::unique_ptr<StreamReader<v1::JobEvent>> Watch(const std::string& job_id, uint32_t from_round) {
    auto watch = std::make_unique<StreamReader<v1::JobEvent>>();
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_round(from_round);
    jobs_->async()->WatchJob(watch->context(), &request, watch.get());
    watch->Begin();
    return watch;
  }

  // A worker that uploads for every task, joined to the coordinator.
  void AddWorker(const std::string& name, const std::string& job_id) {
    workers_.push_back(std::make_shared<FakeWorker>(
        &coordinator_->registry(), name, [](const v1::TrainTask&) { return FakeAction::Upload(); },
        [this, job_id] { return coordinator_->Runner(job_id); }));
    ASSERT_TRUE(workers_.back()->Start().ok());
  }

  std::filesystem::path dir_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::shared_ptr<FakeWorker>> workers_;
};

// The job runs its only round and ends while the watch's first read of the store (it had no
// rounds yet) has returned and the watch has not yet looked at the live log; then the log is
// filled past its capacity, so that the round's event is no longer kept in it. A watch that
// took its place in the log only after the read would start past the round's event and never
// send the round; one placed before the read learns that the log dropped events it had not
// read, and reads the round from the store.
TEST_F(JobWatchTest, ARoundCommittedBetweenTheWatchsReadAndItsPlaceInTheLogIsSentOnce) {
  std::atomic<bool> ran{false};
  std::string job_id;
  options_.watch_page_read_hook = [this, &ran, &job_id](const std::string& id) {
    if (id != job_id || ran.exchange(true)) return;
    AddWorker("w1", id);
    auto runner = coordinator_->Runner(id);
    ASSERT_NE(runner, nullptr);
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!runner->finished() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(runner->finished()) << "the job did not end";
    for (size_t i = 0; i < runner->events().capacity(); ++i) {
      v1::JobEvent filler;
      filler.set_message("filler " + std::to_string(i));
      runner->events().Publish(std::move(filler));
    }
  };
  Start();
  job_id = Submit(JobRunnerFixture::SmallSpec(1, 1));  // one round; no worker yet
  ASSERT_FALSE(job_id.empty());
  auto watch = Watch(job_id, 0);
  ASSERT_TRUE(watch->WaitDone(kWait));
  ASSERT_TRUE(ran.load()) << "the watch never read the store";
  EXPECT_TRUE(watch->status().ok()) << watch->status().error_message();
  auto job = coordinator_->GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->state(), v1::JOB_SUCCEEDED) << job->error();
  std::vector<uint32_t> rounds;
  for (const auto& event : watch->received()) {
    if (event.has_round()) rounds.push_back(event.round().round());
  }
  EXPECT_EQ(rounds, std::vector<uint32_t>{1}) << "the round committed as the watch started";
}

}  // namespace
}  // namespace tessera::server
