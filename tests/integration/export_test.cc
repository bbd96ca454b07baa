// `tessera export`: a federated job's global model fetched from a real coordinator and
// written as a NumPy .npz, checked against the round record's hash, against the coordinator's
// refusals, and against PyTorch: the archive loaded into torch's SimpleCNN gives the logits
// Tessera's own model gives on the same test images.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/export_command.h"
#include "cli/job_spec.h"
#include "cli/onnx_export.h"
#include "core/data/idx.h"
#include "core/data/numpy_format.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"
#include "proto/job_mapping.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

// Runs one of the Python checks beside this file under Debian's /usr/bin/python3 with `args`,
// its output to `log` in `dir`; returns the exit status and the output.
std::pair<int, std::string> RunPythonCheck(const TempDir& dir, const std::string& script, const std::string& args,
                                           const std::string& log) {
  const std::string command = "/usr/bin/python3 " + std::string(TESSERA_SOURCE_DIR) + "/tests/integration/" + script +
                              " " + args + " > " + dir.str() + "/" + log + " 2>&1";
  const int rc = std::system(command.c_str());
  std::ifstream in(dir.str() + "/" + log);
  return {rc, std::string((std::istreambuf_iterator<char>(in)), {})};
}

TEST(ExportTest, TheExportedModelIsTheCommittedOneAndPyTorchComputesTheSameLogits) {
  TempDir dir("export");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 2; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "e" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  v1::JobSpec spec = SmallJob(2, 2, 1000);
  spec.mutable_model()->set_name("simplecnn");
  spec.mutable_model()->clear_hidden();
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(120));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 2);

  // The newest round's model, and round 1's, each hashing to its round record's model.
  for (std::optional<uint32_t> round : {std::optional<uint32_t>(), std::optional<uint32_t>(1)}) {
    const std::string path = dir.str() + "/model-" + (round ? std::to_string(*round) : "newest") + ".npz";
    std::ostringstream out;
    Status exported = cli::ExportCommand(*stub, {job->id(), round, path, false}, out);
    ASSERT_TRUE(exported.ok()) << exported.ToString();
    auto arrays = ReadNpz(path);
    ASSERT_TRUE(arrays.ok()) << arrays.status().ToString();
    TensorSet tensors;
    for (const auto& a : *arrays) tensors.push_back(*ToTensor(a, path));
    const auto& record = done.rounds(round ? static_cast<int>(*round) - 1 : 1);
    EXPECT_EQ(TensorSetSha256(tensors), record.model_sha256()) << out.str();
    EXPECT_EQ(tensors.front().name, "conv1.weight");
    EXPECT_EQ(TotalElements(tensors), 44426);
  }
  // The initial model is kept too; a round not committed is refused by number.
  std::ostringstream out;
  EXPECT_TRUE(cli::ExportCommand(*stub, {job->id(), 0u, dir.str() + "/initial.npz", false}, out).ok());
  Status missing = cli::ExportCommand(*stub, {job->id(), 7u, dir.str() + "/seven.npz", false}, out);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_NE(missing.message().find("has committed 2 round(s); round 7 has no model yet"), std::string::npos)
      << missing.message();
  Status wrong_suffix = cli::ExportCommand(*stub, {job->id(), std::nullopt, dir.str() + "/model.pt", false}, out);
  EXPECT_EQ(wrong_suffix.code(), StatusCode::kInvalidArgument);

  // Tessera's logits on 200 test images, beside the images, for PyTorch to reproduce.
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  auto device = CreateCpuDevice();
  auto model = CreateModel(wire::ToModelConfig(spec), device.get());
  ASSERT_TRUE(model.ok());
  auto arrays = ReadNpz(dir.str() + "/model-newest.npz");
  ASSERT_TRUE(arrays.ok());
  TensorSet state;
  for (const auto& a : *arrays) state.push_back(*ToTensor(a, "model"));
  ASSERT_TRUE((*model)->SetState(state).ok());
  constexpr int kImages = 200;
  auto input = device->Allocate(kImages * test->SampleSize() * sizeof(float));
  ASSERT_TRUE(input.ok());
  const std::vector<float> test_values = test->Values();
  ASSERT_TRUE(device->CopyHostToDevice(test_values.data(), *input, 0, kImages * test->SampleSize() * sizeof(float)).ok());
  ASSERT_TRUE((*model)->Forward(input->f32(), kImages).ok());
  NamedTensor logits{"logits", {kImages, 10}, std::vector<float>(kImages * 10)};
  ASSERT_TRUE(device->CopyDeviceToHost((*model)->logits_buffer(), 0, logits.values.data(), logits.ByteSize()).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  NamedTensor images{"images", {kImages, 1, 28, 28},
                     std::vector<float>(test_values.begin(), test_values.begin() + kImages * test->SampleSize())};
  const std::string expected = dir.str() + "/expected.npz";
  ASSERT_TRUE(WriteNpz(expected, ToNumpy(TensorSet{images, logits})).ok());

  // The same model as ONNX, checked by python3-onnx against the archive.
  std::ostringstream onnx_out;
  Status onnx = cli::ExportCommand(*stub, {job->id(), std::nullopt, dir.str() + "/model.onnx", false}, onnx_out);
  ASSERT_TRUE(onnx.ok()) << onnx.ToString();
  if (SystemPythonHas("onnx")) {
    const auto [onnx_rc, onnx_text] =
        RunPythonCheck(dir, "onnx_check.py", dir.str() + "/model.onnx " + dir.str() + "/model-newest.npz 10", "onnx.log");
    EXPECT_EQ(onnx_rc, 0) << onnx_text;
    EXPECT_NE(onnx_text.find("onnx ok"), std::string::npos) << onnx_text;
  } else {
    ADD_FAILURE() << "python3-onnx is not installed (/usr/bin/python3 cannot import onnx): scripts/setup.sh installs it";
  }

  if (!SystemPythonHas("torch, numpy")) {
    GTEST_SKIP() << "Debian's python3-torch is not installed (/usr/bin/python3 cannot import torch): scripts/setup.sh "
                    "installs it; the export itself was checked above";
  }
  const auto [rc, text] =
      RunPythonCheck(dir, "torch_logits_check.py", dir.str() + "/model-newest.npz " + expected, "torch.log");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("logits match"), std::string::npos) << text;
}

