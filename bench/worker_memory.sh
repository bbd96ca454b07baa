#!/usr/bin/env bash
# What one CPU worker holds in memory, idle and after a round of training.
#   bench/worker_memory.sh [BUILD_DIR]     (default: build; its server/, worker/, cli/)
# Starts a coordinator and one tessera-worker (--device cpu, one OpenBLAS thread) on loopback.
# Once the worker has joined and sits idle: its VmRSS and how many of its mappings name a
# CUDA, cuBLAS or NCCL library. Then one round of the demo job as this worker's share
# (examples/fmnist-fedavg.toml with one client per round: a tenth of Fashion-MNIST, SimpleCNN,
# two local epochs) and its VmRSS and VmHWM after it, and once more when the worker has
# released the ended job's data. Environment: PORT (default 7391), MODEL
# (simplecnn, the default, or mlp10: the round overhead benchmark's 10 MiB MLP, 784-3297-10),
# WORKER_FLAGS (added to the worker's command line, e.g. --keep-round-memory), IDLE_AFTER_S
# (default 0: when set, the worker's VmRSS once more after that many seconds without a task).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
port="${PORT:-7391}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

figure() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }  # kB
cuda_mappings() { grep -c -E 'cublas|cudart|libcuda\.|nccl' "/proc/$1/maps" || true; }
module_mappings() { grep -c -E 'libgloo|libibverbs|libxrt|libmpi|libopen-pal' "/proc/$1/maps" || true; }

# Plaintext on loopback, with an admin token for the command line: the worker's memory is
# the figure here, not TLS's.
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin-token"
echo memory-bench-token >"$work/join-token"
"$build/server/tessera-coordinator" --listen "127.0.0.1:$port" --state-dir "$work/state" --insecure \
  --join-token-file "$work/join-token" --admin-token-file "$work/admin-token" >"$work/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on port" "$work/coordinator.log" 2>/dev/null && break; sleep 0.1; done
# shellcheck disable=SC2086
OPENBLAS_NUM_THREADS=1 "$build/worker/tessera-worker" --coordinator "127.0.0.1:$port" --insecure \
  --join-token-file "$work/join-token" --name memory-bench --device cpu ${WORKER_FLAGS:-} >"$work/worker.log" 2>&1 &
worker=$!
pids+=($worker)
cli=("$build/cli/tessera" --coordinator "127.0.0.1:$port" --insecure --admin-token-file "$work/admin-token")
for _ in $(seq 300); do
  [ "$("${cli[@]}" workers 2>/dev/null | awk '$2 == "yes"' | wc -l)" -ge 1 ] && break
  sleep 0.1
done
sleep 2  # idle: joined, heartbeating, no task
echo "idle worker (joined): VmRSS $(figure $worker VmRSS) kB, VmHWM $(figure $worker VmHWM) kB," \
     "$(cuda_mappings $worker) CUDA/cuBLAS/NCCL mappings, $(module_mappings $worker) Gloo/ibverbs/XRT/MPI mappings"

model="${MODEL:-simplecnn}"
case "$model" in
  simplecnn) model_line='name = "simplecnn"' ;;
  mlp10) model_line='name = "mlp"\nhidden = [3297]' ;;
  *) echo "worker_memory.sh: MODEL must be simplecnn or mlp10, got '$model'" >&2; exit 2 ;;
esac
sed -e 's/^rounds = .*/rounds = 1/' -e 's/^clients_per_round = .*/clients_per_round = 1/' \
    -e 's/^min_clients = .*/min_clients = 1/' -e "s/^name = \"simplecnn\"/$model_line/" \
    examples/fmnist-fedavg.toml >"$work/job.toml"
job="$("${cli[@]}" submit "$work/job.toml")"
"${cli[@]}" watch "$job" >"$work/watch.log" 2>&1 || { cat "$work/watch.log"; exit 1; }
echo "after one round (a tenth of Fashion-MNIST, $model, 2 epochs): VmRSS $(figure $worker VmRSS) kB," \
     "VmHWM $(figure $worker VmHWM) kB, $(cuda_mappings $worker) CUDA/cuBLAS/NCCL mappings," \
     "$(module_mappings $worker) Gloo/ibverbs/XRT/MPI mappings"
grep -v "reported, waiting" "$work/watch.log" | sed -n "1,3p"
# The coordinator tells the worker the job ended; the worker then releases what it held for it.
for _ in $(seq 100); do grep -q "ended: the data" "$work/worker.log" && break; sleep 0.1; done
if grep -q "ended: the data" "$work/worker.log"; then
  echo "after the job ended (the worker released its data): VmRSS $(figure $worker VmRSS) kB"
else
  echo "the worker did not say it released the ended job's data (an older worker)"
fi
if [ "${IDLE_AFTER_S:-0}" -gt 0 ]; then
  sleep "$IDLE_AFTER_S"
  echo "after ${IDLE_AFTER_S} s idle: VmRSS $(figure $worker VmRSS) kB"
fi
