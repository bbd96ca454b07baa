// The process's open-file limit (RLIMIT_NOFILE). A daemon that holds a connection per peer
// raises its soft limit to the hard one at start: a login shell's soft limit is often 1,024
// while its hard limit is far higher, and a coordinator past its soft limit refuses every new
// connection ("Too many open files") however little else it holds. Raising the soft limit up
// to the hard one needs no privilege.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace tessera {

struct OpenFileLimit {
  uint64_t before = 0;  // the soft limit found
  uint64_t soft = 0;    // the soft limit now
  uint64_t hard = 0;    // the hard limit (kOpenFileCeiling where it is unlimited)
};

// The most a soft limit is raised to, whatever the hard limit: Linux refuses a soft limit above
// fs.nr_open (1,048,576 by default), and an unlimited hard limit is not a number to set.
inline constexpr uint64_t kOpenFileCeiling = uint64_t{1} << 20;

// Raises the soft limit to min(hard, kOpenFileCeiling), never lowering it. The limits as found
// and as left; an error naming the call where reading or setting them fails (the limit is then
// as it was).
Result<OpenFileLimit> RaiseOpenFileLimit();

// Where `limit.soft` falls below `needed` descriptors, a warning for the log that says what the
// limit holds back (`what`, e.g. "workers connected at once"), the limits, and how to raise them;
// nullopt where it suffices.
std::optional<std::string> OpenFileShortfall(const OpenFileLimit& limit, uint64_t needed, const std::string& what);

}  // namespace tessera
