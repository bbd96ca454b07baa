// Allreduce benchmark over any backend: sweeps message sizes and rank counts with ranks as
// forked processes on loopback, checks every result, and prints time, algbw and busbw with
// nccl-tests' definitions (busbw = algbw * 2(n-1)/n). Flags as in its --help; argv[0] is the
// program name. Returns a process exit code.
#pragma once

namespace tessera::collectives {

int CollectivesBenchmarkMain(int argc, char** argv);

}  // namespace tessera::collectives
