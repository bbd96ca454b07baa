// Allreduce benchmark over any backend: sweeps message sizes and rank counts with ranks as
// forked processes on loopback, checks every result, and prints time, algbw and busbw with
// nccl-tests' definitions (busbw = algbw * 2(n-1)/n). Flags as in its --help; argv[0] is the
// program name. Returns a process exit code.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::collectives {

int CollectivesBenchmarkMain(int argc, char** argv);

// The benchmark's handling of its forked processes, with fork and waitpid passed in so that
// their failures can be tested.
using ForkFunction = std::function<pid_t()>;
using WaitFunction = std::function<pid_t(pid_t pid, int* status, int options)>;

// Forks `count` children; child i runs body(i), which must end the process (the child exits 1
// if it returns). When a fork fails, the children forked so far are killed and reaped and the
// error names the child and errno; no pid of a failed fork is ever returned. The children run
// on without exec, so none is forked while a host-name lookup of this process is still in
// flight (PauseHostLookups): one cut off by its deadline is waited for up to `lookup_wait`,
// after which nothing is forked and the error (FAILED_PRECONDITION) says why.
Result<std::vector<pid_t>> ForkChildren(int count, const std::function<void(int)>& body,
                                        const ForkFunction& fork_function = ::fork,
                                        std::chrono::milliseconds lookup_wait = std::chrono::seconds(10));

// Waits for every child (a wait a signal interrupts is retried) and returns one line for each
// that did not exit with 0: "rank 1 exited with 3", "rank 0 was killed by signal 9", or why
// it could not be waited for. `children[i]` is rank i.
std::vector<std::string> WaitForChildren(const std::vector<pid_t>& children,
                                         const WaitFunction& wait_function = ::waitpid);

}  // namespace tessera::collectives
