// The CUDA backend's own contracts, beyond the generic op suites (device_ops_test.cc and
// generic_device_test.cc, which run "cuda" like every other backend, and the odd-shape sweep
// in tests/bench): it is registered and says why it is not viable; its module loads into the
// test executable and answers; its name; its pool sits over cudaMalloc and serves repeats
// from the free lists; an op short of scratch memory reports ResourceExhausted instead of
// ending the process; copies back to the host wait for queued work; the TF32 option really
// engages tensor cores; max pool's backward is deterministic; dropout drops the elements the
// host draw drops; and two epochs of SimpleCNN on the GPU match the CPU. Everything that needs
// a GPU is skipped with the reason on a machine without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

#include "base/backend_module.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cuda/factory.h"
#include "device/cuda/module.h"
#include "device/op_cost.h"
#include "device/registry.h"

namespace tessera {
namespace {

TEST(CudaBackendTest, IsRegisteredAndExplainsWhenNotViable) {
  bool found = false;
  for (const auto& backend : RegisteredDeviceBackends()) {
    if (backend.name != "cuda") continue;
    found = true;
    EXPECT_GT(backend.priority, 0) << "real hardware is preferred to the CPU";
    const Viability viability = backend.viability();
    if (!viability.viable) {
      // No driver (the module is then not even loaded), no device, or no CUDA in this build;
      // never a module that failed to load into this executable.
      EXPECT_TRUE(viability.reason.rfind("no CUDA driver: ", 0) == 0 ||
                  viability.reason.rfind("no CUDA device", 0) == 0 ||
                  viability.reason.rfind("built without CUDA", 0) == 0)
          << viability.reason;
      auto device = CreateDevice("cuda");
      ASSERT_FALSE(device.ok());
      EXPECT_NE(device.status().ToString().find(viability.reason), std::string::npos) << device.status().ToString();
    }
  }
  EXPECT_TRUE(found) << "no \"cuda\" entry in the device registry";
}

// The module itself, loaded here even without a driver: every symbol it takes from this
// executable resolves, its table is the version this build expects, and its own viability
// check runs (without a GPU it gives the CUDA runtime's reason).
TEST(CudaBackendTest, TheModuleLoadsIntoThisExecutableAndAnswers) {
  if (CudaViability().reason.rfind("built without CUDA", 0) == 0) GTEST_SKIP() << CudaViability().reason;
  auto entry = LoadBackendModule(kCudaModuleFile, kCudaModuleEntry);
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  const CudaModule* module = reinterpret_cast<const CudaModule* (*)()>(*entry)();
  ASSERT_NE(module, nullptr);
  EXPECT_EQ(module->abi_version, kCudaModuleAbiVersion);
  EXPECT_EQ(module->table_bytes, sizeof(CudaModule));
  const Viability viability = module->viability(CudaDeviceOptions{});
  if (viability.viable) {
    auto device = module->create(CudaDeviceOptions{});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EXPECT_EQ((*device)->capabilities().kind, "cuda");
    return;
  }
  EXPECT_EQ(viability.reason.rfind("no CUDA device", 0), 0u) << viability.reason;
  auto device = module->create(CudaDeviceOptions{});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kUnavailable) << device.status().ToString();
  EXPECT_NE(device.status().message().find(viability.reason), std::string::npos) << device.status().ToString();
}

TEST(CudaBackendTest, NamesCarryTheVendorOnceTheIndexAndTf32) {
  EXPECT_EQ(CudaDeviceName("NVIDIA H200", 0, false), "NVIDIA H200 #0");
  EXPECT_EQ(CudaDeviceName("NVIDIA H200", 1, true), "NVIDIA H200 #1 (TF32 GEMM)");
  EXPECT_EQ(CudaDeviceName("Tesla V100-SXM2-16GB", 3, false), "NVIDIA Tesla V100-SXM2-16GB #3");
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Viability viability = CudaViability();
    if (!viability.viable) GTEST_SKIP() << "cuda is not viable here: " << viability.reason;
    auto created = CreateCudaDevice();
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    device_ = std::move(created).value();
  }

  std::unique_ptr<Device> device_;
};

