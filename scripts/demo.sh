#!/usr/bin/env bash
# The main job: a local federation trained on Fashion-MNIST, watched round by round.
#
# Installs what is missing, builds, starts a coordinator with its state under ./var, ten
# workers on loopback (each trains its own IID tenth of the training set on the CPU), submits
# examples/fmnist-fedavg.toml, watches it to the end (one line per round: accuracy, loss,
# clients, latency by phase), prints the final test accuracy and a round-latency summary, and
# shuts everything down.
#
#   scripts/demo.sh [JOB.toml]        default: examples/fmnist-fedavg.toml
# Environment: WORKERS (default 10), PORT (default 7070), STATE_DIR (default ./var),
# BUILD_DIR (default build), SKIP_SETUP=1 to skip installing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
job_file="${1:-examples/fmnist-fedavg.toml}"
workers="${WORKERS:-10}"
port="${PORT:-7070}"

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  scripts/setup.sh
fi
echo "== building"
scripts/build.sh
bin="$root/${BUILD_DIR:-build}"

state="${STATE_DIR:-$root/var}"
mkdir -p "$state/logs"
token_file="$state/join-token"
[[ -s "$token_file" ]] || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token_file"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

echo "== starting the coordinator on 127.0.0.1:$port (state in $state, logs in $state/logs)"
"$bin/server/tessera-coordinator" --listen "127.0.0.1:$port" --state-dir "$state" \
  --join-token-file "$token_file" >"$state/logs/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  grep -q "listening on port" "$state/logs/coordinator.log" 2>/dev/null && break
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "the coordinator did not start:"; cat "$state/logs/coordinator.log"; exit 1
  fi
  sleep 0.1
done

echo "== starting $workers workers"
for i in $(seq -w 1 "$workers"); do
  # Ten workers share this machine's cores: one OpenBLAS thread each.
  OPENBLAS_NUM_THREADS=1 "$bin/worker/tessera-worker" --coordinator "127.0.0.1:$port" \
    --join-token-file "$token_file" --name "worker-$i" >"$state/logs/worker-$i.log" 2>&1 &
  pids+=($!)
done
cli=("$bin/cli/tessera" --coordinator "127.0.0.1:$port")
for _ in $(seq 100); do
  ready=$("${cli[@]}" workers 2>/dev/null | awk '$2 == "yes"' | wc -l)
  [[ "$ready" -ge "$workers" ]] && break
  sleep 0.1
done
"${cli[@]}" workers

echo "== submitting $job_file"
job=$("${cli[@]}" submit "$job_file")
echo "job $job"
echo "== watching $job"
"${cli[@]}" watch "$job"
