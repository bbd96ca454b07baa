// The generic device suite: every viable device here ("cpu", each "emu:*" profile, "xrt" and
// "cuda" when viable) against the CPU backend as the reference, one test per op, within a
// tolerance that fits the device's compute precision; fallback accounting against its
// coverage; the pool across a training run. "xrt" runs on XRT's no-op shim with a generated
// xclbin unless a card is configured (TESSERA_XRT_XCLBIN without XCL_EMULATION_MODE): its host
// fallbacks are compared like any backend's, but the shim computes nothing, so its native GEMM
// is skipped by name in the comparison (xrt_device_test.cc checks the kernel's launch instead). Then the emulated backend's own contracts: a coverage gap trains to the CPU's
// accuracy with the fallbacks accounted, profile files are validated, capacity is enforced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <ostream>
#include <string_view>
#include <vector>

#include "base/escape.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/device.h"
#include "device/emulated/factory.h"
#include "device/measure.h"
#include "device/placement.h"
#include "device/registry.h"
#include "device/xrt/factory.h"
#include "tests/device/xrt_noop_shim.h"

namespace tessera {
namespace {

std::vector<std::string> DeviceNames() {
  std::vector<std::string> names;
  for (const auto& backend : RegisteredDeviceBackends()) names.push_back(backend.name);
  return names;
}

std::string Identifier(std::string_view text) {
  std::string name;
  for (char c : text) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

std::string TestName(const ::testing::TestParamInfo<std::string>& info) { return Identifier(info.param); }

std::vector<float> Random(size_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(engine);
  return values;
}

// Runs ops on one device from host inputs and brings the outputs back.
class OpRunner {
 public:
  explicit OpRunner(Device& device) : device_(device) {}
  float* In(const std::vector<float>& host) {
    auto buffer = device_.Allocate(std::max<size_t>(1, host.size()) * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_TRUE(device_.CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(float)).ok());
    buffers_.push_back(std::move(buffer).value());
    return buffers_.back().f32();
  }
  int32_t* Ints(const std::vector<int32_t>& host) {
    auto buffer = device_.Allocate(host.size() * sizeof(int32_t));
    EXPECT_TRUE(device_.CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(int32_t)).ok());
    buffers_.push_back(std::move(buffer).value());
    return buffers_.back().i32();
  }
  float* Out(size_t count) { return Out(std::vector<float>(count, 0.0f)); }
  float* Out(const std::vector<float>& initial) {
    outputs_.push_back({buffers_.size(), initial.size()});
    return In(initial);
  }
  std::vector<float> Results() {
    EXPECT_TRUE(device_.Synchronize().ok());
    std::vector<float> all;
    for (const auto& [index, count] : outputs_) {
      std::vector<float> host(count);
      EXPECT_TRUE(device_.CopyDeviceToHost(buffers_[index], 0, host.data(), count * sizeof(float)).ok());
      all.insert(all.end(), host.begin(), host.end());
    }
    return all;
  }
  Device& device() { return device_; }

 private:
  Device& device_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<std::pair<size_t, size_t>> outputs_;
};

Conv2dShape SmallConv() {
  Conv2dShape shape;
  shape.batch = 2, shape.in_channels = 3, shape.in_height = 9, shape.in_width = 8;
  shape.out_channels = 4, shape.kernel_height = 3, shape.kernel_width = 3, shape.stride = 1, shape.padding = 1;
  return shape;
}

MaxPoolShape SmallPool() {
  MaxPoolShape shape;
  shape.batch = 2, shape.channels = 3, shape.in_height = 8, shape.in_width = 6;
  return shape;
}

// One case per op: issues the op on the runner's device from fixed inputs.
std::vector<std::pair<Op, std::function<void(OpRunner&)>>> OpCases() {
  const Conv2dShape conv = SmallConv();
  const int64_t conv_x = int64_t(conv.batch) * conv.in_channels * conv.in_height * conv.in_width;
  const int64_t conv_w = int64_t(conv.out_channels) * conv.in_channels * 9;
  const int64_t conv_y = int64_t(conv.batch) * conv.out_channels * conv.out_height() * conv.out_width();
  const MaxPoolShape pool = SmallPool();
  const int64_t pool_x = int64_t(pool.batch) * pool.channels * pool.in_height * pool.in_width;
  const int64_t pool_y = int64_t(pool.batch) * pool.channels * pool.out_height() * pool.out_width();
  return {
      {Op::kGemm, [](OpRunner& r) {
         float* c = r.Out(7 * 5);
         r.device().Gemm(false, true, 7, 5, 33, 1.0f, r.In(Random(7 * 33, 1)), r.In(Random(5 * 33, 2)), 0.0f, c);
       }},
      {Op::kConv2dForward, [=](OpRunner& r) {
         r.device().Conv2dForward(conv, r.In(Random(conv_x, 3)), r.In(Random(conv_w, 4)), r.In(Random(4, 5)),
                                  r.Out(conv_y));
       }},
      {Op::kConv2dBackwardData, [=](OpRunner& r) {
         r.device().Conv2dBackwardData(conv, r.In(Random(conv_y, 6)), r.In(Random(conv_w, 7)), r.Out(conv_x));
       }},
      {Op::kConv2dBackwardFilter, [=](OpRunner& r) {
         float* dw = r.Out(conv_w);
         r.device().Conv2dBackwardFilter(conv, r.In(Random(conv_x, 8)), r.In(Random(conv_y, 9)), dw, r.Out(4));
       }},
      {Op::kBiasAdd, [](OpRunner& r) {
         float* x = r.Out(3 * 4 * 5);
         r.device().Fill(3 * 4 * 5, 0.5f, x);
         r.device().BiasAdd(3, 4, 5, r.In(Random(4, 10)), x);
       }},
      {Op::kBiasGrad, [](OpRunner& r) { r.device().BiasGrad(3, 4, 5, r.In(Random(60, 11)), r.Out(4)); }},
      {Op::kRelu, [](OpRunner& r) { r.device().Relu(100, r.In(Random(100, 12)), r.Out(100)); }},
      {Op::kReluBackward, [](OpRunner& r) {
         r.device().ReluBackward(100, r.In(Random(100, 13)), r.In(Random(100, 14)), r.Out(100));
       }},
      {Op::kMaxPool, [=](OpRunner& r) {
         auto argmax = r.device().Allocate(pool_y * sizeof(int32_t));
         ASSERT_TRUE(argmax.ok());
         r.device().MaxPool(pool, r.In(Random(pool_x, 15)), r.Out(pool_y), argmax->i32());
       }},
      {Op::kMaxPoolBackward, [=](OpRunner& r) {
         // Each index inside its own output's window, as MaxPool writes them (device.h).
         std::vector<int32_t> argmax(pool_y);
         const int out_w = pool.out_width(), out_plane = pool.out_height() * out_w;
         for (int64_t i = 0; i < pool_y; ++i) {
           const int o = static_cast<int>(i % out_plane), oh = o / out_w, ow = o % out_w;
           const int kh = static_cast<int>(i % pool.window), kw = static_cast<int>((i / 3) % pool.window);
           argmax[i] = (oh * pool.stride + kh) * pool.in_width + ow * pool.stride + kw;
         }
         r.device().MaxPoolBackward(pool, r.In(Random(pool_y, 16)), r.Ints(argmax), r.Out(pool_x));
       }},
      {Op::kSoftmaxCrossEntropy, [](OpRunner& r) {
         float* loss = r.Out(1);
         r.device().SoftmaxCrossEntropy(4, 10, r.In(Random(40, 17)), r.Ints({1, 0, 9, 3}), loss, r.Out(40));
       }},
      {Op::kSgdMomentumUpdate, [](OpRunner& r) {
         float* velocity = r.Out(Random(50, 22));
         float* weights = r.Out(Random(50, 18));
         r.device().SgdMomentumUpdate(50, 0.1f, 0.9f, 0.01f, r.In(Random(50, 19)), velocity, weights);
       }},
      {Op::kAddScaledDifference, [](OpRunner& r) {
         float* y = r.Out(Random(300, 23));
         r.device().AddScaledDifference(300, 0.37f, r.In(Random(300, 24)), r.In(Random(300, 25)), y);
       }},
      {Op::kReduceSum, [](OpRunner& r) { r.device().ReduceSum(1000, r.In(Random(1000, 20)), r.Out(1)); }},
      {Op::kCast, [](OpRunner& r) {
         float* back = r.Out(64);
         auto half = r.device().Allocate(64 * 2);
         ASSERT_TRUE(half.ok());
         const float* x = r.In(Random(64, 21));
         r.device().Cast(64, DType::kFloat32, x, DType::kFloat16, half->data());
         r.device().Cast(64, DType::kFloat16, half->data(), DType::kFloat32, back);
       }},
      {Op::kFill, [](OpRunner& r) { r.device().Fill(77, -2.5f, r.Out(77)); }},
      // The layer-graph ops. Each backward runs after the device's own forward, as a layer
      // graph issues them, and both outputs are compared.
      {Op::kActivation, [](OpRunner& r) {
         const float* x = r.In(Random(90, 50));
         for (ActivationFunction function :
              {ActivationFunction::kGelu, ActivationFunction::kTanh, ActivationFunction::kSigmoid}) {
           r.device().Activation(function, 90, x, r.Out(90));
         }
       }},
      {Op::kActivationBackward, [](OpRunner& r) {
         const float* x = r.In(Random(90, 51));
         const float* dy = r.In(Random(90, 52));
         for (ActivationFunction function :
              {ActivationFunction::kGelu, ActivationFunction::kTanh, ActivationFunction::kSigmoid}) {
           float* y = r.Out(90);
           r.device().Activation(function, 90, x, y);
           r.device().ActivationBackward(function, 90, x, y, dy, r.Out(90));
         }
       }},
      {Op::kAvgPool, [=](OpRunner& r) { r.device().AvgPool(pool, r.In(Random(pool_x, 53)), r.Out(pool_y)); }},
      {Op::kAvgPoolBackward, [=](OpRunner& r) {
         // Overlapping windows (3, stride 2) and a last row and column no window covers.
         const MaxPoolShape overlapping{2, 3, 8, 6, 3, 2};
         const int64_t x_count = 2 * 3 * 8 * 6;
         const int64_t y_count = 2 * 3 * int64_t(overlapping.out_height()) * overlapping.out_width();
         r.device().AvgPoolBackward(overlapping, r.In(Random(y_count, 54)), r.Out(Random(x_count, 55)));
       }},
      {Op::kBatchNormForward, [](OpRunner& r) {
         // Training (running statistics and saved ones written), then inference from the
         // running statistics it left, with the saved pointers null.
         const BatchNormShape shape{3, 4, 5};
         const float* x = r.In(Random(60, 56));
         const float* gamma = r.In(Random(4, 57));
         const float* beta = r.In(Random(4, 58));
         float* running_mean = r.Out(Random(4, 59));
         float* running_var = r.Out(std::vector<float>(4, 1.5f));
         float* saved_mean = r.Out(4);
         float* saved_invstd = r.Out(4);
         r.device().BatchNormForward(shape, true, 0.1f, 1e-5f, x, gamma, beta, running_mean, running_var, saved_mean,
                                     saved_invstd, r.Out(60));
         r.device().BatchNormForward(shape, false, 0.1f, 1e-5f, x, gamma, beta, running_mean, running_var, nullptr,
                                     nullptr, r.Out(60));
       }},
      {Op::kBatchNormBackward, [](OpRunner& r) {
         const BatchNormShape shape{3, 4, 5};
         const float* x = r.In(Random(60, 60));
         const float* gamma = r.In(Random(4, 61));
         float* saved_mean = r.Out(4);
         float* saved_invstd = r.Out(4);
         r.device().BatchNormForward(shape, true, 0.1f, 1e-5f, x, gamma, r.In(Random(4, 62)), r.Out(4), r.Out(4),
                                     saved_mean, saved_invstd, r.Out(60));
         float* dx = r.Out(60);
         float* dgamma = r.Out(4);
         r.device().BatchNormBackward(shape, x, r.In(Random(60, 63)), gamma, saved_mean, saved_invstd, dx, dgamma,
                                      r.Out(4));
       }},
      {Op::kLayerNormForward, [](OpRunner& r) {
         float* saved_mean = r.Out(6);
         float* saved_invstd = r.Out(6);
         r.device().LayerNormForward(6, 10, 1e-5f, r.In(Random(60, 64)), r.In(Random(10, 65)), r.In(Random(10, 66)),
                                     saved_mean, saved_invstd, r.Out(60));
       }},
      {Op::kLayerNormBackward, [](OpRunner& r) {
         const float* x = r.In(Random(60, 67));
         const float* gamma = r.In(Random(10, 68));
         float* saved_mean = r.Out(6);
         float* saved_invstd = r.Out(6);
         r.device().LayerNormForward(6, 10, 1e-5f, x, gamma, r.In(Random(10, 69)), saved_mean, saved_invstd,
                                     r.Out(60));
         float* dx = r.Out(60);
         float* dgamma = r.Out(10);
         r.device().LayerNormBackward(6, 10, x, r.In(Random(60, 70)), gamma, saved_mean, saved_invstd, dx, dgamma,
                                      r.Out(10));
       }},
      {Op::kDropout, [](OpRunner& r) {
         float* y = r.Out(200);
         r.device().Dropout(200, 0.3f, 99, r.In(Random(200, 71)), y, r.Out(200));
       }},
      {Op::kDropoutBackward, [](OpRunner& r) {
         float* y = r.Out(200);
         float* mask = r.Out(200);
         r.device().Dropout(200, 0.3f, 100, r.In(Random(200, 72)), y, mask);
         r.device().DropoutBackward(200, mask, r.In(Random(200, 73)), r.Out(200));
       }},
      {Op::kAxpby, [](OpRunner& r) {
         const float* x = r.In(Random(150, 74));
         float* sum = r.Out(Random(150, 75));
         r.device().Axpby(150, 1.0f, x, 1.0f, sum);
         // beta 0 overwrites y without reading it: NaNs must not survive.
         float* scaled = r.Out(std::vector<float>(150, std::numeric_limits<float>::quiet_NaN()));
         r.device().Axpby(150, -0.5f, x, 0.0f, scaled);
       }},
  };
}

// Absolute tolerance for outputs whose largest magnitude is `scale`, at `precision`.
double Tolerance(DType precision, double scale) {
  switch (precision) {
    case DType::kFloat16: return 2e-3 * std::max(1.0, scale);
    case DType::kBFloat16: return 1.6e-2 * std::max(1.0, scale);
    case DType::kInt8: return 1.5 / 127.0 * std::max(1e-6, scale) + 1e-5;
    default: return 1e-4 * std::max(1.0, scale);
  }
}

// The device under test and the CPU reference, opened by a fixture's SetUp. "xrt" is pointed
// at XRT's no-op shim and a generated xclbin for the test's lifetime, unless a card is
// configured.
class DeviceUnderTest {
 public:
  // Skips (GTEST_SKIP) with the reason when the device is not viable here; the caller's SetUp
  // returns when IsSkipped().
  void Open(const std::string& name) {
    name_ = name;
    if (name == "xrt") {
      const bool card_configured =
          std::getenv("TESSERA_XRT_XCLBIN") != nullptr && std::getenv("XCL_EMULATION_MODE") == nullptr;
      if (!card_configured) {
        const test_support::XrtNoopShim shim = test_support::PrepareXrtNoopShim();
        if (!shim.ready) GTEST_SKIP() << "xrt on the no-op shim: " << shim.reason;
        xclbin_.emplace("TESSERA_XRT_XCLBIN", shim.xclbin_path);
      }
    }
    for (const auto& backend : RegisteredDeviceBackends()) {
      if (backend.name != name) continue;
      Viability viability = backend.viability();
      if (!viability.viable) GTEST_SKIP() << name << " is not viable here: " << viability.reason;
    }
    auto created = CreateDevice(name);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    device_ = std::move(created).value();
    if (device_->capabilities().kind == "xrt" && XrtUsesNoopShim()) {
      native_ops_compute_nothing_ =
          "XRT's no-op shim completes the tessera_gemm kernel's runs without computing, so there are no numbers "
          "to compare; a card checks them. XrtNoopTest checks the launch read back from the command, and the "
          "fallback accounting test checks that it ran natively";
    }
    auto reference = CreateDevice("cpu");
    ASSERT_TRUE(reference.ok());
    reference_ = std::move(reference).value();
  }