TEST_F(CudaDeviceTest, CapabilitiesNameTheGpuAndEveryOp) {
  const DeviceCapabilities& capabilities = device_->capabilities();
  EXPECT_EQ(capabilities.kind, "cuda");
  EXPECT_EQ(capabilities.name.rfind("NVIDIA ", 0), 0u) << capabilities.name;
  EXPECT_EQ(capabilities.name.find("NVIDIA NVIDIA"), std::string::npos) << capabilities.name;
  EXPECT_NE(capabilities.name.find("#0"), std::string::npos) << capabilities.name;
  EXPECT_EQ(capabilities.device_index, 0);
  EXPECT_EQ(capabilities.native_ops, AllOps());
  EXPECT_FALSE(capabilities.emulated);
  EXPECT_GT(capabilities.memory_bytes, 0u);
}

TEST_F(CudaDeviceTest, PoolOverCudaMallocServesRepeatsFromTheFreeList) {
  const MemoryPoolStats before = device_->pool_stats();
  for (int round = 0; round < 5; ++round) {
    auto buffer = device_->Allocate(3 << 20);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    device_->Fill(buffer->f32_count(), float(round), buffer->f32());
    ASSERT_TRUE(device_->Synchronize().ok());
  }
  const MemoryPoolStats after = device_->pool_stats();
  EXPECT_EQ(after.driver_allocations - before.driver_allocations, 1u);
  EXPECT_EQ(after.pool_hits - before.pool_hits, 4u);
  EXPECT_EQ(after.blocks_in_use, before.blocks_in_use);
}

TEST_F(CudaDeviceTest, OutOfMemoryIsResourceExhaustedNamingTheDevice) {
  auto huge = device_->Allocate(size_t(1) << 50);  // a petabyte
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().ToString().find(device_->capabilities().name), std::string::npos)
      << huge.status().ToString();
}

TEST_F(CudaDeviceTest, CopyToHostWaitsForQueuedWork) {
  const int64_t count = 1 << 22;
  auto buffer = device_->Allocate(count * sizeof(float));
  ASSERT_TRUE(buffer.ok());
  for (int i = 0; i < 20; ++i) device_->Fill(count, float(i), buffer->f32());  // queued, not waited for
  device_->ReduceSum(count, buffer->f32(), buffer->f32());
  float sum = 0;
  ASSERT_TRUE(device_->CopyDeviceToHost(*buffer, 0, &sum, sizeof(sum)).ok());
  EXPECT_FLOAT_EQ(sum, 19.0f * count);
}

TEST_F(CudaDeviceTest, CopiesOutsideABufferAreOutOfRange) {
  auto buffer = device_->Allocate(1024);
  ASSERT_TRUE(buffer.ok());
  std::vector<char> host(2048);
  EXPECT_FALSE(device_->CopyHostToDevice(host.data(), *buffer, 512, 1024).ok());
  EXPECT_FALSE(device_->CopyDeviceToHost(*buffer, 1000, host.data(), 100).ok());
}

