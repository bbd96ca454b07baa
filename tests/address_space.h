// Whether the test runs under a sanitizer's runtime, and a cap on the address space for a
// death test's child that must show a hostile input is refused before it is allocated.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>

namespace tessera::testing {

// Sanitizer runtimes reserve terabytes of address space up front (so no cap on it can hold)
// and bring their own malloc (whose blocks are not glibc's mappings).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerRuntime = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
inline constexpr bool kSanitizerRuntime = true;
#else
inline constexpr bool kSanitizerRuntime = false;
#endif
#else
inline constexpr bool kSanitizerRuntime = false;
#endif

// Lets this process's address space grow by at most `headroom` bytes from now on, so that an
// allocation of what a hostile file promises fails (std::bad_alloc, which kills the process)
// instead of succeeding lazily. For a death test's child only; does nothing under a sanitizer.
inline void CapAddressSpace(uint64_t headroom) {
  if (kSanitizerRuntime) return;
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) + headroom;
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::abort();
}

}  // namespace tessera::testing
