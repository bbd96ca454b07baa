#!/usr/bin/env bash
# Runs the collectives benchmarks recorded in docs/COLLECTIVES.md.
#   bench/collectives.sh [build-dir]     (default: build)
#   REPEAT=5 (default): repetitions of the allreduce sweep, backends interleaved within each;
#   the table at the end holds the medians. The mpirun latency check runs REPEAT times too.
set -euo pipefail
build=${1:-build}
repeat=${REPEAT:-5}
bench="$build/bench_collectives"
[ -x "$bench" ] || bench="$build/bench/bench_collectives"

echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo "== single-stream loopback TCP ceiling"
"$bench" --tcp-ceiling

# Gloo is measured raw (--no-verify): p2p checks every call through its message headers at no
# extra cost, while Gloo's call verification is an extra allreduce per call that the peer
# comparison should not charge it for. The cost of that verification is measured below.
echo "== float32 sum allreduce, 2 and 4 ranks (forked processes), p2p vs raw gloo, $repeat repetitions"
"$bench" --ranks 2,4 --backends p2p,gloo --min-bytes 4096 --max-bytes $((64 << 20)) \
  --repeat "$repeat" --no-verify

echo "== the cost of call verification on gloo (on by default): 2 ranks, 4 KiB and 1 MiB"
"$bench" --ranks 2 --backends gloo --min-bytes 4096 --max-bytes $((1 << 20)) --repeat "$repeat"

if command -v mpirun > /dev/null; then
  echo "== 4 KiB latency under mpirun (Open MPI over TCP vs p2p), 2 ranks, $repeat runs"
  for ((i = 0; i < repeat; ++i)); do
    dir=$(mktemp -d)
    mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl tcp,self \
      "$bench" --store-dir "$dir" --backends mpi,p2p --min-bytes 4096 --max-bytes 4096
    rm -rf "$dir"
  done
fi
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