  Device& device() { return *device_; }
  Device& reference() { return *reference_; }
  const std::string& name() const { return name_; }
  // Non-empty when the device's native ops produce no numbers here, saying why.
  const std::string& native_ops_compute_nothing() const { return native_ops_compute_nothing_; }

 private:
  std::string name_;
  std::optional<test_support::ScopedEnvironmentVariable> xclbin_;  // restored after the devices are gone
  std::unique_ptr<Device> device_, reference_;
  std::string native_ops_compute_nothing_;
};

struct DeviceAndOp {
  std::string device;
  Op op;
  friend void PrintTo(const DeviceAndOp& param, std::ostream* out) {
    *out << param.device << " " << OpName(param.op);
  }
};

std::vector<DeviceAndOp> DevicesAndOps() {
  std::vector<DeviceAndOp> cases;
  for (const std::string& name : DeviceNames()) {
    for (Op op : AllOps()) cases.push_back({name, op});
  }
  return cases;
}

std::string DeviceAndOpName(const ::testing::TestParamInfo<DeviceAndOp>& info) {
  return Identifier(info.param.device) + "_" + Identifier(OpName(info.param.op));
}

class GenericOpTest : public ::testing::TestWithParam<DeviceAndOp> {
 protected:
  void SetUp() override { under_test_.Open(GetParam().device); }
  DeviceUnderTest under_test_;
};

TEST_P(GenericOpTest, MatchesTheCpuReference) {
  const Op op = GetParam().op;
  Device& device = under_test_.device();
  if (device.capabilities().Supports(op) && !under_test_.native_ops_compute_nothing().empty()) {
    GTEST_SKIP() << OpName(op) << " runs natively on " << device.capabilities().name
                 << " and is not compared: " << under_test_.native_ops_compute_nothing();
  }
  std::function<void(OpRunner&)> issue;
  for (auto& [case_op, case_issue] : OpCases()) {
    if (case_op == op) issue = case_issue;
  }
  ASSERT_TRUE(issue) << "no case issues " << OpName(op);
  OpRunner expected_runner(under_test_.reference()), got_runner(device);
  issue(expected_runner);
  issue(got_runner);
  const std::vector<float> expected = expected_runner.Results(), got = got_runner.Results();
  ASSERT_EQ(expected.size(), got.size());
  double scale = 0;
  for (float value : expected) scale = std::max(scale, std::fabs(double(value)));
  // A float32 device's host fallback is the CPU backend itself: the same numbers, up to the
  // few ulps that OpenBLAS's threading may move a sum by between two calls.
  const DType precision = device.capabilities().compute_precision;
  const bool same_kernels = precision == DType::kFloat32 && device.placement() != nullptr &&
                            device.placement()->Place(op) == Placement::kHostFallback;
  const double tolerance = same_kernels ? 4 * std::numeric_limits<float>::epsilon() * std::max(scale, 1.0)
                                        : Tolerance(precision, scale);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], expected[i], tolerance) << OpName(op) << " output " << i << " on " << under_test_.name();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, GenericOpTest, ::testing::ValuesIn(DevicesAndOps()), DeviceAndOpName);

class GenericDeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    under_test_.Open(GetParam());
    if (IsSkipped() || HasFatalFailure()) return;
    device_ = &under_test_.device();
  }
  DeviceUnderTest under_test_;
  Device* device_ = nullptr;
};

TEST_P(GenericDeviceTest, FallbacksAreAccountedExactlyForOpsOutsideTheCoverage) {
  OpPlacement* placement = device_->placement();
  if (placement == nullptr) {
    EXPECT_EQ(device_->capabilities().native_ops, AllOps()) << "a device without a placement runs every op";
    return;
  }
  placement->Reset();
  for (const auto& [op, issue] : OpCases()) {
    OpRunner runner(*device_);
    issue(runner);
    runner.Results();
  }
  for (Op op : AllOps()) {
    const OpAccount fallback = placement->Fallback(op);
    if (device_->capabilities().Supports(op)) {
      EXPECT_EQ(fallback.calls, 0u) << OpName(op);
      EXPECT_EQ(fallback.host_link_bytes(), 0u) << OpName(op);
      EXPECT_GT(placement->Native(op).calls, 0u) << OpName(op);
    } else {
      EXPECT_GT(fallback.calls, 0u) << OpName(op);
      EXPECT_GT(fallback.bytes_to_device, 0u) << OpName(op);
      if (op != Op::kFill) {
        EXPECT_GT(fallback.bytes_to_host, 0u) << OpName(op);
      }
    }
  }
  placement->Reset();
  EXPECT_TRUE(placement->Fallbacks().empty());
  EXPECT_EQ(placement->Total().calls, 0u);
}

