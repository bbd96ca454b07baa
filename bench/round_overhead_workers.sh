#!/usr/bin/env bash
# Round overhead with real workers: the rows of bench/round_overhead.sh, with N tessera-worker
# processes in place of the simulated clients. Each worker holds one training image (its own
# IDX files, a local-files job), trains one epoch of batch 1 on it and uploads its delta, so
# that local compute is as close to nothing as a job spec allows; the rest of the round is
# the same protocol and the same coordinator. The tessera-loadgen process only submits the
# job and reads its round records (--clients 0).
#
#   bench/round_overhead_workers.sh [BUILD_DIR]          (default: build)
#
# Environment:
#   ROWS    model:N pairs as in round_overhead.sh (default: tiny:10,tiny:50,mlp10:10)
#   ROUNDS  rounds per row (default 7); the first WARMUP (default 2) are left out of the medians
#           (round 1 includes the workers' start)
#   MAX_TEST_SAMPLES  test images the coordinator evaluates on after each round (default 100)
#   COORDINATOR_FLAGS  added to every coordinator's command line (default none: its defaults,
#           heartbeats every 5 s, a worker silent for 15 s dropped from its round)
#   WORKER_FLAGS  added to every worker's command line (e.g. --keep-round-memory)
#   FLOOR_REPEAT  transfers the floor is the median of (default 9)
#   KEEP=1  keep the logs (their directory is printed)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/round_overhead_common.sh
. "$here/round_overhead_common.sh"
overhead_binaries "${1:-build}"
if [ ! -x "$worker_bin" ]; then
  echo "missing $worker_bin: build first" >&2
  exit 2
fi

rows=${ROWS:-tiny:10,tiny:50,mlp10:10}
rounds=${ROUNDS:-7}
warmup=${WARMUP:-2}
max_test=${MAX_TEST_SAMPLES:-100}
fmnist=/usr/share/datasets/fashion-mnist

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-round-overhead-workers.XXXXXX")
coordinator_pid=
worker_pids=()
stop_workers() {
  local pid
  for pid in "${worker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${worker_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  worker_pids=()
}
# Prints "FAULTS CPU_MS": the page faults and CPU time of the workers still running, summed
# (from /proc/PID/stat: minflt, utime + stime).
worker_totals() {
  local pid faults=0 ticks=0 f
  for pid in "${worker_pids[@]}"; do
    read -r -a f < "/proc/$pid/stat" 2>/dev/null || continue
    faults=$((faults + f[9]))
    ticks=$((ticks + f[13] + f[14]))
  done
  echo "$faults $((ticks * 1000 / $(getconf CLK_TCK)))"
}
cleanup() {
  stop_workers
  if [ -n "$coordinator_pid" ]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
# One core's worth of threads per worker: N workers already share two cores.
export OPENBLAS_NUM_THREADS=1

# The workers' own data: the first Fashion-MNIST training image and its label, as IDX files.
data_dir="$work/one-image"
mkdir -p "$data_dir"
# (head closes the pipe early: gzip's SIGPIPE is expected, so no pipefail here.)
( set +o pipefail
  { printf '\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00\x1c\x00\x00\x00\x1c'
    gzip -dc "$fmnist/train-images-idx3-ubyte.gz" | tail -c +17 | head -c 784; } > "$data_dir/train-images-idx3-ubyte"
  { printf '\x00\x00\x08\x01\x00\x00\x00\x01'
    gzip -dc "$fmnist/train-labels-idx1-ubyte.gz" | tail -c +9 | head -c 1; } > "$data_dir/train-labels-idx1-ubyte" )
[ "$(stat -c %s "$data_dir/train-images-idx3-ubyte")" = 800 ] || { echo "cannot read $fmnist" >&2; exit 2; }

echo "== round overhead with real workers: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "== $rounds rounds per row, medians of rounds $((warmup + 1))-$rounds; one training image per worker," \
  "1 epoch, batch 1; evaluation on $max_test test images"
print_header
status=0
for row in ${rows//,/ }; do
  model=${row%%:*}
  n=${row##*:}
  flags=$(model_flags "$model")
  bytes=$(( 2 * n * $(model_parameters "$model") * 4 ))
  start_coordinator
  for i in $(seq 0 $((n - 1))); do
    # shellcheck disable=SC2086
    "$worker_bin" --coordinator "127.0.0.1:$coordinator_port" --join-token-file "$token_file" --insecure --name "worker-$i" \
      --data-dir "$data_dir" --log-level warn ${WORKER_FLAGS:-} > "$row_dir/worker-$i.log" 2>&1 &
    worker_pids+=($!)
  done
  log="$row_dir/loadgen.log"
  # shellcheck disable=SC2086
  if ! "$loadgen_bin" --coordinator "127.0.0.1:$coordinator_port" --clients 0 --admin-token-file "$admin_file" --job-clients "$n" $flags \
      --partition local-files --local-epochs 1 --batch-size 1 --rounds "$rounds" --warmup "$warmup" \
      --max-test-samples "$max_test" --coordinator-pid "$coordinator_pid" --timeout-s 400 > "$log" 2>&1; then
    status=1
  fi
  read -r faults cpu_ms < <(worker_totals)
  stop_workers
  stop_coordinator
  measure_floor "$bytes"
  print_row "$log" "$model" "$n"
  echo "   the $n workers together: $((faults / rounds)) page faults and $((cpu_ms / rounds)) ms of CPU per round" \
    "(over the whole job, their start included)"
  cp "$log" "$work/loadgen-workers-$model-$n.log"
  grep '^FAILED' "$log" || true
done
echo "== columns as in bench/round_overhead.sh; compute is the median worker's local training"
echo "   as it reported it; coord_cpu% is the coordinator's; gen_cpu% is the job-following"
echo "   process only (the workers' CPU is on the line under each row)."
echo "== load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
