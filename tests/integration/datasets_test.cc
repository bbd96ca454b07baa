// Jobs on datasets other than Fashion-MNIST, end to end: the operator gives the coordinator its
// copy (--dataset NAME=DIR), the coordinator infers the model's input shape and classes at
// submit and evaluates on that copy's test split, the workers read their share from the job's
// data.path (or their own files) in the job's format. Data generated here in each format.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "cli/job_spec.h"
#include "core/data/dataset_source.h"
#include "core/data/idx.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

// A tabular task a linear model separates: three classes by which of three features is largest.
void WriteTabular(const std::string& path, int rows, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<double> noise(0.0, 0.3);
  std::vector<std::vector<double>> data;
  for (int r = 0; r < rows; ++r) {
    const int label = r % 3;
    std::vector<double> row = {static_cast<double>(label)};
    for (int f = 0; f < 4; ++f) row.push_back((f == label ? 2.0 : 0.0) + noise(engine));
    data.push_back(row);
  }
  ASSERT_TRUE(WriteCsv(path, {"species", "a", "b", "c", "d"}, data).ok());
}

// CIFAR-10-format records of two classes: a bright or a dark image with noise.
void WriteCifarLike(const std::string& path, int records, uint32_t seed) {
  std::mt19937 engine(seed);
  std::vector<uint8_t> labels, pixels;
  for (int r = 0; r < records; ++r) {
    const int label = r % 2;
    labels.push_back(static_cast<uint8_t>(label));
    for (int p = 0; p < 3072; ++p) pixels.push_back(static_cast<uint8_t>((label ? 160 : 60) + engine() % 40));
  }
  ASSERT_TRUE(WriteCifar10Batch(path, labels, pixels).ok());
}

v1::JobSpec JobOn(const std::string& dataset, const std::string& format, const std::string& path) {
  v1::JobSpec spec = SmallJob(3, 2, 0);
  spec.mutable_data()->set_dataset(dataset);
  spec.mutable_data()->set_format(format);
  spec.mutable_data()->set_path(path);
  spec.mutable_data()->set_max_test_samples(0);
  spec.mutable_model()->clear_hidden();
  spec.mutable_model()->add_hidden(16);
  spec.set_batch_size(16);
  spec.set_local_epochs(3);
  return spec;
}

TEST(DatasetsTest, CsvTabularJobTrainsOnTheInferredShape) {
  TempDir dir("datasets-csv");
  const auto data = dir.path() / "tabular";
  std::filesystem::create_directories(data);
  WriteTabular((data / "train.csv").string(), 600, 1);
  WriteTabular((data / "test.csv").string(), 150, 2);
  auto options = TestCoordinatorOptions((dir.path() / "state").string());
  options.runner.datasets["tabular"] = data.string();
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread w1(address, "w1"), w2(address, "w2");
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));

  v1::JobSpec spec = JobOn("tabular", "csv", data.string());
  spec.mutable_data()->set_label_column("species");
  // A dataset the coordinator has no copy of is refused at submit, naming the flag.
  v1::JobSpec unknown = spec;
  unknown.mutable_data()->set_dataset("iris");
  auto refused = (*coordinator)->SubmitJob(unknown);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--dataset iris=DIR"), std::string::npos) << refused.status().message();
  // A submitter may not set the shape.
  v1::JobSpec shaped = spec;
  shaped.mutable_data()->mutable_input_shape()->set_channels(4);
  EXPECT_FALSE((*coordinator)->SubmitJob(shaped).ok());

  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const v1::InputShape& shape = job->spec().data().input_shape();
  EXPECT_EQ(shape.channels(), 4u);
  EXPECT_EQ(shape.rows(), 1u);
  EXPECT_EQ(shape.cols(), 1u);
  EXPECT_EQ(shape.classes(), 3u);
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 3);
  for (const auto& w : done.rounds(2).workers()) {
    EXPECT_EQ(w.outcome(), "accepted") << w.worker_id();
    EXPECT_EQ(w.samples(), 300u) << "each party holds half of the 600 rows";
  }
  EXPECT_GT(done.rounds(2).test_accuracy(), 0.9) << "a separable task on 150 test rows";
}

