// The kernel's flags for the mapping that holds an address in this process (the VmFlags line
// of /proc/self/smaps: "hg" is madvise(MADV_HUGEPAGE)'s), for tests of memory advice.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace tessera::testing {

// nullopt when /proc/self/smaps has no mapping holding `address` (or cannot be read).
inline std::optional<std::string> VmFlagsOf(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long start = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> start >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = at >= start && at < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line.substr(8) + " ";
  }
  return std::nullopt;
}

inline bool AdvisedHugePages(const void* address) {
  const auto flags = VmFlagsOf(address);
  return flags && flags->find(" hg ") != std::string::npos;
}

// Whether this kernel takes madvise(MADV_HUGEPAGE) at all (built with transparent huge pages).
inline bool KernelHasTransparentHugePages() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

}  // namespace tessera::testing
