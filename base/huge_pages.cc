#include "base/huge_pages.h"

#include <atomic>
#include <cstdint>
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace tessera {
namespace {

std::atomic<bool> advice_enabled{false};

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
    AdviseHugePages(values.data(), n * sizeof(float));
  }
  values.resize(n);
  return values;
}

void ResizeZeroed(std::string& bytes, size_t n) {
  if (n >= kHugePageAdviceMinBytes && bytes.empty() && HugePageAdviceEnabled()) {
    bytes.reserve(n);
    AdviseHugePages(bytes.data(), n);
  }
  bytes.resize(n);
}

}  // namespace tessera
