// The operator tools behind `tessera devices --model M` and `tessera align`: the per-layer
// risk list names the ops a device runs on the host and what they move; align agrees exactly
// between devices that compute alike, and names the first layer that drifts when one rounds.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <unistd.h>

#include "cli/devices_command.h"

namespace tessera {
namespace {

// The line of the per-layer table for (layer, op), or "" when there is none.
std::string RiskLine(const std::string& report, const std::string& layer, const std::string& op) {
  std::istringstream lines(report);
  std::string line;
  const std::regex pattern("^\\s+" + layer + "\\s+" + op + "(\\s|$).*");
  while (std::getline(lines, line)) {
    if (std::regex_match(line, pattern)) return line;
  }
  return "";
}

TEST(DevicesToolsTest, RiskListOnAscendMarksItsMissingOpsAsFallbacksPerLayer) {
  DevicesOptions options;
  options.devices = {"emu:ascend-910b"};
  options.model = "simplecnn";
  options.batch = 16;
  options.gemm_size = 64;
  std::ostringstream report;
  ASSERT_TRUE(DevicesCommand(options, report).ok());
  const std::string text = report.str();
  // Every layer of SimpleCNN appears, then the loss and the optimiser step.
  for (const char* layer : {"conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc1", "relu3", "fc2", "relu4", "fc3",
                            "loss", "optimiser"}) {
    EXPECT_NE(RiskLine(text, layer, "="), "") << layer << " missing from\n" << text;
  }
  // The profile lacks max_pool_backward and softmax_cross_entropy: host fallbacks, bytes > 0.
  for (const char* layer : {"pool1", "pool2"}) {
    const std::string line = RiskLine(text, layer, "max_pool_backward");
    EXPECT_NE(line.find("host fallback"), std::string::npos) << line << "\n" << text;
    EXPECT_TRUE(std::regex_search(line, std::regex("fallback\\s+\\S+\\s+\\S+\\s+[1-9][0-9]*\\s"))) << line;
    EXPECT_NE(RiskLine(text, layer, "max_pool").find("native"), std::string::npos);
  }
  EXPECT_NE(RiskLine(text, "loss", "softmax_cross_entropy").find("host fallback"), std::string::npos) << text;
  EXPECT_NE(RiskLine(text, "conv1", "conv2d_forward").find("native"), std::string::npos) << text;
  EXPECT_NE(RiskLine(text, "fc1", "gemm").find("native"), std::string::npos) << text;
  std::smatch bytes;
  ASSERT_TRUE(std::regex_search(text, bytes, std::regex("fallback bytes across the host link per step \\(layers\\): (\\d+)")))
      << text;
  EXPECT_GT(std::stoull(bytes[1]), 0u);
  EXPECT_NE(text.find("ops: "), std::string::npos);
  EXPECT_NE(text.find("host fallback 3,"), std::string::npos) << "2 pool backwards + the loss:\n" << text;
  EXPECT_NE(text.find("modelled step"), std::string::npos);
}

TEST(DevicesToolsTest, RiskListOnTheCpuIsAllNative) {
  DevicesOptions options;
  options.devices = {"cpu"};
  options.model = "mlp";
  options.batch = 8;
  options.gemm_size = 64;
  std::ostringstream report;
  ASSERT_TRUE(DevicesCommand(options, report).ok());
  EXPECT_NE(report.str().find("host fallback 0, unsupported 0"), std::string::npos) << report.str();
}

TEST(DevicesToolsTest, UnknownDeviceNamesAreErrorsNamingThem) {
  DevicesOptions options;
  options.devices = {"tpu-v9"};
  std::ostringstream report;
  Status status = DevicesCommand(options, report);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.ToString().find("tpu-v9"), std::string::npos) << status.ToString();

  options.devices = {"emu:no-such-chip"};
  status = DevicesCommand(options, report);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.ToString().find("no-such-chip"), std::string::npos) << status.ToString();

  // Every name is checked before any device is measured, and shown escaped.
  options.devices = {"cpu"};
  options.extra_devices = {"tpu\x1b[2J-v9"};
  std::ostringstream nothing;
  status = DevicesCommand(options, nothing);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message().rfind("unknown device 'tpu\\x1b[2J-v9'; known devices: ", 0), 0u) << status.message();
  EXPECT_EQ(nothing.str(), "");
  options.extra_devices = {""};
  EXPECT_EQ(DevicesCommand(options, nothing).message().rfind("unknown device ''; known devices: ", 0), 0u);
  EXPECT_EQ(nothing.str(), "");

  // So are an emulated device's profile and the risk list's model.
  options.extra_devices = {"emu:no-such-chip"};
  EXPECT_FALSE(DevicesCommand(options, nothing).ok());
  EXPECT_EQ(nothing.str(), "");
  options.extra_devices = {};
  options.model = "simplecnm";
  status = DevicesCommand(options, nothing);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_EQ(nothing.str(), "");
  options.model = "/no/such/job.toml";
  EXPECT_EQ(DevicesCommand(options, nothing).code(), StatusCode::kNotFound);
  EXPECT_EQ(nothing.str(), "");

  AlignOptions align;
  align.device_b = "npu-x";
  status = AlignCommand(align, report);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.ToString().find("npu-x"), std::string::npos) << status.ToString();
}

