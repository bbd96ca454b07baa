// Bad input at the coordinator's doors: a wrong join token, an invalid job spec, and updates
// with a wrong shape, NaN, or for a past round. Each is refused with a reason that names it,
// and the job goes on unharmed.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>

#include <iostream>

#include "proto/job_mapping.h"
#include "proto/tensor_transfer.h"
#include "tests/integration/harness.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "proto/update_envelope.h"
#include "worker/coordinator_client.h"

namespace tessera::testing {
namespace {

TEST(BadInputTest, AWrongJoinTokenIsRefused) {
  TempDir dir("token");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread intruder(address, "intruder", "not-the-token");
  ASSERT_TRUE(intruder.WaitDone(std::chrono::seconds(20)));
  EXPECT_EQ(intruder.result().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(intruder.result().message().find("join token"), std::string::npos) << intruder.result().message();
  EXPECT_NE(intruder.result().message().find("intruder"), std::string::npos) << intruder.result().message();
  EXPECT_TRUE((*coordinator)->registry().List().empty());
}

TEST(BadInputTest, AnInvalidJobSpecIsRefusedNamingTheField) {
  TempDir dir("spec");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok());
  v1::JobSpec spec = SmallJob(2, 3);
  spec.set_min_clients(5);
  auto job = (*coordinator)->SubmitJob(spec);
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("spec.min_clients"), std::string::npos) << job.status().message();
  spec = SmallJob(2, 3);
  spec.mutable_model()->set_name("resnet-9000");
  job = (*coordinator)->SubmitJob(spec);
  EXPECT_NE(job.status().message().find("spec.model.name"), std::string::npos) << job.status().message();
  auto jobs = (*coordinator)->ListJobs(SIZE_MAX);
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->jobs.empty());
  EXPECT_EQ(jobs->total, 0u);
}

// A worker that speaks the protocol by hand and sends what it is told to.
class RogueWorker {
 public:
  RogueWorker(const std::string& address)
      : hand_(std::make_unique<HandWorker>(address, "rogue", [this](const v1::TrainTask& task) { OnTask(task); })) {}

  std::vector<v1::UploadResult> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  void Upload(const v1::TrainTask& task, uint32_t round, const TensorSet& delta) {
    v1::UpdateHeader header;
    header.set_worker_id(hand_->joined().worker_id());
    header.set_session(hand_->joined().session());
    header.set_job_id(task.job_id());
    header.set_round(round);
    header.set_attempt(task.attempt());
    header.set_base_model_version(task.model_version());
    header.set_samples(100);
    wire::UpdateBytes bytes;
    wire::AppendUpdateSet(wire::kDeltaSet, delta, UpdateEncoding::kFloat32, 0, 1 << 20, &header, &bytes);
    auto result = hand_->client().UploadUpdate(header, std::make_shared<const wire::UpdateBytes>(bytes), 1 << 20, 0);
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    std::lock_guard<std::mutex> lock(mu_);
    results_.push_back(*result);
  }

  void OnTask(const v1::TrainTask& task) {
    auto model = hand_->Download(task);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    TensorSet delta = *model;
    for (auto& t : delta) std::fill(t.values.begin(), t.values.end(), 0.0f);
    if (task.round() == 1) {  // a wrong shape
      delta[0].shape[0] += 1;
      delta[0].values.resize(static_cast<size_t>(delta[0].NumElements()));
      Upload(task, 1, delta);
    } else if (task.round() == 2) {  // NaN
      delta[1].values[3] = std::numeric_limits<float>::quiet_NaN();
      Upload(task, 2, delta);
    } else {  // for a past round, then an honest (empty) update
      Upload(task, task.round() - 1, delta);
      Upload(task, task.round(), delta);
    }
  }

  std::mutex mu_;
  std::vector<v1::UploadResult> results_;
  std::unique_ptr<HandWorker> hand_;  // last: its threads end before the members above go
};

