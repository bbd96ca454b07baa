// The CUDA backend's own contracts, beyond the generic op suites (device_ops_test.cc and
// generic_device_test.cc, which run "cuda" like every other backend): it is registered and
// says why it is not viable; its pool sits over cudaMalloc and serves repeats from the free
// lists; copies back to the host wait for queued work; the TF32 option. Everything that needs
// a GPU is skipped with the reason on a machine without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "device/cuda/factory.h"
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
      EXPECT_TRUE(viability.reason.rfind("no CUDA device", 0) == 0 ||
                  viability.reason.rfind("built without CUDA", 0) == 0)
          << viability.reason;
      auto device = CreateDevice("cuda");
      ASSERT_FALSE(device.ok());
      EXPECT_NE(device.status().ToString().find(viability.reason), std::string::npos) << device.status().ToString();
    }
  }
  EXPECT_TRUE(found) << "no \"cuda\" entry in the device registry";
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
  EXPECT_NE(capabilities.name.find("#0"), std::string::npos) << capabilities.name;
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

TEST_F(CudaDeviceTest, Tf32GemmIsCloseToFloat32) {
  CudaDeviceOptions options;
  options.allow_tf32 = true;
  auto created = CreateCudaDevice(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Device& tf32 = **created;
  EXPECT_NE(tf32.capabilities().name.find("TF32"), std::string::npos);
  const int n = 256;
  std::mt19937 engine(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> a(n * n);
  for (float& value : a) value = uniform(engine);
  std::vector<float> exact(n * n), rounded(n * n);
  const std::pair<Device*, std::vector<float>*> runs[] = {{device_.get(), &exact}, {&tf32, &rounded}};
  for (const auto& [device, out] : runs) {
    auto in = device->Allocate(a.size() * 4), c = device->Allocate(a.size() * 4);
    ASSERT_TRUE(device->CopyHostToDevice(a.data(), *in, 0, a.size() * 4).ok());
    device->Gemm(false, true, n, n, n, 1.0f, in->f32(), in->f32(), 0.0f, c->f32());
    ASSERT_TRUE(device->CopyDeviceToHost(*c, 0, out->data(), a.size() * 4).ok());
  }
  float worst = 0;
  for (int i = 0; i < n * n; ++i) worst = std::max(worst, std::fabs(exact[i] - rounded[i]));
  EXPECT_LT(worst, 0.1f);  // TF32 keeps 10 mantissa bits; |entries| are around sqrt(n) / 3
}

}  // namespace
}  // namespace tessera
