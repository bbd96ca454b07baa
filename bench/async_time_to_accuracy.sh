#!/usr/bin/env bash
# Wall-clock time to a test accuracy: synchronous rounds against asynchronous (FedBuff) steps,
# on the demo's federation (examples/fmnist-fedavg.toml: SimpleCNN, ten IID parties, two local
# epochs) with some workers slow. The slow workers train on a paced emulated device
# (tessera-worker --device emu:edge-npu --pace-real-time: its steps take the time the profile
# models); the others on the CPU. For each mode a coordinator (loopback, plaintext) and the
# workers are started afresh, the job is submitted, and the first committed round or step
# whose test accuracy reaches TARGET is reported with the time from the submission to its
# commit (its record's committed_unix_ms). Every process started here is ended here, by its pid.
#
#   nice -n 5 bench/async_time_to_accuracy.sh [BUILD_DIR]          (default: build)
#
# Environment:
#   WORKERS (10), SLOW (3)          workers in all, and how many of them are slow
#   SLOW_DEVICE (emu:edge-npu)      the slow workers' device, paced; FAST_DEVICE (cpu)
#   SLOW_NICE (none)                also start the slow workers under `nice -n SLOW_NICE`: on a
#                                   host whose cores are all busy they then get a small share
#                                   of the CPU (the emulated profiles model no chip slower than
#                                   this host's CPU for SimpleCNN: paced, edge-npu keeps pace)
#   TARGET (0.85)                   the test accuracy to reach
#   LIMIT_S (1200)                  give up on a mode after this many seconds
#   MODES ("sync async")
#   MIN_CLIENTS (WORKERS - SLOW)    sync: a round stands with this many updates at its deadline
#   DEADLINE_S (120)                sync: the round deadline; async: each task's
#   BUFFER_SIZE (5), MAX_STALENESS (4), CONCURRENCY (WORKERS)   async: the [async] options
#   KEEP=1                          keep the logs (their directory is printed)
set -euo pipefail
build_dir=${1:-build}
coordinator_bin="$build_dir/server/tessera-coordinator"
worker_bin="$build_dir/worker/tessera-worker"
cli_bin="$build_dir/cli/tessera"
for bin in "$coordinator_bin" "$worker_bin" "$cli_bin"; do
  if [ ! -x "$bin" ]; then
    echo "missing $bin: build first (BUILD_DIR=$build_dir scripts/build.sh)" >&2
    exit 2
  fi
done
workers=${WORKERS:-10}
slow=${SLOW:-3}
slow_device=${SLOW_DEVICE:-emu:edge-npu}
slow_nice=${SLOW_NICE:-}
fast_device=${FAST_DEVICE:-cpu}
target=${TARGET:-0.85}
limit_s=${LIMIT_S:-1200}
modes=${MODES:-sync async}
min_clients=${MIN_CLIENTS:-$((workers - slow))}
deadline_s=${DEADLINE_S:-120}
buffer_size=${BUFFER_SIZE:-5}
max_staleness=${MAX_STALENESS:-4}
concurrency=${CONCURRENCY:-$workers}

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-async-tta.XXXXXX")
pids=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
finish() {
  stop_all
  if [ "${KEEP:-0}" = 1 ]; then echo "logs in $work"; else rm -rf "$work"; fi
}
trap finish EXIT

# The demo's job in `mode`, with rounds enough to reach the target.
write_job() {
  local mode=$1 file=$2
  {
    echo "name = \"tta-$mode\""
    echo "strategy = \"fedavg\""
    echo "round_deadline_s = $deadline_s"
    echo "seed = 1"
    if [ "$mode" = async ]; then
      echo "mode = \"async\""
      echo "rounds = 200"
    else
      echo "rounds = 40"
      echo "clients_per_round = $workers"
      echo "min_clients = $min_clients"
    fi
    printf '[model]\nname = "simplecnn"\n[data.partition]\nkind = "iid"\nparties = %s\n' "$workers"
    printf '[train]\nlocal_epochs = 2\nbatch_size = 64\nlearning_rate = 0.01\nmomentum = 0.9\n'
    if [ "$mode" = async ]; then
      printf '[async]\nbuffer_size = %s\nmax_staleness = %s\nconcurrency = %s\n' "$buffer_size" "$max_staleness" \
        "$concurrency"
    fi
  } > "$file"
}

