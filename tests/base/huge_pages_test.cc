#include "base/huge_pages.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdint>

#include "tests/address_space.h"
#include "tests/base/vm_flags.h"

namespace tessera {
namespace {

using testing::AdvisedHugePages;

// Under a sanitizer malloc is the sanitizer's, whose blocks are never advised (base/huge_pages.cc).
constexpr bool kSanitizerMalloc = testing::kSanitizerRuntime;

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }
const void* Pointer(uintptr_t a) { return reinterpret_cast<const void*>(a); }
uintptr_t FirstHugePageIn(const void* p) { return (Address(p) + kHugePageBytes - 1) & ~(kHugePageBytes - 1); }

class HugePagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::KernelHasTransparentHugePages()) {
      GTEST_SKIP() << "this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage/enabled): "
                      "the advice is refused and 4 KiB pages serve";
    }
    // As a lean worker: large buffers mapped for themselves, the advice on.
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    EnableHugePageAdvice(true);
  }
  void TearDown() override {
    EnableHugePageAdvice(false);
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);  // whatever a test set
  }
};

TEST_F(HugePagesTest, ALargeBufferIsAdvisedOnTheWholeHugePagesInsideIt) {
  if (kSanitizerMalloc) GTEST_SKIP() << "a sanitizer's malloc: its blocks are not glibc's mappings and are left alone";
  const size_t n = (size_t{10} << 20) / sizeof(float) + 12345;  // not a whole number of pages
  std::vector<float> values = ZeroedFloats(n);
  ASSERT_EQ(values.size(), n);
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; }));
  const uintptr_t first = FirstHugePageIn(values.data());
  const uintptr_t end = Address(values.data() + n);
  ASSERT_LT(first + kHugePageBytes, end);
  EXPECT_TRUE(AdvisedHugePages(Pointer(first)));
  EXPECT_TRUE(AdvisedHugePages(Pointer((end & ~(kHugePageBytes - 1)) - 1)));
  // A huge page is resident whole once touched: the partial pages at either end are not
  // advised, so that what is resident is what the buffer uses.
  if (first != Address(values.data())) {
    EXPECT_FALSE(AdvisedHugePages(values.data()));
  }
  if ((end & (kHugePageBytes - 1)) != 0) {
    EXPECT_FALSE(AdvisedHugePages(Pointer(end - 1)));
  }
}

// A large block malloc serves from the heap (here: above a raised mmap threshold; in a lean
// worker, a free block of the heap that fits) is not advised: the advice would outlive it.
TEST_F(HugePagesTest, ABufferInTheHeapIsLeftAlone) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  std::vector<float> values = ZeroedFloats((size_t{8} << 20) / sizeof(float));
  EXPECT_FALSE(AdvisedHugePages(Pointer(FirstHugePageIn(values.data()))));
  std::string bytes;
  ResizeZeroed(bytes, size_t{6} << 20);
  EXPECT_FALSE(AdvisedHugePages(Pointer(FirstHugePageIn(bytes.data()))));
}

// Memory mapped for itself on a 2 MiB boundary (the CPU device's large blocks).
TEST_F(HugePagesTest, AMappingOfItsOwnStartsOnAHugePage) {
  const size_t bytes = (size_t{5} << 20) + 100;
  void* block = MapHugeAligned(bytes);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(Address(block) % kHugePageBytes, 0u);
  EXPECT_EQ(static_cast<const char*>(block)[bytes - 1], 0);  // zeroed, and all of it there
  AdviseHugePages(block, bytes);
  EXPECT_TRUE(AdvisedHugePages(block));
  EXPECT_FALSE(AdvisedHugePages(static_cast<const char*>(block) + (size_t{4} << 20)));  // the partial page
  UnmapHugeAligned(block, bytes);
}

TEST_F(HugePagesTest, NothingIsAdvisedUntilAProcessAsks) {
  EnableHugePageAdvice(false);
  std::vector<float> values = ZeroedFloats((size_t{8} << 20) / sizeof(float));
  EXPECT_FALSE(AdvisedHugePages(Pointer(FirstHugePageIn(values.data()))));
  AdviseHugePages(values.data(), values.size() * sizeof(float));
  EXPECT_FALSE(AdvisedHugePages(Pointer(FirstHugePageIn(values.data()))));
}

TEST_F(HugePagesTest, BytesAreAdvisedAsFloatsAre) {
  if (kSanitizerMalloc) GTEST_SKIP() << "a sanitizer's malloc: its blocks are not glibc's mappings and are left alone";
  std::string bytes;
  ResizeZeroed(bytes, size_t{6} << 20);
  ASSERT_EQ(bytes.size(), size_t{6} << 20);
  EXPECT_EQ(bytes.find_first_not_of('\0'), std::string::npos);
  EXPECT_TRUE(AdvisedHugePages(Pointer(FirstHugePageIn(bytes.data()))));
}

TEST_F(HugePagesTest, SmallBuffersAreLeftAlone) {
  // Under kHugePageAdviceMinBytes: no system call, no advice.
  std::vector<float> values = ZeroedFloats(kHugePageAdviceMinBytes / sizeof(float) - 1);
  EXPECT_EQ(values.size(), kHugePageAdviceMinBytes / sizeof(float) - 1);
  EXPECT_FALSE(AdvisedHugePages(values.data()));
  EXPECT_FALSE(AdvisedHugePages(values.data() + values.size() / 2));
  std::string bytes;
  ResizeZeroed(bytes, 4096);
  EXPECT_EQ(bytes, std::string(4096, '\0'));
  EXPECT_TRUE(ZeroedFloats(0).empty());
}

}  // namespace
}  // namespace tessera
