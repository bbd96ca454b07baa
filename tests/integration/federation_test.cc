// An in-process federation: a coordinator on port 0 and workers on threads, talking gRPC
// over loopback, training on real Fashion-MNIST.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "cli/job_client.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

TEST(FederationTest, AccuracyImprovesOverThreeRounds) {
  TempDir dir("federation");
  auto options = TestCoordinatorOptions(dir.str());
  options.chunk_bytes = 4096;      // the model travels in many chunks
  options.upload_buffer_bytes = 1;  // uploads are received one at a time; the others wait their turn
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 3; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "w" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(20)));

  auto job = (*coordinator)->SubmitJob(SmallJob(3, 3));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  std::ostringstream watched;
  Status watch = cli::WatchCommand(*stub, job->id(), watched);
  ASSERT_TRUE(watch.ok()) << watch.ToString() << "\n" << watched.str();
  EXPECT_NE(watched.str().find("final test accuracy"), std::string::npos) << watched.str();
  EXPECT_NE(watched.str().find("round total"), std::string::npos) << watched.str();

  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(30));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 3);
  for (const auto& r : done.rounds()) {
    EXPECT_EQ(r.clients_reported(), 3u);
    EXPECT_GT(r.latency().compute_ms_max(), 0);
    EXPECT_GT(r.latency().total_ms(), 0);
    EXPECT_GE(r.latency().total_ms(), r.latency().evaluation_ms());
    for (const auto& w : r.workers()) EXPECT_EQ(w.outcome(), "accepted");
  }
  const double first = done.rounds(0).test_accuracy();
  const double last = done.rounds(2).test_accuracy();
  EXPECT_GT(last, first) << "accuracy did not improve: " << first << " -> " << last;
  EXPECT_GT(last, 0.6);
  EXPECT_LT(done.rounds(2).test_loss(), done.rounds(0).test_loss());
  for (auto& w : workers) EXPECT_EQ(w->agent().rounds_trained(), 3u);
}

TEST(FederationTest, CorruptLocalDataIsReportedAndTheRoundGoesOn) {
  TempDir dir("local-data");
  // One worker's own files: the real test set with its images file cut short.
  const auto bad = dir.path() / "bad-data";
  std::filesystem::create_directories(bad);
  std::filesystem::copy_file("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz",
                             bad / "train-labels-idx1-ubyte.gz");
  {
    std::ifstream in("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(bad / "train-images-idx3-ubyte.gz", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 3));
  }
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions((dir.path() / "state").string()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread good(address, "good", kToken, "/usr/share/datasets/fashion-mnist");
  WorkerThread broken(address, "broken", kToken, bad.string());
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));

  v1::JobSpec spec = SmallJob(1, 2);
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_LOCAL_FILES);
  spec.mutable_data()->set_max_train_samples(2000);
  spec.set_min_clients(1);
  spec.set_round_deadline_ms(120000);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 1);
  const auto& round = done.rounds(0);
  EXPECT_EQ(round.clients_reported(), 1u);
  EXPECT_LT(round.latency().total_ms(), 60000) << "the round waited for the broken worker";
  bool seen = false;
  for (const auto& w : round.workers()) {
    if (w.worker_id() != "broken") continue;
    seen = true;
    EXPECT_EQ(w.outcome().rfind("failed: ", 0), 0u) << w.outcome();
    EXPECT_NE(w.outcome().find("train-images-idx3-ubyte.gz"), std::string::npos) << w.outcome();
  }
  EXPECT_TRUE(seen);
}

TEST(FederationTest, AWorkerWhoseDeviceRunsOutOfMemoryFallsBackToTheCpu) {
  TempDir dir("fallback");
  // An emulated accelerator with 64 KiB of memory: too small to train anything.
  const std::string profile = (dir.path() / "tiny.toml").string();
  {
    std::ofstream out(profile);
    out << "[tiny-npu]\npeak_tflops_fp32 = 1.0\npeak_tflops_fp16 = 2.0\nmemory_bandwidth_gbps = 10\nmemory_bytes = 65536\n"
           "host_link_gbps = 1\npower_watts = 5\nprecision = \"fp32\"\nnative_ops = [\"gemm\"]\n";
  }
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions((dir.path() / "state").string()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread small(address, "small-npu", kToken, "", "", "emu:" + profile);
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(20)));
  const auto workers = (*coordinator)->registry().List();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].device().emulated());
  EXPECT_NE(workers[0].device().name().find("emulated"), std::string::npos) << workers[0].device().name();

  auto job = (*coordinator)->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  EXPECT_EQ(done.rounds(0).workers(0).outcome(), "accepted");
  EXPECT_EQ(small.agent().rounds_trained(), 1u);
}

TEST(FederationTest, AJobWaitingForWorkersCanBeCancelled) {
  TempDir dir("cancel");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok());
  auto job = (*coordinator)->SubmitJob(SmallJob(2, 3));  // no worker will come
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto stub = JobStub((*coordinator)->port());
  std::ostringstream out;
  ASSERT_TRUE(cli::CancelCommand(*stub, job->id(), out).ok());
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(20));
  EXPECT_EQ(done.job().state(), v1::JOB_CANCELLED) << done.job().error();
  EXPECT_EQ(done.job().rounds_committed(), 0u);
  // A finished job cannot be cancelled again; the error says why.
  Status again = cli::CancelCommand(*stub, job->id(), out);
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("is cancelled; only a pending or running job can be cancelled"), std::string::npos)
      << again.message();
}

TEST(FederationTest, WorkersAreRememberedAcrossACoordinatorRestart) {
  TempDir dir("remember");
  {
    auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
    ASSERT_TRUE(coordinator.ok());
    WorkerThread worker("127.0.0.1:" + std::to_string((*coordinator)->port()), "edge-7");
    auto stub = JobStub((*coordinator)->port());
    ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(20)));
  }
  auto restarted = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(restarted.ok());
  const auto workers = (*restarted)->registry().List();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id(), "edge-7");
  EXPECT_FALSE(workers[0].alive());
  EXPECT_EQ(workers[0].device().kind(), "cpu");
  // Known, but without a session until it joins again.
  EXPECT_EQ((*restarted)->registry().Authenticate("edge-7", "").code(), StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace tessera::testing
