// A short real job per client-side algorithm: a coordinator on port 0 and workers on threads
// over gRPC, training on real Fashion-MNIST. Each job must commit every round with every
// selected client accepted, and its model must improve.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

struct JobRun {
  v1::GetJobResponse done;
  std::string log;  // what went wrong, for messages
};

struct WorkerSpec {
  WorkerSpec(std::string device_name = "cpu", std::string cohort_name = "")  // implicit: {"emu:a100"} reads well
      : device(std::move(device_name)), cohort(std::move(cohort_name)) {}
  std::string device;
  std::string cohort;  // empty: a lone worker
};

// Runs `spec` on one worker per entry of `workers` (named w1, w2, ...) until it ends.
JobRun RunJob(const std::string& tag, const v1::JobSpec& spec, const std::vector<WorkerSpec>& devices) {
  TempDir dir(tag);
  auto options = TestCoordinatorOptions(dir.str());
  options.chunk_bytes = 16384;  // the model and its sets travel in many chunks
  auto coordinator = server::Coordinator::Start(options);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  if (!coordinator.ok()) return {};
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (size_t i = 0; i < devices.size(); ++i) {
    workers.push_back(std::make_unique<WorkerThread>(address, "w" + std::to_string(i + 1), kToken, "", devices[i].cohort,
                                                     devices[i].device));
  }
  auto stub = JobStub((*coordinator)->port());
  EXPECT_TRUE(WaitForWorkers(*stub, devices.size(), std::chrono::seconds(30)));
  auto job = (*coordinator)->SubmitJob(spec);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  if (!job.ok()) return {};
  JobRun run;
  run.done = WaitForJob(*stub, job->id(), std::chrono::seconds(600));
  run.log = run.done.job().error();
  for (const auto& r : run.done.rounds()) {
    for (const auto& w : r.workers()) run.log += "\nround " + std::to_string(r.round()) + " " + w.worker_id() + ": " + w.outcome();
  }
  return run;
}

// Every round committed with `reporting` accepted updates, and the model got better.
void ExpectCommittedAndImproving(const JobRun& run, uint32_t rounds, uint32_t reporting) {
  ASSERT_EQ(run.done.job().state(), v1::JOB_SUCCEEDED) << run.log;
  ASSERT_EQ(run.done.rounds_size(), static_cast<int>(rounds)) << run.log;
  for (const auto& r : run.done.rounds()) {
    EXPECT_EQ(r.clients_reported(), reporting) << run.log;
    for (const auto& w : r.workers()) EXPECT_EQ(w.outcome(), "accepted") << run.log;
  }
  const auto& first = run.done.rounds(0);
  const auto& last = run.done.rounds(static_cast<int>(rounds) - 1);
  EXPECT_GT(last.test_accuracy(), first.test_accuracy()) << "accuracy did not improve";
  EXPECT_LT(last.test_loss(), first.test_loss());
  EXPECT_GT(last.test_accuracy(), 0.6);
}

// FedProx on a mix of devices: the proximal term runs on the CPU, natively on an emulated
// A100 and as a host fallback on the emulated edge NPU (fp16).
TEST(ClientAlgorithmJobTest, FedProxCommitsAndImprovesOnMixedDevices) {
  v1::JobSpec spec = SmallJob(3, 3);
  spec.set_strategy("fedprox");
  spec.set_proximal_mu(0.01);
  const JobRun run = RunJob("fedprox", spec, {{"cpu"}, {"emu:a100"}, {"emu:edge-npu"}});
  ExpectCommittedAndImproving(run, 3, 3);
}

// FedNova over parties of different sizes (quantity skew): the clients take different
// numbers of local steps, which is what it normalises.
TEST(ClientAlgorithmJobTest, FedNovaCommitsAndImprovesWithUnequalLocalSteps) {
  v1::JobSpec spec = SmallJob(3, 3);
  spec.set_strategy("fednova");
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_QUANTITY);
  spec.mutable_data()->mutable_partition()->set_beta(5.0);
  const JobRun run = RunJob("fednova", spec, {{"cpu"}, {"cpu"}, {"cpu"}});
  ExpectCommittedAndImproving(run, 3, 3);
  // The parties' sizes differ, so their samples (and steps) do.
  std::set<uint64_t> samples;
  for (const auto& w : run.done.rounds(0).workers()) samples.insert(w.samples());
  EXPECT_GT(samples.size(), 1u) << run.log;
}