TEST_P(GenericDeviceTest, PoolTakesNothingFromTheDriverAfterTheFirstTrainingStep) {
  ModelConfig config;
  auto model = CreateModel(config, device_);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Dataset data;
  data.count = 100 * 8, data.rows = 28, data.cols = 28;
  data.images = Random(data.count * 28 * 28, 30);
  for (int64_t i = 0; i < data.count; ++i) data.labels.push_back(static_cast<uint8_t>(i % 10));
  std::vector<int64_t> indices(data.count);
  for (int64_t i = 0; i < data.count; ++i) indices[i] = i;

  struct AllocationProbe final : GradientHook {
    uint64_t after_first_step = 0;
    Status OnGradients(Device& device, DeviceBuffer&, int64_t, int64_t step) override {
      if (step == 1) after_first_step = device.pool_stats().driver_allocations;
      return Status::Ok();
    }
  } probe;
  TrainOptions options;
  options.batch_size = 8;
  options.gradient_hook = &probe;
  auto report = TrainLocal(**model, data, indices, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->steps, 100u);
  EXPECT_GT(probe.after_first_step, 0u);
  EXPECT_EQ(device_->pool_stats().driver_allocations, probe.after_first_step);
}

INSTANTIATE_TEST_SUITE_P(Devices, GenericDeviceTest, ::testing::ValuesIn(DeviceNames()), TestName);

