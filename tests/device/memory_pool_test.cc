#include "device/memory_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "base/huge_pages.h"
#include "device/cpu/factory.h"
#include "device/registry.h"
#include "tests/base/vm_flags.h"

namespace tessera {
namespace {

DriverAllocator CountingHostAllocator(int* live) {
  return DriverAllocator{[live](size_t bytes) { ++*live; return std::malloc(bytes); },
                         [live](void* address, size_t) { --*live; std::free(address); }};
}

TEST(MemoryPoolTest, SizeClassesAreFourPerDoublingFrom256Bytes) {
  EXPECT_EQ(MemoryPool::SizeClass(0), 256u);
  EXPECT_EQ(MemoryPool::SizeClass(256), 256u);
  EXPECT_EQ(MemoryPool::SizeClass(257), 320u);
  EXPECT_EQ(MemoryPool::SizeClass(449), 512u);
  EXPECT_EQ(MemoryPool::SizeClass(5000), 5120u);
  EXPECT_EQ(MemoryPool::SizeClass(size_t{10} << 20), size_t{10} << 20);
  EXPECT_EQ(MemoryPool::SizeClass((size_t{10} << 20) + 1), size_t{12} << 20);
  EXPECT_EQ(MemoryPool::SizeClass(MemoryPool::kLargestClass - 1), MemoryPool::kLargestClass);
}

// Every request gets a block at least its size and at most a quarter larger; classes never
// shrink as requests grow, and stay multiples of the CPU device's 64-byte alignment.
TEST(MemoryPoolTest, ABlockIsAtMostAQuarterLargerThanItsRequest) {
  size_t previous = 0;
  for (size_t bytes = 1; bytes <= (size_t{1} << 22); bytes += 1 + bytes / 97) {
    const size_t size = MemoryPool::SizeClass(bytes);
    ASSERT_GE(size, bytes) << bytes;
    if (bytes > 256) ASSERT_LE(size * 4, bytes * 5) << bytes;
    ASSERT_GE(size, previous) << bytes;
    ASSERT_EQ(size % 64, 0u) << bytes;
    previous = size;
  }
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
    EXPECT_EQ(stats.bytes_from_driver, 1024u + 3072u);
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

TEST(MemoryPoolTest, ARequestAboveTheLargestSizeClassIsRefusedWithoutReachingTheDriver) {
  EXPECT_EQ(MemoryPool::SizeClass(MemoryPool::kLargestClass), MemoryPool::kLargestClass);
  EXPECT_EQ(MemoryPool::SizeClass(MemoryPool::kLargestClass + 1), MemoryPool::kNoClass);
  EXPECT_EQ(MemoryPool::SizeClass(SIZE_MAX), MemoryPool::kNoClass);
  int driver_calls = 0;
  MemoryPool pool(DriverAllocator{[&driver_calls](size_t) -> void* { ++driver_calls; return nullptr; },
                                  [](void*, size_t) {}});
  size_t class_bytes = 0;
  for (size_t bytes : {MemoryPool::kLargestClass + 1, SIZE_MAX}) {
    auto result = pool.Acquire(bytes, &class_bytes);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(result.status().message().find(std::to_string(bytes)), std::string::npos)
        << result.status().ToString();
  }
  EXPECT_EQ(driver_calls, 0);
  auto device = CreateCpuDevice();
  auto buffer = device->Allocate(SIZE_MAX);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), StatusCode::kResourceExhausted);
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

// A model's parameters, gradients and optimiser state are each one large block: it starts on a
// 2 MiB boundary and the whole huge pages the buffer fills are advised, not the rest of its
// size class (a huge page is resident whole once any of it is touched).
TEST(MemoryPoolTest, TheCpuDevicesLargeBuffersAreAlignedForHugePagesAndAdvised) {
  if (!testing::KernelHasTransparentHugePages()) {
    GTEST_SKIP() << "this kernel has no transparent huge pages: the advice is refused and 4 KiB pages serve";
  }
  EnableHugePageAdvice(true);  // as a lean worker does
  struct Off {
    ~Off() { EnableHugePageAdvice(false); }
  } off;
  auto device = CreateCpuDevice();
  const size_t bytes = (size_t{10} << 20) + 4096;  // its size class is 12 MiB
  auto buffer = device->Allocate(bytes);
  ASSERT_TRUE(buffer.ok());
  const auto start = reinterpret_cast<uintptr_t>(buffer->data());
  EXPECT_EQ(start % kHugePageBytes, 0u);
  EXPECT_TRUE(testing::AdvisedHugePages(buffer->data()));
  EXPECT_TRUE(testing::AdvisedHugePages(reinterpret_cast<const void*>(start + (size_t{10} << 20) - 1)));
  EXPECT_FALSE(testing::AdvisedHugePages(reinterpret_cast<const void*>(start + (size_t{10} << 20))));
  EXPECT_FALSE(testing::AdvisedHugePages(reinterpret_cast<const void*>(start + (size_t{12} << 20) - 1)));
  auto small = device->Allocate(64 << 10);
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE(testing::AdvisedHugePages(small->data()));
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
