#include "device/memory_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "device/cpu/factory.h"
#include "device/registry.h"

namespace tessera {
namespace {

DriverAllocator CountingHostAllocator(int* live) {
  return DriverAllocator{[live](size_t bytes) { ++*live; return std::malloc(bytes); },
                         [live](void* address, size_t) { --*live; std::free(address); }};
}

TEST(MemoryPoolTest, SizeClassesArePowersOfTwoFrom256Bytes) {
  EXPECT_EQ(MemoryPool::SizeClass(0), 256u);
  EXPECT_EQ(MemoryPool::SizeClass(256), 256u);
  EXPECT_EQ(MemoryPool::SizeClass(257), 512u);
  EXPECT_EQ(MemoryPool::SizeClass(5000), 8192u);
}

TEST(MemoryPoolTest, ReleasedBlocksAreReusedWithoutTheDriver) {
  int live = 0;
  {
    MemoryPool pool(CountingHostAllocator(&live));
    size_t class_bytes = 0;
    for (int round = 0; round < 100; ++round) {
      auto a = pool.Acquire(1000, &class_bytes);
      ASSERT_TRUE(a.ok());
      auto b = pool.Acquire(3000, &class_bytes);
      ASSERT_TRUE(b.ok());
      pool.Release(*a, MemoryPool::SizeClass(1000));
      pool.Release(*b, MemoryPool::SizeClass(3000));
    }
    MemoryPoolStats stats = pool.stats();
    EXPECT_EQ(stats.driver_allocations, 2u);
    EXPECT_EQ(stats.pool_hits, 198u);
    EXPECT_EQ(stats.bytes_from_driver, 1024u + 4096u);
    EXPECT_EQ(stats.blocks_in_use, 0u);
    EXPECT_EQ(live, 2);
    pool.Trim();
    EXPECT_EQ(live, 0);
  }
}

TEST(MemoryPoolTest, ExhaustionIsAStatusNamingTheSize) {
  MemoryPool pool(DriverAllocator{[](size_t) -> void* { return nullptr; }, [](void*, size_t) {}});
  size_t class_bytes = 0;
  auto result = pool.Acquire(1 << 20, &class_bytes);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(result.status().message().find("1048576"), std::string::npos);
}

TEST(MemoryPoolTest, DeviceBuffersReturnToTheirDevicesPool) {
  auto device = CreateCpuDevice();
  for (int i = 0; i < 10; ++i) {
    auto buffer = device->Allocate(4096);
    ASSERT_TRUE(buffer.ok());
    EXPECT_EQ(buffer->device(), device.get());
    EXPECT_EQ(buffer->bytes(), 4096u);
  }
  EXPECT_EQ(device->pool_stats().driver_allocations, 1u);
  EXPECT_EQ(device->pool_stats().pool_hits, 9u);
}

TEST(DeviceRegistryTest, CreatesTheCpuDeviceAndNamesUnknownOnes) {
  auto cpu = CreateDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ((*cpu)->capabilities().kind, "cpu");
  auto unknown = CreateDevice("tpu");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'tpu'"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("cpu"), std::string::npos);
}

TEST(DeviceRegistryTest, ANonViableBackendSaysWhy) {
  DeviceBackend backend;
  backend.name = "test-absent-accelerator";
  backend.viability = [] { return Viability{false, "no accelerator in this test"}; };
  backend.create = []() -> Result<std::unique_ptr<Device>> { return InternalError("must not be called"); };
  ASSERT_TRUE(RegisterDeviceBackend(backend).ok());
  EXPECT_EQ(RegisterDeviceBackend(backend).code(), StatusCode::kAlreadyExists);
  auto created = CreateDevice("test-absent-accelerator");
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(created.status().message().find("no accelerator in this test"), std::string::npos);
}

}  // namespace
}  // namespace tessera
