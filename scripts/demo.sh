#!/usr/bin/env bash
# The main job: a local federation trained on Fashion-MNIST, watched round by round.
#
# Installs what is missing, builds, provisions the deployment's certificates under ./var/pki
# (`tessera provision`: a CA, the coordinator's, one per worker, one for the operator), starts
# a coordinator over mutual TLS with its state under ./var, ten workers on loopback (each
# proves its name with its certificate and trains its own IID tenth of the training set on the
# CPU, or on the device DEVICE names), submits examples/fmnist-fedavg.toml, watches it to the
# end (one line per round: accuracy, loss, clients, latency by phase), prints the final test
# accuracy and a round-latency summary, and shuts everything down.
#
#   scripts/demo.sh [JOB.toml]        default: examples/fmnist-fedavg.toml (JOB.toml is taken
#                                     from the directory the demo is started in)
# The coordinator also serves its dashboard and /metrics on METRICS_PORT (https, an operator
# certificate or the admin token in ./var/admin-token); the demo prints where.
# Environment: WORKERS (default 10), PORT (default 7070), METRICS_PORT (default 9464),
# STATE_DIR (default ./var), BUILD_DIR (default build), SKIP_SETUP=1 to skip installing,
# SKIP_BUILD=1 to run the binaries already in BUILD_DIR, DEVICE (default cpu) for the workers'
# --device (cuda: the ten workers share the machine's GPU; scripts/gpu-check.sh runs it so),
# FALLBACK_DEVICE (default cpu; empty: a worker whose device cannot run fails instead),
# EVAL_DEVICE (default cpu) for the coordinator's --eval-device.
set -euo pipefail
# A job file given relative to where the demo was started, before moving to the repository.
job_file="${1:-}"
if [[ -n "$job_file" && "$job_file" != /* ]]; then job_file="$PWD/$job_file"; fi
cd "$(dirname "$0")/.."
root=$(pwd)
job_file="${job_file:-$root/examples/fmnist-fedavg.toml}"
workers="${WORKERS:-10}"
port="${PORT:-7070}"
metrics_port="${METRICS_PORT:-9464}"

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  scripts/setup.sh
fi
device="${DEVICE:-cpu}"
fallback="${FALLBACK_DEVICE-cpu}"
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  echo "== building"
  scripts/build.sh
fi
# build.sh takes BUILD_DIR relative to the repository's root, or absolute.
bin="${BUILD_DIR:-build}"
[[ "$bin" == /* ]] || bin="$root/$bin"

state="${STATE_DIR:-$root/var}"
mkdir -p "$state/logs"
pki="$state/pki"
names=()
for i in $(seq -w 1 "$workers"); do names+=("worker-$i"); done
echo "== provisioning certificates in $pki"
# Keeps the CA and every certificate already there; adds what is missing.
"$bin/cli/tessera" provision --out "$pki" --coordinator-host localhost \
  --workers "$(IFS=,; echo "${names[*]}")" --operators demo >/dev/null

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# The admin token lets a browser into the dashboard without an operator certificate.
if [[ ! -s "$state/admin-token" ]]; then
  (umask 077; od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$state/admin-token")
fi

echo "== starting the coordinator on 127.0.0.1:$port over mutual TLS (state in $state, logs in $state/logs)"
"$bin/server/tessera-coordinator" --listen "127.0.0.1:$port" --state-dir "$state" \
  --tls-dir "$pki/coordinator" --admin-token-file "$state/admin-token" \
  --metrics-listen "127.0.0.1:$metrics_port" --eval-device "${EVAL_DEVICE:-cpu}" \
  >"$state/logs/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  grep -q "listening on port" "$state/logs/coordinator.log" 2>/dev/null && break
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "the coordinator did not start:"; cat "$state/logs/coordinator.log"; exit 1
  fi
  sleep 0.1
done

grep "dashboard and metrics at" "$state/logs/coordinator.log" | sed 's/^/== /' || true
echo "   (sign in with the admin token in $state/admin-token; the certificate is from $pki/ca/ca.crt)"

echo "== starting $workers workers on device $device"
for name in "${names[@]}"; do
  # Ten workers share this machine's cores: one OpenBLAS thread each. Each joins under the
  # name its certificate carries.
  OPENBLAS_NUM_THREADS=1 "$bin/worker/tessera-worker" --coordinator "127.0.0.1:$port" \
    --tls-dir "$pki/workers/$name" --device "$device" \
    --fallback-device "$fallback" >"$state/logs/$name.log" 2>&1 &
  pids+=($!)
done
cli=("$bin/cli/tessera" --coordinator "127.0.0.1:$port" --tls-dir "$pki/operators/demo")
for _ in $(seq 100); do
  # A listing that fails (the coordinator still starting) counts as none ready yet.
  ready=$({ "${cli[@]}" workers 2>/dev/null || true; } | awk '$2 == "yes"' | wc -l)
  [[ "$ready" -ge "$workers" ]] && break
  sleep 0.1
done
"${cli[@]}" workers

# A demo stopped part-way (Ctrl-C) left its job in $state, and this coordinator resumed it:
# cancelled, so that this demo's job trains alone.
# (The listing goes through a variable: a failing `jobs` inside the loop's word list would not
# stop the script.)
listing=$("${cli[@]}" jobs)
for left in $(awk '$2 == "pending" || $2 == "running" {print $1}' <<<"$listing"); do
  echo "== cancelling $left, left running by an earlier demo"
  "${cli[@]}" cancel "$left" >/dev/null
done

echo "== submitting $job_file"
job=$("${cli[@]}" submit "$job_file")
echo "job $job"
echo "== watching $job"
# In the background, waited for: a SIGTERM to this script alone (not its process group, as
# Ctrl-C is) then ends the wait at once, and the cleanup stops the watch with the daemons.
"${cli[@]}" watch "$job" &
pids+=($!)
wait $!