// SCAFFOLD with client sub-sampling: two of three parties a round, so every round some seats
// keep their variates while others move.
TEST(ClientAlgorithmJobTest, ScaffoldCommitsAndImprovesWithSubSampling) {
  v1::JobSpec spec = SmallJob(4, 3);
  spec.set_strategy("scaffold");
  spec.set_clients_per_round(2);
  spec.set_min_clients(2);
  const JobRun run = RunJob("scaffold", spec, {{"cpu"}, {"cpu"}, {"emu:generic"}});
  ExpectCommittedAndImproving(run, 4, 2);
  for (const auto& r : run.done.rounds()) EXPECT_EQ(r.clients_selected(), 2u);
}

// SCAFFOLD with a site cohort as one of its clients: both members download the seat's
// variates and correct the gradient they average alike; the leader uploads.
TEST(ClientAlgorithmJobTest, ScaffoldCommitsAndImprovesWithASiteCohort) {
  v1::JobSpec spec = SmallJob(3, 2, 4000);
  spec.set_strategy("scaffold");
  const JobRun run = RunJob("scaffold-cohort", spec, {{"cpu", ""}, {"cpu", "site"}, {"cpu", "site"}});
  ExpectCommittedAndImproving(run, 3, 2);
  bool cohort_seen = false;
  for (const auto& w : run.done.rounds(2).workers()) {
    if (w.cohort() == "site") cohort_seen = w.members_size() == 2;
  }
  EXPECT_TRUE(cohort_seen) << run.log;
}

// An asynchronous job whose one client is a site cohort: each of its tasks opens a rendezvous
// prefix of its own (rendezvous/JOB/TASK/1/COHORT/), which the store must take the members'
// keys under, and the cohort's updates are folded like a lone worker's.
TEST(ClientAlgorithmJobTest, AnAsynchronousJobFoldsASiteCohortsUpdates) {
  v1::JobSpec spec = SmallJob(3, 1, 4000);
  auto* async = spec.mutable_async();
  async->set_buffer_size(1);
  async->set_max_staleness(3);
  async->set_staleness_weighting("constant");
  async->set_concurrency(1);
  const JobRun run = RunJob("async-cohort", spec, {{"cpu", "site"}, {"cpu", "site"}});
  ASSERT_EQ(run.done.job().state(), v1::JOB_SUCCEEDED) << run.log;
  ASSERT_EQ(run.done.rounds_size(), 3) << run.log;
  for (const auto& r : run.done.rounds()) {
    ASSERT_EQ(r.workers_size(), 1) << run.log;
    EXPECT_EQ(r.workers(0).cohort(), "site") << run.log;
    EXPECT_EQ(r.workers(0).members_size(), 2) << run.log;
    EXPECT_EQ(r.workers(0).outcome().rfind("accepted", 0), 0u) << run.log;
  }
}

// FedNova and SCAFFOLD on a model with a batch norm, whose running statistics (buffers) take
// the sample-weighted mean of the deltas: over parties of different sizes, every client's
// update is accepted (SCAFFOLD's variate changes within the bound their deltas set) and the
// model improves.
TEST(ClientAlgorithmJobTest, FedNovaAndScaffoldTrainAModelWithBatchNorm) {
  for (const char* strategy : {"fednova", "scaffold"}) {
    SCOPED_TRACE(strategy);
    v1::JobSpec spec = SmallJob(3, 3);
    spec.set_strategy(strategy);
    spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_QUANTITY);
    spec.mutable_data()->mutable_partition()->set_beta(5.0);
    v1::ModelSpec& model = *spec.mutable_model();
    model.clear_hidden();
    model.set_name("declared");
    v1::LayerSpec* conv = model.add_layers();
    conv->set_type("conv2d");
    conv->set_out(4);
    conv->set_kernel(3);
    conv->set_padding(1);
    for (const char* type : {"batch_norm", "relu", "max_pool", "flatten", "linear"}) model.add_layers()->set_type(type);
    const JobRun run = RunJob(std::string("batch-norm-") + strategy, spec, {{"cpu"}, {"cpu"}, {"cpu"}});
    ExpectCommittedAndImproving(run, 3, 3);
  }
}

}  // namespace
}  // namespace tessera::testing