// TF32 keeps 10 mantissa bits: entries of a 1024-long dot product of values in [-1, 1) (about
// 10 in size) move by around 1e-2 from the float32 result, which itself stays within 1e-4 or
// so of a double reference. A TF32 device whose results stay within 1e-3 of float32's never
// engaged the tensor cores.
TEST_F(CudaDeviceTest, Tf32GemmEngagesTensorCoresAndStaysClose) {
  CudaDeviceOptions options;
  options.allow_tf32 = true;
  auto created = CreateCudaDevice(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Device& tf32 = **created;
  EXPECT_NE(tf32.capabilities().name.find("TF32"), std::string::npos);
  const int n = 1024;
  std::mt19937 engine(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> a(size_t(n) * n);
  for (float& value : a) value = uniform(engine);
  std::vector<float> exact(a.size()), rounded(a.size());
  const std::pair<Device*, std::vector<float>*> runs[] = {{device_.get(), &exact}, {&tf32, &rounded}};
  for (const auto& [device, out] : runs) {
    auto in = device->Allocate(a.size() * 4), c = device->Allocate(a.size() * 4);
    ASSERT_TRUE(in.ok() && c.ok());
    ASSERT_TRUE(device->CopyHostToDevice(a.data(), *in, 0, a.size() * 4).ok());
    device->Gemm(false, true, n, n, n, 1.0f, in->f32(), in->f32(), 0.0f, c->f32());
    ASSERT_TRUE(device->CopyDeviceToHost(*c, 0, out->data(), a.size() * 4).ok());
  }
  double fp32_error = 0, tf32_error = 0, tf32_shift = 0;
  for (int sample = 0; sample < 2000; ++sample) {
    const int i = (sample * 7919) % n, j = (sample * 104729) % n;
    double reference = 0;
    for (int p = 0; p < n; ++p) reference += double(a[size_t(i) * n + p]) * a[size_t(j) * n + p];
    const size_t at = size_t(i) * n + j;
    fp32_error = std::max(fp32_error, std::fabs(exact[at] - reference));
    tf32_error = std::max(tf32_error, std::fabs(rounded[at] - reference));
    tf32_shift = std::max(tf32_shift, std::fabs(double(rounded[at]) - exact[at]));
  }
  std::cout << "largest error against double: float32 " << fp32_error << ", TF32 " << tf32_error << "\n";
  EXPECT_LT(fp32_error, 1e-3);
  EXPECT_GT(tf32_shift, 1e-3) << "TF32 results are float32's: the tensor cores never engaged";
  EXPECT_LT(tf32_error, 0.1);
}

// Windows of 3 with stride 2 overlap: an input chosen by two windows gets two gradients. The
// sum must not depend on which thread adds first.
TEST_F(CudaDeviceTest, MaxPoolBackwardIsDeterministicAndMatchesTheCpuBitForBit) {
  auto cpu = CreateDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  MaxPoolShape shape;
  shape.batch = 16, shape.channels = 8, shape.in_height = 33, shape.in_width = 31, shape.window = 3, shape.stride = 2;
  const size_t inputs = PoolInputCount(shape), outputs = PoolOutputCount(shape);
  std::mt19937 engine(5);
  std::uniform_int_distribution<int> level(-2, 2);  // ties, so windows share their maximum
  std::vector<float> x(inputs), dy(outputs);
  for (float& value : x) value = float(level(engine));
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& value : dy) value = uniform(engine);
  auto run = [&](Device& device) {
    auto xb = device.Allocate(inputs * 4), yb = device.Allocate(outputs * 4), argmax = device.Allocate(outputs * 4);
    auto dyb = device.Allocate(outputs * 4), dxb = device.Allocate(inputs * 4);
    EXPECT_TRUE(xb.ok() && yb.ok() && argmax.ok() && dyb.ok() && dxb.ok());
    EXPECT_TRUE(device.CopyHostToDevice(x.data(), *xb, 0, inputs * 4).ok());
    EXPECT_TRUE(device.CopyHostToDevice(dy.data(), *dyb, 0, outputs * 4).ok());
    device.MaxPool(shape, xb->f32(), yb->f32(), argmax->i32());
    device.MaxPoolBackward(shape, dyb->f32(), argmax->i32(), dxb->f32());
    std::vector<float> dx(inputs);
    EXPECT_TRUE(device.CopyDeviceToHost(*dxb, 0, dx.data(), inputs * 4).ok());
    return dx;
  };
  const std::vector<float> expected = run(**cpu);
  for (int repeat = 0; repeat < 3; ++repeat) {
    const std::vector<float> got = run(*device_);
    ASSERT_EQ(std::memcmp(got.data(), expected.data(), inputs * 4), 0) << "run " << repeat << " differs from the CPU";
  }
}

// The kernel calls device.h's DropoutUniform compiled for the GPU: it must drop exactly the
// elements the host's copy of the function drops, with the same float scale, or the backends'
// trainings would diverge from the first dropout layer on.
TEST_F(CudaDeviceTest, DropoutDropsTheElementsTheHostDrawDrops) {
  const int64_t count = 100003;
  const float probability = 0.3f;
  const uint64_t seed = 0xDEADBEEFCAFEF00Dull;
  std::vector<float> x(count);
  std::mt19937 engine(11);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& value : x) value = uniform(engine);
  auto xb = device_->Allocate(count * 4), yb = device_->Allocate(count * 4), mask = device_->Allocate(count * 4);
  ASSERT_TRUE(xb.ok() && yb.ok() && mask.ok());
  ASSERT_TRUE(device_->CopyHostToDevice(x.data(), *xb, 0, count * 4).ok());
  device_->Dropout(count, probability, seed, xb->f32(), yb->f32(), mask->f32());
  std::vector<float> y(count), m(count);
  ASSERT_TRUE(device_->CopyDeviceToHost(*yb, 0, y.data(), count * 4).ok());
  ASSERT_TRUE(device_->CopyDeviceToHost(*mask, 0, m.data(), count * 4).ok());
  const float scale = 1.0f / (1.0f - probability);
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float expected = DropoutUniform(seed, uint64_t(i)) >= probability ? scale : 0.0f;
    ASSERT_EQ(m[i], expected) << "element " << i;
    ASSERT_EQ(y[i], x[i] * expected) << "element " << i;
    kept += expected != 0.0f;
  }
  EXPECT_NEAR(double(kept) / count, 1.0 - probability, 0.01);
}

