#include "bench/loadgen/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace tessera::loadgen {
namespace {

// The value of `key:` in a /proc status file, as its first number.
Result<uint64_t> StatusField(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot read it (is the process gone?)");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t value = 0;
    if (fields >> value) return value;
    return DataLossError(path + ": field " + key + ": expected a number, got '" + line + "'");
  }
  return NotFoundError(path + ": no field " + key);
}

}  // namespace

CpuTime SelfCpuTime() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  CpuTime t;
  t.user_s = static_cast<double>(usage.ru_utime.tv_sec) + usage.ru_utime.tv_usec / 1e6;
  t.system_s = static_cast<double>(usage.ru_stime.tv_sec) + usage.ru_stime.tv_usec / 1e6;
  return t;
}

int SelfThreadCount() {
  auto threads = StatusField("/proc/self/status", "Threads");
  return threads.ok() ? static_cast<int>(*threads) : -1;
}

Result<CpuTime> ProcessCpuTime(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return NotFoundError(path + ": cannot read it (is the process gone?)");
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return DataLossError(path + ": expected '(comm)' in '" + text + "'");
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  // After the name: state (3), ppid, pgrp, session, tty_nr, tpgid, flags, minflt, cminflt,
  // majflt, cmajflt, utime (14), stime (15).
  for (int i = 3; i < 14 && fields >> field; ++i) {
  }
  uint64_t utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return DataLossError(path + ": expected utime and stime in fields 14 and 15");
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return CpuTime{static_cast<double>(utime) / ticks, static_cast<double>(stime) / ticks};
}

Result<uint64_t> ProcessPeakRssBytes(pid_t pid) {
  ASSIGN_OR_RETURN(uint64_t kib, StatusField("/proc/" + std::to_string(pid) + "/status", "VmHWM"));
  return kib * 1024;
}

}  // namespace tessera::loadgen
