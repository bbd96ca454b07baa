// What a benchmark reads about processes on this machine: its own CPU time (getrusage) and
// thread count, and another process's CPU time and peak resident set from /proc (the
// coordinator under test, given by pid).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "base/status.h"

namespace tessera::loadgen {

struct CpuTime {
  double user_s = 0;
  double system_s = 0;
  double total() const { return user_s + system_s; }
};

// This process's CPU time so far, every thread included.
CpuTime SelfCpuTime();
// This process's threads now (/proc/self/status Threads).
int SelfThreadCount();
// utime + stime of `pid` (/proc/PID/stat), in seconds.
Result<CpuTime> ProcessCpuTime(pid_t pid);
// Peak resident set of `pid` so far (/proc/PID/status VmHWM), in bytes.
Result<uint64_t> ProcessPeakRssBytes(pid_t pid);

}  // namespace tessera::loadgen