// Every byte of the card is taken, then a convolution needs im2col scratch: the op does
// nothing, and the next Synchronize says why, instead of the process aborting.
TEST_F(CudaDeviceTest, AnOpShortOfScratchMemoryReportsResourceExhausted) {
  Conv2dShape shape;
  shape.batch = 256, shape.in_channels = 64, shape.in_height = 64, shape.in_width = 64;
  shape.out_channels = 8, shape.kernel_height = 3, shape.kernel_width = 3, shape.padding = 1;
  auto x = device_->Allocate(ConvInputCount(shape) * 4), w = device_->Allocate(ConvWeightCount(shape) * 4);
  auto y = device_->Allocate(ConvOutputCount(shape) * 4);
  ASSERT_TRUE(x.ok() && w.ok() && y.ok());
  std::vector<DeviceBuffer> hoard;
  for (size_t block = size_t(1) << 30; block >= (size_t(1) << 20); block /= 2) {
    for (;;) {
      auto taken = device_->Allocate(block);
      if (!taken.ok()) break;
      hoard.push_back(std::move(taken).value());
    }
  }
  device_->Conv2dForward(shape, x->f32(), w->f32(), nullptr, y->f32());  // 2.4 GB of columns
  const Status status = device_->Synchronize();
  hoard.clear();
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("conv2d_forward"), std::string::npos) << status.ToString();
  EXPECT_TRUE(device_->Synchronize().ok()) << "the failure is reported once";
}

// SimpleCNN trained on Fashion-MNIST from the same seed (initial weights and batch order) on
// the GPU and on the CPU: the summation orders differ, the training must not. SGD amplifies
// rounding differences, so each comparison is printed beside the CPU against itself with every
// initial weight moved by about one ulp, the noise floor to read a failure against.
//  - Twenty steps, before the amplification has grown: the mean loss and the weights agree
//    closely, so an op that is slightly wrong (a bias gradient missing a term, a scaled
//    weight decay) fails here rather than vanishing into the noise of a long run.
//  - Two epochs (1,876 steps): test accuracy within 0.5 points and the mean training loss
//    within 0.5% relative. The one-ulp floor of the mean loss was 2.6e-4 relative on the
//    development machine and 5.2e-4 on the H200 machine's host; the GPU, which reorders the
//    sums of every op of every step rather than nudging the start once, came 1.8e-3 from the
//    CPU there (its accuracy 0.15 points).
class CudaTrainingTest : public ::testing::Test {
 protected:
  struct Run {
    double loss = 0, accuracy = 0;
    TensorSet state;
  };

  void SetUp() override {
    const Viability viability = CudaViability();
    if (!viability.viable) {
      GTEST_SKIP() << "cuda is not viable here: " << viability.reason;
    }
    auto train = LoadFashionMnist("", true);
    auto test = LoadFashionMnist("", false);
    if (!train.ok() || !test.ok()) {
      GTEST_SKIP() << "Fashion-MNIST not available: " << (train.ok() ? test.status() : train.status()).ToString();
    }
    train_ = std::move(train).value();
    test_ = std::move(test).value();
  }

