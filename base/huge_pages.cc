#include "base/huge_pages.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace tessera {
namespace {

std::atomic<bool> advice_enabled{false};

constexpr uintptr_t kSmallPage = 4096;

// True when `data`, from malloc, is a block glibc mapped for itself: such a block starts two
// words into its first page, after a header whose size word has bit 1 (IS_MMAPPED) set. Where
// the allocator is not glibc's own (a sanitizer's, or none at all), false: no advice.
bool MappedByMalloc(const void* data) {
#if defined(__GLIBC__) && defined(__linux__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
  return false;
#endif
#endif
  const uintptr_t at = reinterpret_cast<uintptr_t>(data);
  if (data == nullptr || at % kSmallPage != 2 * sizeof(size_t)) return false;  // the header is in the same page
  size_t size_word = 0;
  std::memcpy(&size_word, static_cast<const char*>(data) - sizeof(size_t), sizeof(size_word));
  return (size_word & 2) != 0;
#else
  (void)data;
  return false;
#endif
}

}  // namespace

void EnableHugePageAdvice(bool on) { advice_enabled.store(on, std::memory_order_relaxed); }

bool HugePageAdviceEnabled() { return advice_enabled.load(std::memory_order_relaxed); }

void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (data == nullptr || bytes < kHugePageAdviceMinBytes || !HugePageAdviceEnabled()) return;
  constexpr uintptr_t kHuge = kHugePageBytes;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (start + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (start + bytes) & ~(kHuge - 1);
  if (end <= first) return;
  // Advice only: a kernel without transparent huge pages refuses it, and 4 KiB pages serve.
  (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

std::vector<float> ZeroedFloats(size_t n) {
  std::vector<float> values;
  if (n * sizeof(float) >= kHugePageAdviceMinBytes && HugePageAdviceEnabled()) {
    values.reserve(n);
    if (MappedByMalloc(values.data())) AdviseHugePages(values.data(), n * sizeof(float));
  }
  values.resize(n);
  return values;
}

void ResizeZeroed(std::string& bytes, size_t n) {
  if (n >= kHugePageAdviceMinBytes && bytes.empty() && HugePageAdviceEnabled()) {
    bytes.reserve(n);
    if (MappedByMalloc(bytes.data())) AdviseHugePages(bytes.data(), n);
  }
  bytes.resize(n);
}

void* MapHugeAligned(size_t bytes) {
#ifdef __linux__
  const size_t size = (bytes + kSmallPage - 1) & ~(kSmallPage - 1);
  if (size == 0 || size > SIZE_MAX - kHugePageBytes) return nullptr;
  // Mapped with a huge page's worth of slack, then trimmed to start on a 2 MiB boundary.
  void* mapped = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  if (aligned > start) munmap(mapped, aligned - start);
  const uintptr_t end = start + size + kHugePageBytes;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  return reinterpret_cast<void*>(aligned);
#else
  (void)bytes;
  return nullptr;
#endif
}

void UnmapHugeAligned(void* data, size_t bytes) {
#ifdef __linux__
  if (data != nullptr) munmap(data, (bytes + kSmallPage - 1) & ~(kSmallPage - 1));
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace tessera