TEST(BadInputTest, BadUpdatesAreRefusedAndTheJobIsUnharmed) {
  TempDir dir("updates");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread w1(address, "honest-1");
  WorkerThread w2(address, "honest-2");
  RogueWorker rogue(address);
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(20)));

  v1::JobSpec spec = SmallJob(3, 3);
  spec.set_min_clients(2);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(90));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 3);

  auto outcome_of_rogue = [&](int round) {
    for (const auto& w : done.rounds(round).workers()) {
      if (w.worker_id() == "rogue") return w.outcome();
    }
    return std::string("not selected");
  };
  EXPECT_NE(outcome_of_rogue(0).find("rejected"), std::string::npos) << outcome_of_rogue(0);
  EXPECT_NE(outcome_of_rogue(0).find("expected shape"), std::string::npos) << outcome_of_rogue(0);
  EXPECT_NE(outcome_of_rogue(1).find("NaN"), std::string::npos) << outcome_of_rogue(1);
  EXPECT_EQ(outcome_of_rogue(2), "accepted");

  auto results = rogue.results();
  ASSERT_EQ(results.size(), 4u);
  EXPECT_FALSE(results[0].accepted());
  EXPECT_NE(results[0].reason().find("rogue"), std::string::npos) << results[0].reason();
  EXPECT_FALSE(results[1].accepted());
  EXPECT_FALSE(results[2].accepted());
  EXPECT_NE(results[2].reason().find("past round"), std::string::npos) << results[2].reason();
  EXPECT_TRUE(results[3].accepted()) << results[3].reason();

  // The refused updates never reached the aggregate: the model learned.
  for (const auto& r : done.rounds()) {
    EXPECT_TRUE(std::isfinite(r.test_loss()));
    // Real training stays far below the default bound on an update's norm.
    for (const auto& w : r.workers()) {
      if (w.outcome() != "accepted" || w.worker_id().rfind("honest", 0) != 0) continue;
      std::cout << "round " << r.round() << " " << w.worker_id() << ": update norm " << w.update_norm() << "\n";
      EXPECT_GT(w.update_norm(), 0);
      EXPECT_LT(w.update_norm(), wire::kDefaultMaxUpdateNorm / 10);
    }
    EXPECT_EQ(r.clients_reported(), r.round() == 3 ? 3u : 2u);
  }
  EXPECT_GT(done.rounds(2).test_accuracy(), 0.5);
}

TEST(BadInputTest, TheCoordinatorOpensItsOwnDataDirectoryNotTheOneASpecNames) {
  // A spec's data.path is where the workers read; the coordinator evaluates on --data-dir.
  TempDir dir("data-dir");
  server::CoordinatorOptions options = TestCoordinatorOptions(dir.str() + "/state");
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  v1::JobSpec spec = SmallJob(1, 1);
  spec.mutable_data()->set_path(dir.str() + "/somewhere-the-submitter-chose");
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  // Prepared from the operator's directory: the job waits for workers instead of failing.
  ASSERT_TRUE(WaitUntil([&] { return (*coordinator)->GetJob(job->id())->state() == v1::JOB_RUNNING; },
                        std::chrono::seconds(60)))
      << (*coordinator)->GetJob(job->id())->error();
  (*coordinator)->Shutdown();
  coordinator->reset();

  // And an operator's directory without the dataset fails the job naming that directory,
  // whatever the spec says.
  options = TestCoordinatorOptions(dir.str() + "/state-2");
  options.runner.data_dir = dir.str() + "/operator-has-no-dataset";
  coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  spec = SmallJob(1, 1);  // data.path empty: the Debian dataset, which exists
  job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto stub = JobStub((*coordinator)->port());
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  EXPECT_EQ(done.job().state(), v1::JOB_FAILED);
  EXPECT_NE(done.job().error().find("operator-has-no-dataset"), std::string::npos) << done.job().error();
}

TEST(BadInputTest, AJobSpecBeyondTheLimitsIsRefusedAtSubmissionWithTheEstimate) {
  TempDir dir("spec-limits");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok());
  auto stub = JobStub((*coordinator)->port());
  // Once an uncaught std::bad_alloc in the job's thread.
  v1::SubmitJobRequest request;
  *request.mutable_spec() = SmallJob(1, 1);
  request.mutable_spec()->mutable_model()->set_hidden(0, 600000);
  grpc::ClientContext ctx;
  v1::SubmitJobResponse response;
  grpc::Status refused = stub->SubmitJob(&ctx, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("spec.model.hidden[0]: expected an integer in [1, 65536], got 600000"),
            std::string::npos)
      << refused.error_message();
  request.mutable_spec()->mutable_model()->clear_hidden();
  for (int i = 0; i < 3; ++i) request.mutable_spec()->mutable_model()->add_hidden(65536);
  grpc::ClientContext ctx2;
  refused = stub->SubmitJob(&ctx2, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("spec.model: expected a model the coordinator can hold"), std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("(an estimated 329673 MiB)"), std::string::npos) << refused.error_message();
  auto jobs = (*coordinator)->ListJobs(SIZE_MAX);
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->jobs.empty());
  EXPECT_EQ(jobs->total, 0u);
}

}  // namespace
}  // namespace tessera::testing