// ---- The emulated backend's own contracts ----

DeviceProfile Fp32ProfileWithout(std::set<Op> missing) {
  DeviceProfile profile = *FindBuiltinProfile("generic");
  profile.name = "no-conv-backward";
  for (Op op : missing) profile.native_ops.erase(op);
  return profile;
}

TEST(EmulatedDeviceTest, NamesSayEmulatedAndRegistryNamesResolve) {
  for (const DeviceProfile& profile : BuiltinProfiles()) {
    auto device = CreateDevice("emu:" + profile.name);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EXPECT_TRUE((*device)->capabilities().emulated);
    EXPECT_EQ((*device)->capabilities().kind, "emu:" + profile.name);
    EXPECT_NE((*device)->capabilities().name.find("(emulated)"), std::string::npos);
    ASSERT_NE(EmulatedProfile(**device), nullptr);
  }
}

TEST(EmulatedDeviceTest, UnknownNamesListTheKnownOnes) {
  auto unknown = CreateDevice("tpu-v9");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("emu:a100"), std::string::npos) << unknown.status().ToString();
  auto profile = CreateDevice("emu:h900");
  EXPECT_EQ(profile.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(profile.status().message().find("h900"), std::string::npos);
  EXPECT_NE(profile.status().message().find("ascend-910b"), std::string::npos) << profile.status().ToString();
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

constexpr char kValidProfile[] = R"([slow-npu]
peak_tflops_fp32 = 1.0
peak_tflops_fp16 = 8.0
memory_bandwidth_gbps = 100
memory_bytes = 1048576
host_link_gbps = 4
power_watts = 20
precision = "fp16"
native_ops = ["gemm", "relu", "fill"]
)";