// Builds the declared model of the job spec `toml`, writes its state as NAME.npz and its graph
// as NAME.onnx in `dir`, and runs onnx_check.py on both (logits of 10 classes); returns the
// check's exit status and output, or -1 and why the files could not be made.
std::pair<int, std::string> ExportAndCheckOnnx(const TempDir& dir, const std::string& toml, const std::string& name) {
  auto spec = ParseJobSpecString(toml, name + ".toml");
  if (!spec.ok()) return {-1, spec.status().ToString()};
  auto device = CreateCpuDevice();
  auto model = CreateModel(wire::ToModelConfig(*spec), device.get());
  if (!model.ok()) return {-1, model.status().ToString()};
  const std::string npz = dir.str() + "/" + name + ".npz", onnx = dir.str() + "/" + name + ".onnx";
  Status written = WriteNpz(npz, ToNumpy((*model)->GetState().value()));
  if (written.ok()) written = cli::WriteOnnx(**model, name, onnx);
  if (!written.ok()) return {-1, written.ToString()};
  return RunPythonCheck(dir, "onnx_check.py", onnx + " " + npz + " 10", "onnx.log");
}

// A declared model with every layer type (batch norms, a grouped convolution, GELU and layer
// norm, which opset 13 spells out in smaller ops, a residual block with a projection shortcut,
// average pools, dropout, tanh, sigmoid, flatten) exports to a graph the ONNX checker accepts,
// with the same initializers as the archive.
TEST(ExportTest, ADeclaredModelExportsToOnnx) {
  if (!SystemPythonHas("onnx")) GTEST_SKIP() << "python3-onnx is not installed: scripts/setup.sh installs it";
  TempDir dir("export-declared");
  const auto [rc, text] = ExportAndCheckOnnx(dir, R"(name = "onnx"
rounds = 1

[[model.layers]]
type = "conv2d"
out = 4
kernel = 3
padding = 1
bias = false

[[model.layers]]
type = "batch_norm"

[[model.layers]]
type = "tanh"

[[model.layers]]
type = "conv2d"
out = 4
kernel = 3
padding = 1
groups = 2

[[model.layers]]
type = "gelu"

[[model.layers]]
type = "layer_norm"

[[model.layers]]
type = "residual"
name = "block"
body = [{ type = "conv2d", out = 8, kernel = 3, stride = 2, padding = 1 }, { type = "batch_norm" }, { type = "relu" }]
shortcut = [{ type = "conv2d", out = 8, kernel = 1, stride = 2 }]

[[model.layers]]
type = "avg_pool"

[[model.layers]]
type = "sigmoid"

[[model.layers]]
type = "global_avg_pool"

[[model.layers]]
type = "dropout"

[[model.layers]]
type = "flatten"

[[model.layers]]
type = "linear"
out = 16

[[model.layers]]
type = "layer_norm"

[[model.layers]]
type = "linear"

[data.partition]
parties = 2
)", "declared");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("onnx ok"), std::string::npos) << text;
}