TEST(DatasetsTest, Cifar10FormatWithAugmentationAndAWorkersOwnFiles) {
  TempDir dir("datasets-cifar");
  const auto data = dir.path() / "cifar";
  const auto own = dir.path() / "own";
  std::filesystem::create_directories(data);
  std::filesystem::create_directories(own);
  WriteCifarLike((data / "data_batch_1.bin").string(), 120, 1);
  WriteCifarLike((data / "test_batch.bin").string(), 40, 2);
  WriteCifarLike((own / "data_batch_1.bin").string(), 60, 3);
  auto options = TestCoordinatorOptions((dir.path() / "state").string());
  options.runner.datasets["cifar-like"] = data.string();
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread w1(address, "w1", kToken, own.string()), w2(address, "w2", kToken, own.string());
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));

  v1::JobSpec spec = JobOn("cifar-like", "cifar10", "");
  spec.mutable_model()->set_name("simplecnn");
  spec.mutable_model()->clear_hidden();
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_LOCAL_FILES);
  spec.mutable_data()->mutable_partition()->set_parties(0);
  spec.mutable_data()->add_mean(0.5f);
  spec.mutable_data()->add_std(0.25f);
  spec.mutable_data()->mutable_augment()->set_horizontal_flip(true);
  spec.mutable_data()->mutable_augment()->set_crop_padding(2);
  spec.set_rounds(2);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->spec().data().input_shape().channels(), 3u);
  EXPECT_EQ(job->spec().data().input_shape().rows(), 32u);
  EXPECT_EQ(job->spec().data().input_shape().classes(), 2u);
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(120));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 2);
  for (const auto& w : done.rounds(1).workers()) {
    EXPECT_EQ(w.outcome(), "accepted") << w.worker_id();
    EXPECT_EQ(w.samples(), 60u) << "its own 60 records";
  }
  EXPECT_GT(done.rounds(1).test_accuracy(), 0.8) << "bright against dark";
}

// The small ResNet preset (batch norms, residual blocks, global average pooling) federated on
// CIFAR-10-format data; then a declared model with a FedBN batch norm on the same data.
TEST(DatasetsTest, ResNet8AndADeclaredModelTrainOnCifar10FormatData) {
  TempDir dir("datasets-resnet");
  const auto data = dir.path() / "cifar";
  std::filesystem::create_directories(data);
  WriteCifarLike((data / "data_batch_1.bin").string(), 96, 1);
  WriteCifarLike((data / "test_batch.bin").string(), 40, 2);
  auto options = TestCoordinatorOptions((dir.path() / "state").string());
  options.runner.datasets["cifar-like"] = data.string();
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread w1(address, "w1"), w2(address, "w2");
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));

  v1::JobSpec spec = JobOn("cifar-like", "cifar10", data.string());
  spec.mutable_model()->set_name("resnet8");
  spec.mutable_model()->clear_hidden();
  spec.mutable_data()->add_mean(0.5f);
  spec.mutable_data()->add_std(0.25f);
  spec.set_rounds(2);
  spec.set_local_epochs(2);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(180));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 2);
  for (const auto& w : done.rounds(1).workers()) EXPECT_EQ(w.outcome(), "accepted") << w.worker_id();
  EXPECT_GT(done.rounds(1).test_accuracy(), 0.8) << "bright against dark";

  // Declared: a stem whose batch norm stays on each worker (FedBN), a residual block, pooling.
  Result<v1::JobSpec> declared = ParseJobSpecString(R"(name = "declared"
rounds = 2
clients_per_round = 2
min_clients = 2

[train]
local_epochs = 2
batch_size = 16

[[model.layers]]
type = "conv2d"
out = 8
kernel = 3
padding = 1
bias = false

[[model.layers]]
type = "batch_norm"
local = true

[[model.layers]]
type = "relu"

[[model.layers]]
type = "residual"
body = [{ type = "conv2d", out = 8, kernel = 3, padding = 1 }, { type = "batch_norm" }, { type = "gelu" }]

[[model.layers]]
type = "global_avg_pool"

[[model.layers]]
type = "linear"

[data]
dataset = "cifar-like"
format = "cifar10"
path = "set below"
mean = [0.5]
std = [0.25]

[data.partition]
parties = 2
)", "declared.toml");
  ASSERT_TRUE(declared.ok()) << declared.status().ToString();
  declared->mutable_data()->set_path(data.string());  // where this test's workers have it
  auto second = (*coordinator)->SubmitJob(*declared);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto finished = WaitForJob(*stub, second->id(), std::chrono::seconds(180));
  ASSERT_EQ(finished.job().state(), v1::JOB_SUCCEEDED) << finished.job().error();
  ASSERT_EQ(finished.rounds_size(), 2);
  for (const auto& w : finished.rounds(1).workers()) EXPECT_EQ(w.outcome(), "accepted") << w.worker_id();
  EXPECT_GT(finished.rounds(1).test_accuracy(), 0.8) << "bright against dark";
}

