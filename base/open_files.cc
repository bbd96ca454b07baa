#include "base/open_files.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

uint64_t Finite(rlim_t value) {
  return value == RLIM_INFINITY ? kOpenFileCeiling : static_cast<uint64_t>(value);
}

}  // namespace

Result<OpenFileLimit> RaiseOpenFileLimit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return InternalError(std::string("getrlimit(RLIMIT_NOFILE) failed: ") + std::strerror(errno));
  }
  OpenFileLimit found;
  found.before = Finite(limit.rlim_cur);
  found.hard = Finite(limit.rlim_max);
  found.soft = found.before;
  const uint64_t target = std::min(found.hard, kOpenFileCeiling);
  if (target <= found.before) return found;
  limit.rlim_cur = static_cast<rlim_t>(target);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return InternalError("setrlimit(RLIMIT_NOFILE) to " + std::to_string(target) +
                         " failed: " + std::strerror(errno) + "; the soft limit stays " + std::to_string(found.before));
  }
  found.soft = target;
  return found;
}

std::optional<std::string> OpenFileShortfall(const OpenFileLimit& limit, uint64_t needed, const std::string& what) {
  if (limit.soft >= needed) return std::nullopt;
  return "the open-file limit is " + std::to_string(limit.soft) + " (hard limit " + std::to_string(limit.hard) +
         "), below the " + std::to_string(needed) + " this process is sized for: it holds back " + what +
         "; raise the hard limit (LimitNOFILE= in a systemd unit, `ulimit -Hn` in a shell, nofile in "
         "/etc/security/limits.conf)";
}

}  // namespace tessera