// The model keeps [F] features and [F, 1, 1] maps as one shape, so its layers follow either;
// ONNX's nodes take one rank. A residual block whose body is flat and whose shortcut is not, a
// convolution after it, and a model that ends at [classes, 1, 1] (a convolution and a global
// average pool, no linear layer) still give a graph whose shapes infer to logits [batch, classes].
TEST(ExportTest, AModelWhoseLayersMixFeaturesAndMapsExportsToOnnx) {
  if (!SystemPythonHas("onnx")) GTEST_SKIP() << "python3-onnx is not installed: scripts/setup.sh installs it";
  TempDir dir("export-ranks");
  const auto [rc, text] = ExportAndCheckOnnx(dir, R"(name = "onnx-ranks"
rounds = 1

[[model.layers]]
type = "conv2d"
out = 4
kernel = 3

[[model.layers]]
type = "global_avg_pool"

[[model.layers]]
type = "residual"
name = "block"
body = [{ type = "linear", out = 4 }, { type = "relu" }]

[[model.layers]]
type = "conv2d"
out = 10
kernel = 1

[[model.layers]]
type = "global_avg_pool"

[data.partition]
parties = 2
)", "ranks");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("onnx ok"), std::string::npos) << text;
}

// A layer norm over [C, 1, 1] maps (after a global average pool, or a convolution that leaves
// 1x1) holds weights of [C]: on the [batch, C, 1, 1] node they broadcast to [batch, C, 1, C],
// so the graph's shapes no longer reached logits [batch, classes].
TEST(ExportTest, ALayerNormOverOneByOneMapsExportsToOnnx) {
  if (!SystemPythonHas("onnx")) GTEST_SKIP() << "python3-onnx is not installed: scripts/setup.sh installs it";
  TempDir dir("export-norm-1x1");
  const auto [rc, text] = ExportAndCheckOnnx(dir, R"(name = "onnx-norm-1x1"
rounds = 1

[[model.layers]]
type = "conv2d"
out = 6
kernel = 3

[[model.layers]]
type = "global_avg_pool"

[[model.layers]]
type = "layer_norm"

[[model.layers]]
type = "conv2d"
out = 10
kernel = 1

[[model.layers]]
type = "layer_norm"

[data.partition]
parties = 2
)", "norm-1x1");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("onnx ok"), std::string::npos) << text;
}

// resnet8, trained a few steps so its running statistics are its own, exported as an .npz:
// PyTorch's ResNet-8 (bench/torch_simplecnn.py) loads it by name and, in eval mode, gives
// Tessera's inference logits.
TEST(ExportTest, AResNet8ArchiveGivesPyTorchsLogits) {
  if (!SystemPythonHas("torch, numpy")) {
    GTEST_SKIP() << "Debian's python3-torch is not installed (/usr/bin/python3 cannot import torch): scripts/setup.sh "
                    "installs it";
  }
  TempDir dir("export-resnet8");
  auto device = CreateCpuDevice();
  ModelConfig config;
  config.name = "resnet8";
  config.channels = 3;
  config.rows = config.cols = 32;
  config.seed = 4;
  auto model = CreateModel(config, device.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Dataset data;
  data.count = 32;
  data.channels = 3;
  data.rows = data.cols = 32;
  std::mt19937 engine(5);
  std::normal_distribution<float> normal(0.3f, 1.2f);
  data.images.resize(32 * 3 * 32 * 32);
  for (float& v : data.images) v = normal(engine);
  for (int i = 0; i < 32; ++i) data.labels.push_back(static_cast<uint8_t>(i % 10));
  std::vector<int64_t> indices(32);
  for (int i = 0; i < 32; ++i) indices[i] = i;
  TrainOptions options;
  options.batch_size = 8;
  options.learning_rate = 0.05f;
  ASSERT_TRUE(TrainLocal(**model, data, indices, options).ok());
  (*model)->SetTraining(false);
  constexpr int kImages = 16;
  auto input = device->Allocate(kImages * data.SampleSize() * sizeof(float));
  ASSERT_TRUE(input.ok());
  ASSERT_TRUE(device->CopyHostToDevice(data.images.data(), *input, 0, kImages * data.SampleSize() * sizeof(float)).ok());
  ASSERT_TRUE((*model)->Forward(input->f32(), kImages).ok());
  NamedTensor logits{"logits", {kImages, 10}, std::vector<float>(kImages * 10)};
  ASSERT_TRUE(device->CopyDeviceToHost((*model)->logits_buffer(), 0, logits.values.data(), logits.ByteSize()).ok());
  NamedTensor images{"images", {kImages, 3, 32, 32},
                     std::vector<float>(data.images.begin(), data.images.begin() + kImages * data.SampleSize())};
  const std::string archive = dir.str() + "/resnet8.npz", expected = dir.str() + "/expected.npz";
  ASSERT_TRUE(WriteNpz(archive, ToNumpy((*model)->GetState().value())).ok());
  ASSERT_TRUE(WriteNpz(expected, ToNumpy(TensorSet{images, logits})).ok());
  const auto [rc, text] =
      RunPythonCheck(dir, "torch_logits_check.py", archive + " " + expected + " resnet8", "torch.log");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("logits match"), std::string::npos) << text;
}

}  // namespace
}  // namespace tessera::testing