TEST(DevicesToolsTest, RiskListAndAlignTakeADeclaredModelFromAJobFile) {
  const std::string job = std::string(TESSERA_SOURCE_DIR) + "/examples/declared-cnn.toml";
  DevicesOptions options;
  options.devices = {"emu:generic"};
  options.model = job;
  options.batch = 8;
  options.gemm_size = 64;
  std::ostringstream report;
  Status status = DevicesCommand(options, report);
  ASSERT_TRUE(status.ok()) << status.ToString();
  const std::string text = report.str();
  for (const char* layer : {"stem", "stem_bn", "block", "avg_pool1", "flatten1", "dropout1", "fc1", "ln", "tanh1",
                            "fc2"}) {
    EXPECT_NE(RiskLine(text, layer, "="), "") << layer << " missing from\n" << text;
  }
  EXPECT_NE(RiskLine(text, "block", "batch_norm_backward").find("native"), std::string::npos) << text;
  EXPECT_NE(RiskLine(text, "ln", "layer_norm_forward").find("native"), std::string::npos) << text;

  AlignOptions align;
  align.model = job;
  align.device_a = "cpu";
  align.device_b = "emu:generic";
  align.samples = 32;
  std::ostringstream aligned;
  status = AlignCommand(align, aligned);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_NE(aligned.str().find("top-1 agreement 100.00%"), std::string::npos) << aligned.str();
  // resnet8 on 3x32x32: random inputs of its shape; an unknown name is refused.
  align.model = "resnet8";
  align.samples = 8;
  std::ostringstream resnet;
  status = AlignCommand(align, resnet);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_NE(resnet.str().find("top-1 agreement 100.00%"), std::string::npos) << resnet.str();
  align.model = "resnet9000";
  EXPECT_EQ(AlignCommand(align, resnet).code(), StatusCode::kInvalidArgument);
}

std::string Align(const std::string& b, int samples, double threshold = 1e-3) {
  AlignOptions options;
  options.device_a = "cpu";
  options.device_b = b;
  options.samples = samples;
  options.divergence_threshold = threshold;
  std::ostringstream report;
  Status status = AlignCommand(options, report);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return report.str();
}

double MeanMae(const std::string& report) {
  std::smatch match;
  if (!std::regex_search(report, match, std::regex("mean per-sample logit MAE (\\S+)"))) return -1;
  return std::stod(match[1]);
}

TEST(DevicesToolsTest, AlignOfTwoFloat32DevicesAgreesExactly) {
  const std::string report = Align("emu:generic", 64);
  EXPECT_NE(report.find("top-1 agreement 100.00%"), std::string::npos) << report;
  EXPECT_GE(MeanMae(report), 0.0);
  EXPECT_LT(MeanMae(report), 1e-6) << report;
  EXPECT_NE(report.find("first divergent layer: none"), std::string::npos) << report;
}

TEST(DevicesToolsTest, AlignAgainstFloat16NamesTheFirstDivergentLayer) {
  const std::string report = Align("emu:ascend-910b", 64, 1e-5);
  EXPECT_GT(MeanMae(report), 0.0) << report;
  EXPECT_TRUE(std::regex_search(report, std::regex("first divergent layer: (conv|relu|pool|fc)\\d"))) << report;
}

TEST(DevicesToolsTest, AlignAgainstInt8PassesTheDefaultThresholdAtTheFirstLayer) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("tessera_int8_" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream file(path);
    file << "[int8-npu]\npeak_tflops_fp32 = 1.0\npeak_tflops_fp16 = 2.0\npeak_tops_int8 = 8.0\n"
            "memory_bandwidth_gbps = 100.0\nmemory_bytes = 4294967296\nhost_link_gbps = 8.0\n"
            "power_watts = 10.0\nprecision = \"int8\"\nnative_ops = [\"all\"]\n";
  }
  const std::string report = Align("emu:" + path.string(), 64);
  std::filesystem::remove(path);
  EXPECT_GT(MeanMae(report), 1e-4) << report;
  EXPECT_NE(report.find("first divergent layer: conv1"), std::string::npos) << report;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

google::protobuf::Struct ParseJson(const std::string& line) {
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok()) << line;
  return parsed;
}

TEST(DevicesToolsTest, DevicesAsJsonIsAnObjectPerDevice) {
  DevicesOptions options;
  options.devices = {"cpu", "emu:ascend-910b"};
  options.gemm_size = 64;
  options.json = true;
  std::ostringstream out;
  ASSERT_TRUE(DevicesCommand(options, out).ok());
  std::istringstream lines(out.str());
  std::string line;
  std::vector<google::protobuf::Struct> devices;
  while (std::getline(lines, line)) devices.push_back(ParseJson(line));
  ASSERT_EQ(devices.size(), 2u) << out.str();
  const auto& cpu = devices[0].fields();
  EXPECT_EQ(cpu.at("name").string_value(), "cpu");
  EXPECT_TRUE(cpu.at("viable").bool_value());
  EXPECT_GT(cpu.at("measured_gemm_gflops").number_value(), 0);
  const auto& npu = devices[1].fields();
  EXPECT_TRUE(npu.at("emulated").bool_value());
  EXPECT_GT(npu.at("datasheet").struct_value().fields().at("gflops").number_value(), 0);
  options.model = "simplecnn";
  EXPECT_EQ(DevicesCommand(options, out).code(), StatusCode::kInvalidArgument) << "no risk list in JSON";
}

TEST(DevicesToolsTest, AlignAsJsonCarriesEveryFigure) {
  AlignOptions options;
  options.device_b = "emu:generic";
  options.samples = 32;
  options.json = true;
  std::ostringstream out;
  ASSERT_TRUE(AlignCommand(options, out).ok());
  const auto parsed = ParseJson(out.str());
  const auto& f = parsed.fields();
  EXPECT_EQ(f.at("top1_agreement").number_value(), 1.0);
  EXPECT_EQ(f.at("samples").number_value(), 32);
  EXPECT_EQ(f.at("first_divergent_layer").kind_case(), google::protobuf::Value::kNullValue);
  EXPECT_GT(f.at("layers").list_value().values_size(), 3);
}

}  // namespace
}  // namespace tessera
