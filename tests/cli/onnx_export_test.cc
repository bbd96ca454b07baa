// Writing an ONNX file: a write that fails is an error, never a file renamed into place and
// success; what the nodes say is what the layers compute.
#include "cli/onnx_export.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "device/cpu/factory.h"
#include "tests/fresh_directory.h"

namespace tessera::cli {
namespace {

class OnnxExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-onnx");
    std::filesystem::create_directories(dir_);
    ModelConfig config;  // a small model: the whole file fits in a stream's buffer
    config.name = "declared";
    config.channels = 1;
    config.rows = config.cols = 2;
    LayerConfig linear;
    linear.type = "linear";
    config.layers.push_back(linear);
    auto model = CreateModel(config, device_.get());
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Device> device_ = CreateCpuDevice();
  std::unique_ptr<Model> model_;
  std::filesystem::path dir_;
};

TEST_F(OnnxExportTest, AModelIsWrittenWhole) {
  const std::string path = (dir_ / "model.onnx").string();
  Status written = WriteOnnx(*model_, "small", path);
  ASSERT_TRUE(written.ok()) << written.ToString();
  EXPECT_GT(std::filesystem::file_size(path), 4 * 50u);  // 40 weights and 10 biases at least
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A directory stands where the model is to go: nothing may be reported written, and no
// temporary is left beside it.
TEST_F(OnnxExportTest, AWriteThatFailsIsAnError) {
  const std::string path = (dir_ / "model.onnx").string();
  std::filesystem::create_directories(path + "/inside");
  Status written = WriteOnnx(*model_, "small", path);
  EXPECT_EQ(written.code(), StatusCode::kDataLoss) << written.ToString();
  EXPECT_EQ(written.message().rfind("cannot rename '" + path + ".tmp' to '" + path + "': ", 0), 0u)
      << written.message();
  EXPECT_TRUE(std::filesystem::is_directory(path + "/inside"));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path + ".tmp")));
}

// Epsilons are carried to the nodes exactly: in steps of 1e-9 one of 1e-10 (the job spec takes
// any in (0, 1]) became 0, and the exported norms divided by a zero variance's root.
TEST_F(OnnxExportTest, NormsKeepTheirEpsilonExactly) {
  ModelConfig config;
  config.name = "declared";
  config.channels = 2;
  config.rows = config.cols = 2;
  LayerConfig batch_norm, layer_norm, linear;
  batch_norm.type = "batch_norm";
  batch_norm.name = "bn";
  batch_norm.epsilon = 1e-10f;
  layer_norm.type = "layer_norm";
  layer_norm.name = "ln";
  layer_norm.epsilon = 3.7e-7f;
  linear.type = "linear";
  config.layers = {batch_norm, layer_norm, linear};
  auto model = CreateModel(config, device_.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string path = (dir_ / "norms.onnx").string();
  Status written = WriteOnnx(**model, "norms", path);
  ASSERT_TRUE(written.ok()) << written.ToString();
  onnx::ModelProto proto;
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(proto.ParseFromIstream(&in));
  std::vector<float> batch_norm_epsilons, layer_norm_constants;
  for (const onnx::NodeProto& node : proto.graph().node()) {
    for (const onnx::AttributeProto& a : node.attribute()) {
      if (node.op_type() == "BatchNormalization" && a.name() == "epsilon") batch_norm_epsilons.push_back(a.f());
      if (node.op_type() == "Constant" && node.name().starts_with("ln.") && a.t().float_data_size() == 1) {
        layer_norm_constants.push_back(a.t().float_data(0));
      }
    }
  }
  EXPECT_EQ(batch_norm_epsilons, std::vector<float>{1e-10f});
  EXPECT_EQ(layer_norm_constants, std::vector<float>{3.7e-7f});
}

}  // namespace
}  // namespace tessera::cli