# Prints "ROUND SECONDS UPDATES" for the first record at or above the target, from a status
# JSON on stdin and the submission time (Unix ms) in $1; nothing when none is.
first_at_target() {
  python3 -c '
import json, sys
submitted, target = int(sys.argv[1]), float(sys.argv[2])
reply = json.load(sys.stdin)
updates = 0
for r in reply.get("rounds", []):
    updates += int(r.get("clients_reported", r.get("clientsReported", 0)))
    accuracy = float(r.get("test_accuracy", r.get("testAccuracy", 0)))
    if accuracy >= target:
        committed = int(r.get("committed_unix_ms", r.get("committedUnixMs", 0)))
        print(r.get("round"), "%.1f" % ((committed - submitted) / 1000.0), updates, "%.4f" % accuracy)
        break
' "$1" "$target"
}

results=()
for mode in $modes; do
  row=$(mktemp -d "$work/$mode.XXXXXX")
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$row/join-token"
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$row/admin-token"
  "$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$row/state" --insecure --join-token-file "$row/join-token" \
    --admin-token-file "$row/admin-token" > "$row/coordinator.log" 2>&1 &
  pids+=($!)
  port=
  for _ in $(seq 1 200); do
    port=$(sed -n 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "$row/coordinator.log")
    [ -n "$port" ] && break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "the coordinator did not start:" >&2
    cat "$row/coordinator.log" >&2
    exit 1
  fi
  cli=("$cli_bin" --coordinator "127.0.0.1:$port" --insecure --admin-token-file "$row/admin-token")
  for i in $(seq 1 "$workers"); do
    flags=(--device "$fast_device")
    wrap=()
    if [ "$i" -le "$slow" ]; then
      flags=(--device "$slow_device" --pace-real-time)
      [ -n "$slow_nice" ] && wrap=(nice -n "$slow_nice")
    fi
    OPENBLAS_NUM_THREADS=1 "${wrap[@]}" "$worker_bin" --coordinator "127.0.0.1:$port" --insecure \
      --join-token-file "$row/join-token" --name "w$i" "${flags[@]}" > "$row/w$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 1 600); do
    ready=$("${cli[@]}" workers 2>/dev/null | awk '$2 == "yes"' | wc -l)
    [ "$ready" -ge "$workers" ] && break
    sleep 0.1
  done
  write_job "$mode" "$row/job.toml"
  submitted=$(date +%s%3N)
  job=$("${cli[@]}" submit "$row/job.toml")
  found=
  while [ -z "$found" ]; do
    sleep 1
    found=$("${cli[@]}" status "$job" --json 2>/dev/null | first_at_target "$submitted" || true)
    if [ $(( ($(date +%s%3N) - submitted) / 1000 )) -ge "$limit_s" ]; then
      found="- >$limit_s - -"
    fi
  done
  "${cli[@]}" cancel "$job" > /dev/null 2>&1 || true
  results+=("$mode $found")
  echo "$mode: $found (round or step, seconds, updates folded, accuracy)" >&2
  stop_all
done

echo "workers: $workers ($slow slow on $slow_device, paced${slow_nice:+, nice -n $slow_nice}; the rest on $fast_device);" \
  "target $target; sync: min_clients $min_clients, deadline ${deadline_s} s; async: K $buffer_size," \
  "max_staleness $max_staleness, concurrency $concurrency"
printf '%-6s %10s %10s %10s %9s\n' mode "round/step" seconds updates accuracy
for line in "${results[@]}"; do
  # shellcheck disable=SC2086
  printf '%-6s %10s %10s %10s %9s\n' $line
done