TEST(EmulatedDeviceTest, LoadsAProfileFileAndRefusesMissingOrNegativeFields) {
  const std::string good = WriteFile("good_profile.toml", kValidProfile);
  auto device = CreateDevice("emu:" + good);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_EQ((*device)->capabilities().compute_precision, DType::kFloat16);
  EXPECT_EQ((*device)->capabilities().native_ops, (std::set<Op>{Op::kGemm, Op::kRelu, Op::kFill}));
  EXPECT_TRUE(CreateDevice("emu:" + good + "#slow-npu").ok());
  EXPECT_FALSE(CreateDevice("emu:" + good + "#other").ok());

  std::string missing_text = kValidProfile;
  missing_text.erase(missing_text.find("memory_bandwidth_gbps"), std::string("memory_bandwidth_gbps = 100\n").size());
  const std::string missing = WriteFile("missing_profile.toml", missing_text);
  auto missing_result = CreateDevice("emu:" + missing);
  ASSERT_EQ(missing_result.status().code(), StatusCode::kInvalidArgument);
  for (const char* part : {"missing_profile.toml", "slow-npu", "memory_bandwidth_gbps", "missing"}) {
    EXPECT_NE(missing_result.status().message().find(part), std::string::npos) << missing_result.status().ToString();
  }

  std::string negative_text = kValidProfile;
  negative_text.replace(negative_text.find("power_watts = 20"), 16, "power_watts = -5");
  const std::string negative = WriteFile("negative_profile.toml", negative_text);
  auto negative_result = LoadProfiles(negative);
  ASSERT_EQ(negative_result.status().code(), StatusCode::kInvalidArgument);
  for (const char* part : {"negative_profile.toml", "slow-npu", "power_watts", "-5"}) {
    EXPECT_NE(negative_result.status().message().find(part), std::string::npos) << negative_result.status().ToString();
  }
  EXPECT_EQ(LoadProfiles(::testing::TempDir() + "no_such.toml").status().code(), StatusCode::kNotFound);
}

