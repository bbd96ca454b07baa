#!/usr/bin/env bash
# Time to a target test accuracy with slow devices in the federation: random selection against
# deadline-aware selection with over-selection ([selection] in docs/jobs/algorithms.md), in one
# sitting.
#
# For each policy a fresh coordinator (plaintext on loopback, its state in a temporary
# directory) and WORKERS tessera-worker processes, SLOW of them on a paced emulated device
# (--device SLOW_DEVICE --pace-real-time: their rounds take the time the device's profile
# models), the rest on the CPU. The job is the demo's (examples/fmnist-fedavg.toml: SimpleCNN,
# IID tenths of Fashion-MNIST, two local epochs) with clients_per_round of the WORKERS parties
# per round and ROUNDS rounds; the policies differ only in their [selection] table. Printed per
# policy: the wall-clock seconds from the job's submission to the first committed round at or
# above TARGET test accuracy, that round, the final accuracy, the median round time, and how
# many updates of slow workers were accepted and cancelled as over-selected.
#
#   bench/selection_deadline.sh [BUILD_DIR]          (default: build)
#
# Environment:
#   WORKERS (default 10), SLOW (default 3), SLOW_DEVICE (default emu:bench/slow-edge.toml, a
#     1 GFLOP/s processor; the built-in profiles, emu:edge-npu included, train the demo's
#     SimpleCNN about as fast as this machine's CPU)
#   CLIENTS_PER_ROUND (default 5), ROUNDS (default 10), TARGET (default 0.85)
#   DEADLINE_S (default 300): each round's deadline
#   POLICIES (default random,deadline,deadline:0): "NAME" or "NAME:OVER_SELECTION",
#     comma-separated (deadline:0 ranks by speed without over-selecting)
#   KEEP=1 keeps the logs (their directory is printed)
set -euo pipefail
build_dir=${1:-build}
coordinator_bin="$build_dir/server/tessera-coordinator"
worker_bin="$build_dir/worker/tessera-worker"
cli_bin="$build_dir/cli/tessera"
for bin in "$coordinator_bin" "$worker_bin" "$cli_bin"; do
  [ -x "$bin" ] || { echo "missing $bin: build first (scripts/build.sh)" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)
workers=${WORKERS:-10}
slow=${SLOW:-3}
slow_device=${SLOW_DEVICE:-emu:$here/slow-edge.toml}
clients_per_round=${CLIENTS_PER_ROUND:-5}
rounds=${ROUNDS:-10}
target=${TARGET:-0.85}
deadline_s=${DEADLINE_S:-300}
policies=${POLICIES:-random,deadline,deadline:0}

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-selection-deadline.XXXXXX")
coordinator_pid=
worker_pids=()
stop_all() {
  local pid
  for pid in "${worker_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${worker_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  worker_pids=()
  if [ -n "$coordinator_pid" ]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
    coordinator_pid=
  fi
}
cleanup() {
  stop_all
  if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
# Ten workers share this machine's cores: one OpenBLAS thread each.
export OPENBLAS_NUM_THREADS=1

echo "== selection with $slow of $workers workers on a paced $slow_device: $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%Y-%m-%dT%H:%MZ)"
echo "== demo job, $clients_per_round clients per round, $rounds rounds, deadline ${deadline_s} s; target $target"
printf '%-22s %12s %7s %9s %12s %14s %16s\n' POLICY "TO_TARGET_S" ROUND "FINAL" "MEDIAN_ROUND" "SLOW_ACCEPTED" "OVER_SELECTED"

for entry in ${policies//,/ }; do
  policy=${entry%%:*}
  over=
  [ "$entry" != "$policy" ] && over=${entry#*:}
  dir="$work/$entry"
  mkdir -p "$dir"
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/join-token"
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/admin-token"
  "$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$dir/state" --join-token-file "$dir/join-token" --insecure \
    --admin-token-file "$dir/admin-token" > "$dir/coordinator.log" 2>&1 &
  coordinator_pid=$!
  port=
  for _ in $(seq 1 200); do
    port=$(sed -n 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "$dir/coordinator.log")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "the coordinator did not start:" >&2; cat "$dir/coordinator.log" >&2; exit 1; }
  cli=("$cli_bin" --coordinator "127.0.0.1:$port" --insecure --admin-token-file "$dir/admin-token")
  for n in $(seq 1 "$workers"); do
    i=$(printf '%02d' "$n")
    device=(--device cpu)
    [ "$n" -le "$slow" ] && device=(--device "$slow_device" --pace-real-time)
    "$worker_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/join-token" --insecure \
      --name "worker-$i" "${device[@]}" > "$dir/worker-$i.log" 2>&1 &
    worker_pids+=($!)
  done
  for _ in $(seq 1 300); do
    ready=$("${cli[@]}" workers 2>/dev/null | awk '$2 == "yes"' | wc -l)
    [ "$ready" -ge "$workers" ] && break
    sleep 0.2
  done
  # The demo's job with this row's participation and selection.
  sed -e "s/^rounds = .*/rounds = $rounds/" -e "s/^clients_per_round = .*/clients_per_round = $clients_per_round/" \
    -e "s/^min_clients = .*/min_clients = $clients_per_round/" -e "s/^round_deadline_s = .*/round_deadline_s = $deadline_s/" \
    "$here/../examples/fmnist-fedavg.toml" > "$dir/job.toml"
  { echo; echo "[selection]"; echo "policy = \"$policy\""; [ -n "$over" ] && echo "over_selection = $over"; } >> "$dir/job.toml"
  job=$("${cli[@]}" submit "$dir/job.toml")
  "${cli[@]}" watch "$job" > "$dir/watch.txt" 2>&1 || true
  "${cli[@]}" rounds "$job" > "$dir/rounds.txt" 2>&1 || true
  "${cli[@]}" rounds "$job" --json > "$dir/rounds.json"
  "${cli[@]}" jobs --json > "$dir/jobs.json"
  stop_all
  python3 - "$dir" "$job" "$target" "$slow" "$entry" <<'EOF'
import json, statistics, sys
d, job, target, slow, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
created = None
for line in open(d + "/jobs.json"):
    reply = json.loads(line)
    for j in reply.get("jobs", [reply]):
        if j.get("id") == job:
            created = int(j.get("created_unix_ms", 0))
rounds = [json.loads(line) for line in open(d + "/rounds.json") if line.strip()]
slow_names = {"worker-%02d" % i for i in range(1, slow + 1)}
reached, reached_round = None, "-"
accepted = over = 0
for r in rounds:
    if reached is None and r.get("test_accuracy", 0) >= target:
        reached = (int(r["committed_unix_ms"]) - created) / 1000.0
        reached_round = r["round"]
    for w in r.get("workers", []):
        if w["worker_id"] in slow_names:
            accepted += w.get("outcome", "").startswith("accepted")
            over += w.get("outcome", "").startswith("dropped: over-selected")
final = rounds[-1].get("test_accuracy", 0) if rounds else 0
median = statistics.median(r["latency"]["total_ms"] for r in rounds) / 1000.0 if rounds else 0
print("%-22s %12s %7s %9.4f %11.1fs %14d %16d" % (name, "%.1f" % reached if reached is not None else "not reached",
      reached_round, final, median, accepted, over))
EOF
done
echo "== load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