  Run Train(const std::string& name, bool nudged, uint32_t epochs, int64_t samples) {
    ModelConfig config;
    config.seed = 7;
    TrainOptions options;
    options.epochs = epochs;
    options.batch_size = 64;
    options.learning_rate = 0.01f;
    options.momentum = 0.9f;
    options.weight_decay = 1e-5f;
    options.seed = 7;
    std::vector<int64_t> indices(samples);
    std::iota(indices.begin(), indices.end(), 0);
    auto device = CreateDevice(name);
    EXPECT_TRUE(device.ok()) << device.status().ToString();
    if (!device.ok()) return {};
    auto model = CreateModel(config, device->get());
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    if (!model.ok()) return {};
    if (nudged) {
      TensorSet state = (*model)->GetState().value();
      for (auto& tensor : state) {
        for (size_t i = 0; i < tensor.values.size(); ++i) tensor.values[i] *= i % 2 ? 1.0f + 1.2e-7f : 1.0f - 1.2e-7f;
      }
      EXPECT_TRUE((*model)->SetState(state).ok());
    }
    auto report = TrainLocal(**model, train_, indices, options);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    auto evaluated = Evaluate(**model, test_);
    EXPECT_TRUE(evaluated.ok()) << evaluated.status().ToString();
    auto state = (*model)->GetState();
    EXPECT_TRUE(state.ok());
    if (!report.ok() || !evaluated.ok() || !state.ok()) return {};
    std::cout << name << (nudged ? ", initial weights moved by one ulp" : "") << ", " << report->steps
              << " steps: mean training loss " << report->mean_loss << ", test accuracy "
              << 100 * evaluated->accuracy << "%, test loss " << evaluated->loss << "\n";
    return {report->mean_loss, evaluated->accuracy, std::move(state).value()};
  }

  // ||a - b|| / ||b|| over every weight of the model.
  static double RelativeDistance(const TensorSet& a, const TensorSet& b) {
    double difference = 0, norm = 0;
    for (size_t t = 0; t < a.size() && t < b.size(); ++t) {
      for (size_t i = 0; i < a[t].values.size() && i < b[t].values.size(); ++i) {
        const double d = double(a[t].values[i]) - b[t].values[i];
        difference += d * d;
        norm += double(b[t].values[i]) * b[t].values[i];
      }
    }
    return norm > 0 ? std::sqrt(difference / norm) : 0;
  }

  Dataset train_, test_;
};

TEST_F(CudaTrainingTest, TwentyStepsOfSimpleCnnMatchTheCpuClosely) {
  const Run gpu = Train("cuda", false, 1, 20 * 64), cpu = Train("cpu", false, 1, 20 * 64),
            nudged = Train("cpu", true, 1, 20 * 64);
  ASSERT_GT(cpu.loss, 0);
  const double loss = std::fabs(gpu.loss - cpu.loss) / cpu.loss, weights = RelativeDistance(gpu.state, cpu.state);
  std::cout << "cuda against cpu after 20 steps: mean loss " << loss << " relative, weights " << weights
            << " relative; the cpu's own noise floor: " << std::fabs(nudged.loss - cpu.loss) / cpu.loss
            << " and " << RelativeDistance(nudged.state, cpu.state) << "\n";
  EXPECT_LT(loss, 1e-5) << "mean training loss over the first 20 steps";
  EXPECT_LT(weights, 1e-5) << "the weights after 20 steps";
}

TEST_F(CudaTrainingTest, TwoEpochsOfSimpleCnnMatchTheCpuFromOneSeed) {
  const int64_t all = train_.count;
  const Run gpu = Train("cuda", false, 2, all), cpu = Train("cpu", false, 2, all),
            nudged = Train("cpu", true, 2, all);
  ASSERT_GT(cpu.loss, 0);
  std::cout << "cuda against cpu: mean loss " << std::fabs(gpu.loss - cpu.loss) / cpu.loss
            << " relative, accuracy " << 100 * std::fabs(gpu.accuracy - cpu.accuracy)
            << " points; the cpu's own noise floor: " << std::fabs(nudged.loss - cpu.loss) / cpu.loss << " relative, "
            << 100 * std::fabs(nudged.accuracy - cpu.accuracy) << " points\n";
  EXPECT_NEAR(gpu.loss, cpu.loss, 5e-3 * cpu.loss) << "mean training loss over the two epochs";
  EXPECT_NEAR(100 * gpu.accuracy, 100 * cpu.accuracy, 0.5) << "test accuracy, percentage points";
  EXPECT_GT(cpu.accuracy, 0.8) << "two epochs of SimpleCNN reach well over 80%";
}

}  // namespace
}  // namespace tessera