TEST(EmulatedDeviceTest, NamesInErrorsAreEscapedAndAnEmptyProfileAfterTheHashIsATypo) {
  // A name from a flag or a job that holds a newline or a terminal escape must not forge a
  // log line: every message shows it escaped.
  const std::string forged = "\nERROR forged line \x1b[2J";
  const std::string good = WriteFile("only_profile.toml", kValidProfile);
  for (const std::string& name : {forged, "emu:" + forged, "emu:x" + forged + ".toml",
                                  "emu:" + good + "#" + forged}) {
    auto device = CreateDevice(name);
    ASSERT_FALSE(device.ok()) << EscapeUntrusted(name);
    const std::string message = device.status().message();
    EXPECT_EQ(message.find('\n'), std::string::npos) << EscapeUntrusted(message, 1000);
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << EscapeUntrusted(message, 1000);
    EXPECT_NE(message.find("\\nERROR forged line \\x1b[2J"), std::string::npos) << message;
  }
  EXPECT_EQ(CreateDevice("tpu\x1b-v9").status().message().rfind("unknown device 'tpu\\x1b-v9'; known devices: ", 0),
            0u);

  EXPECT_TRUE(CreateDevice("emu:" + good).ok());
  auto empty = CreateDevice("emu:" + good + "#");
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("no profile name after '#'"), std::string::npos)
      << empty.status().ToString();
  auto other = CreateDevice("emu:" + good + "#fast\n-npu");
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("has no profile 'fast\\n-npu'; it holds: slow-npu"), std::string::npos)
      << other.status().ToString();
}

TEST(MeasureDeviceTest, AGemmSizeBelowOneIsInvalidBeforeAnythingRuns) {
  auto cpu = CreateDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  // 0 made empty buffers (the copy then failed as out of range); -1 became a one-float buffer
  // and a GEMM of n = -1.
  for (int size : {0, -1, -512}) {
    auto measured = MeasureDevice(**cpu, size);
    EXPECT_EQ(measured.status().code(), StatusCode::kInvalidArgument) << size << ": " << measured.status().ToString();
    EXPECT_NE(measured.status().message().find("got " + std::to_string(size)), std::string::npos)
        << measured.status().ToString();
  }
  auto one = MeasureDevice(**cpu, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_GT(one->gemm_gflops, 0);
}

TEST(EmulatedDeviceTest, AllocationsPastTheCapacityAreResourceExhaustedNamingDeviceAndBytes) {
  DeviceProfile profile = *FindBuiltinProfile("generic");
  profile.name = "tiny";
  profile.memory_bytes = 1 << 20;
  auto device = CreateEmulatedDevice(profile);
  ASSERT_TRUE(device.ok());
  auto fits = (*device)->Allocate(512 * 1024);
  ASSERT_TRUE(fits.ok());
  auto too_big = (*device)->Allocate(4 << 20);
  ASSERT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("emu:tiny (emulated)"), std::string::npos) << too_big.status().ToString();
  EXPECT_NE(too_big.status().message().find("4194304"), std::string::npos) << too_big.status().ToString();
}