TEST(DatasetsTest, AWorkerWhoseFilesDoNotMatchFailsClearly) {
  TempDir dir("datasets-mismatch");
  const auto data = dir.path() / "tabular";
  const auto wrong = dir.path() / "wrong";
  std::filesystem::create_directories(data);
  std::filesystem::create_directories(wrong);
  WriteTabular((data / "train.csv").string(), 60, 1);
  WriteTabular((data / "test.csv").string(), 30, 2);
  // This worker's file has no 'species' column.
  ASSERT_TRUE(WriteCsv((wrong / "train.csv").string(), {"label", "a", "b", "c", "d"}, {{0, 1, 2, 3, 4}}).ok());
  auto options = TestCoordinatorOptions((dir.path() / "state").string());
  options.runner.datasets["tabular"] = data.string();
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread good(address, "good", kToken, data.string()), bad(address, "bad", kToken, wrong.string());
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  v1::JobSpec spec = JobOn("tabular", "csv", "");
  spec.mutable_data()->set_label_column("species");
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_LOCAL_FILES);
  spec.mutable_data()->mutable_partition()->set_parties(0);
  spec.set_rounds(1);
  spec.set_min_clients(1);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  bool seen = false;
  for (const auto& w : done.rounds(0).workers()) {
    if (w.worker_id() != "bad") continue;
    seen = true;
    EXPECT_EQ(w.outcome().rfind("failed: ", 0), 0u) << w.outcome();
    EXPECT_NE(w.outcome().find("train.csv"), std::string::npos) << w.outcome();
    EXPECT_NE(w.outcome().find("'species'"), std::string::npos) << w.outcome();
  }
  EXPECT_TRUE(seen);
}

// Federated evaluation on Fashion-MNIST: three IID parties split the first 900 test images, so
// that the workers' sample-weighted evaluation of round r's starting model is the coordinator's
// own evaluation of round r - 1's model on those images.
TEST(DatasetsTest, FederatedEvaluationOnThePartiesTestSharesMatchesTheCoordinators) {
  TempDir dir("datasets-federated-eval");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions((dir.path() / "state").string()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  WorkerThread w1(address, "w1"), w2(address, "w2"), w3(address, "w3");
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(20)));
  v1::JobSpec spec = SmallJob(3, 3, 3000);
  spec.mutable_data()->set_max_test_samples(900);
  spec.mutable_evaluation()->set_federated(true);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 3);
  for (int r = 0; r < 3; ++r) {
    uint64_t samples = 0;
    for (const auto& w : done.rounds(r).workers()) {
      EXPECT_EQ(w.local_test_samples(), 300u) << w.worker_id() << ": a third of 900 test images";
      samples += w.local_test_samples();
    }
    EXPECT_EQ(samples, 900u);
    EXPECT_GT(done.rounds(r).federated_accuracy(), 0.0);
  }
  for (int r = 1; r < 3; ++r) {
    EXPECT_NEAR(done.rounds(r).federated_accuracy(), done.rounds(r - 1).test_accuracy(), 1e-9) << "round " << r + 1;
    EXPECT_NEAR(done.rounds(r).federated_loss(), done.rounds(r - 1).test_loss(), 1e-4) << "round " << r + 1;
  }
}

// The example job examples/breast-cancer-csv.toml on the data scripts/prepare-breast-cancer.sh
// writes from python3-sklearn's copy, four workers, its first three rounds.
TEST(DatasetsTest, TheBreastCancerCsvExampleTrains) {
  const std::string source = "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv";
  if (!std::filesystem::exists(source)) {
    GTEST_SKIP() << source << " is missing: python3-sklearn is not installed (scripts/setup.sh installs it)";
  }
  TempDir dir("datasets-breast-cancer");
  const std::string data = (dir.path() / "breast-cancer").string();
  const std::string command = std::string(TESSERA_SOURCE_DIR) + "/scripts/prepare-breast-cancer.sh " + data + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto spec = ParseJobSpecFile(std::string(TESSERA_SOURCE_DIR) + "/examples/breast-cancer-csv.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  spec->mutable_data()->set_path(data);  // where this test's workers have it
  spec->set_rounds(3);
  auto options = TestCoordinatorOptions((dir.path() / "state").string());
  options.runner.datasets["breast-cancer"] = data;
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 4; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "w" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 4, std::chrono::seconds(20)));
  auto job = (*coordinator)->SubmitJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->spec().data().input_shape().channels(), 30u);
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 3);
  uint64_t samples = 0;
  for (const auto& w : done.rounds(2).workers()) samples += w.samples();
  EXPECT_EQ(samples, 456u) << "the four parties hold the 456 training rows";
  EXPECT_GT(done.rounds(2).test_accuracy(), 0.9) << "on the 113 test rows";
}

}  // namespace
}  // namespace tessera::testing