TEST(EmulatedDeviceTest, ModelledTimeFollowsTheRooflineAndPacingWaitsForIt) {
  auto device = CreateDevice("emu:a100");
  ASSERT_TRUE(device.ok());
  const int n = 256;
  OpRunner runner(**device);
  float* c = runner.Out(n * n);
  const float* a = runner.In(Random(n * n, 40));
  ResetEmulatedClock(**device);
  (*device)->Gemm(false, false, n, n, n, 1.0f, a, a, 0.0f, c);
  const OpAccount gemm = (*device)->placement()->Native(Op::kGemm);
  const double compute_ms = 2.0 * n * n * n / 19.5e12 * 1e3;
  const double memory_ms = 3.0 * n * n * 4 / 1555e9 * 1e3;
  EXPECT_NEAR(gemm.modelled_ms, std::max(compute_ms, memory_ms), 1e-9);
  EXPECT_DOUBLE_EQ(EmulatedModelledMs(**device), gemm.modelled_ms);

  DeviceProfile slow = *FindBuiltinProfile("generic");
  slow.host_link_gbps = 0.01;  // 10 MB/s: 40 KB takes 4 ms
  auto paced = CreateEmulatedDevice(slow, EmulatedDeviceOptions{.pace_real_time = true});
  ASSERT_TRUE(paced.ok());
  std::vector<float> host(10000, 1.0f);
  auto buffer = (*paced)->Allocate(host.size() * sizeof(float));
  ASSERT_TRUE(buffer.ok());
  ResetEmulatedClock(**paced);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*paced)->CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(float)).ok());
  const double elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NEAR(EmulatedModelledMs(**paced), 4.0, 1e-9);
  EXPECT_GE(elapsed_ms, EmulatedModelledMs(**paced) - 0.5);  // sleep_until never wakes early
}

TEST(EmulatedDeviceTest, TrainingWithoutNativeConvBackwardMatchesTheCpuAndAccountsTheFallbacks) {
  auto train = LoadFashionMnist("", true);
  if (!train.ok()) GTEST_SKIP() << "Fashion-MNIST not available: " << train.status().ToString();
  auto test = LoadFashionMnist("", false);
  ASSERT_TRUE(test.ok());
  std::vector<int64_t> indices(3000);
  for (int64_t i = 0; i < 3000; ++i) indices[i] = i;

  auto cpu = CreateDevice("cpu");
  auto emulated = CreateEmulatedDevice(Fp32ProfileWithout({Op::kConv2dBackwardData, Op::kConv2dBackwardFilter}));
  ASSERT_TRUE(cpu.ok() && emulated.ok());
  TrainOptions options;
  options.batch_size = 32;
  options.seed = 7;
  double accuracy[2];
  Device* devices[2] = {cpu->get(), emulated->get()};
  for (int i = 0; i < 2; ++i) {
    auto model = CreateModel(ModelConfig{}, devices[i]);
    ASSERT_TRUE(model.ok());
    ASSERT_TRUE(TrainLocal(**model, *train, indices, options).ok());
    auto eval = Evaluate(**model, *test, 500, 2000);
    ASSERT_TRUE(eval.ok());
    accuracy[i] = eval->accuracy;
  }
  EXPECT_GT(accuracy[0], 0.5);
  EXPECT_NEAR(accuracy[1], accuracy[0], 0.01);
  OpPlacement& placement = *(*emulated)->placement();
  for (Op op : {Op::kConv2dBackwardData, Op::kConv2dBackwardFilter}) {
    EXPECT_GT(placement.Fallback(op).calls, 0u) << OpName(op);
    EXPECT_GT(placement.Fallback(op).bytes_to_host, 0u) << OpName(op);
    EXPECT_GT(placement.Fallback(op).bytes_to_device, 0u) << OpName(op);
    EXPECT_EQ(placement.Native(op).calls, 0u) << OpName(op);
  }
  EXPECT_EQ(placement.Fallback(Op::kConv2dForward).calls, 0u);
  EXPECT_EQ(placement.Fallbacks().size(), 2u);
}

}  // namespace
}  // namespace tessera
