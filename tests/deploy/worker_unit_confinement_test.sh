#!/usr/bin/env bash
# Runs a worker under strace, on the CPU, from its start through a job of two rounds against a
# real coordinator (mutual TLS, certificates from `tessera provision`) to SIGTERM, serving its
# metrics port, and checks that it makes no call the confinement of
# deploy/systemd/tessera-worker@.service refuses, where systemd would kill it (SIGSYS) or it
# would fail: its system calls, socket families, memory mappings and /proc paths
# (unit_confinement_lib.sh says how each is read). Then checks that the unit still lets a worker
# reach a GPU or an FPGA: the calls their drivers make are allowed and /dev is not hidden.
# Those are read from the unit, not traced: no GPU or FPGA runs here.
#   worker_unit_confinement_test.sh COORDINATOR_BIN WORKER_BIN CLI_BIN UNIT_FILE
# Exit 77 (skipped) where strace or systemd-analyze is absent, strace cannot trace here, or
# Fashion-MNIST (which the coordinator evaluates on) is not installed.
set -euo pipefail
coordinator_bin=$1
worker_bin=$2
cli_bin=$3
unit=$4
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=tests/deploy/unit_confinement_lib.sh
source "$(dirname "$0")/unit_confinement_lib.sh"
confinement_preconditions
[[ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]] ||
  skip "the coordinator evaluates on Fashion-MNIST's test set (Debian's dataset-fashion-mnist), not installed"

# The calls GPU and FPGA drivers make that a worker on the CPU may not: CUDA and XRT drive
# their device nodes (/dev/nvidia*, /dev/dri/renderD*, /dev/xclmgmt*) with ioctl() and map
# their memory and registers with mmap(), grow and pin it (mremap, madvise, mlock), place it
# on NUMA nodes (mbind, set_mempolicy, get_mempolicy) and pin their threads
# (sched_setaffinity). The unit must keep all of them.
driver_calls=(ioctl mmap munmap mremap madvise mlock munlock mbind set_mempolicy get_mempolicy
  sched_setaffinity sched_getaffinity)

unit_allowed_calls "$unit"
missing=()
for call in "${driver_calls[@]}"; do [[ -n ${allowed[$call]:-} ]] || missing+=("$call"); done
((${#missing[@]} == 0)) || fail "$(basename "$unit") refuses calls GPU and FPGA drivers make: ${missing[*]}"
if grep -Eq '^PrivateDevices=(yes|true|1)' "$unit"; then fail "$(basename "$unit") hides /dev (PrivateDevices=): no GPU or FPGA could be opened"; fi
if grep -Eq '^DevicePolicy=(closed|strict)' "$unit"; then fail "$(basename "$unit") closes the device policy: GPU and FPGA nodes would be refused"; fi
grep -q '^SupplementaryGroups=.*@TESSERA_ACCELERATOR_GROUPS@' "$unit" ||
  fail "$(basename "$unit") no longer joins the accelerator groups (video, render) that open GPU and FPGA nodes"

dir=$(mktemp -d)
coordinator_pid=
worker_pid=
cleanup() {
  if [[ -n $worker_pid ]]; then
    # strace's child, the worker itself, first: strace does not pass on a SIGTERM of its own.
    pkill_worker 2>/dev/null || kill -KILL "$worker_pid" 2>/dev/null || true
    wait "$worker_pid" 2>/dev/null || true
  fi
  if [[ -n $coordinator_pid ]]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
# pkill_worker: sends SIGTERM to the worker that strace (worker_pid) started.
pkill_worker() {
  local child
  child=$(cat /proc/"$worker_pid"/task/*/children 2>/dev/null | tr -s ' ' '\n' | head -n 1)
  [[ -n $child ]] || return 1
  kill -TERM "$child"
}
# wait_for_line LOG PID SED_EXPRESSION WHAT: prints the first line's capture.
wait_for_line() {
  local found
  for _ in $(seq 600); do
    found=$(sed -n "$3" "$1" | head -n 1)
    if [[ -n $found ]]; then echo "$found"; return; fi
    kill -0 "$2" 2>/dev/null || { cat "$1" >&2; fail "$(basename "$1" .log) exited before printing $4"; }
    sleep 0.1
  done
  cat "$1" >&2
  fail "$(basename "$1" .log) did not print $4 within 60 s"
}

"$cli_bin" provision --out "$dir/pki" --coordinator-host 127.0.0.1 --workers w1 --operators ops >"$dir/provision.log" 2>&1 ||
  { cat "$dir/provision.log"; fail "tessera provision"; }
# As the unit runs it: not as root, and with OpenBLAS's threads as they come.
run_as=()
if [[ $(id -u) -eq 0 ]]; then
  run_as=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
  # Copies where that user cannot reach the build (under /root, say); the worker's backend
  # modules are not needed on the CPU.
  mkdir "$dir/bin"
  for bin_var in coordinator_bin worker_bin; do
    if ! "${run_as[@]}" test -x "${!bin_var}"; then
      cp "${!bin_var}" "$dir/bin/"
      printf -v "$bin_var" '%s' "$dir/bin/$(basename "${!bin_var}")"
    fi
  done
  chown -R 65534:65534 "$dir"
fi
unset OPENBLAS_NUM_THREADS
"${run_as[@]}" "$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$dir/state" --tls-dir "$dir/pki/coordinator" \
  >"$dir/coordinator.log" 2>&1 &
coordinator_pid=$!
port=$(wait_for_line "$dir/coordinator.log" "$coordinator_pid" 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "its port")

"${run_as[@]}" strace -f -qq -o "$dir/trace" "$worker_bin" --coordinator "127.0.0.1:$port" --name w1 \
  --tls-dir "$dir/pki/workers/w1" --device cpu --metrics-listen 127.0.0.1:0 >"$dir/worker.log" 2>&1 &
worker_pid=$!
wait_for_line "$dir/worker.log" "$worker_pid" 's/^\(metrics at\) .*/\1/p' "its metrics address" >/dev/null

operator=(--coordinator "127.0.0.1:$port" --tls-dir "$dir/pki/operators/ops")
joined=
for _ in $(seq 600); do
  if "$cli_bin" "${operator[@]}" workers 2>/dev/null | grep -qw w1; then joined=1; break; fi
  kill -0 "$worker_pid" 2>/dev/null || { cat "$dir/worker.log"; fail "the worker exited before it joined"; }
  sleep 0.1
done
[[ -n $joined ]] || { cat "$dir/worker.log"; fail "the worker did not join within 60 s"; }

cat >"$dir/job.toml" <<'TOML'
name = "worker-confinement"
rounds = 2
round_deadline_s = 120
seed = 3

[model]
name = "mlp"
hidden = [16]

[data]
max_train_samples = 500
max_test_samples = 200

[data.partition]
kind = "iid"
parties = 1

[train]
local_epochs = 1
batch_size = 32
learning_rate = 0.05
TOML
job=$("$cli_bin" "${operator[@]}" submit "$dir/job.toml" 2>"$dir/submit.log") || { cat "$dir/submit.log"; fail "tessera submit"; }
# watch ends when the job does; its own bound keeps a stuck round from holding the test.
timeout 240 "$cli_bin" "${operator[@]}" watch "$job" >"$dir/watch.log" 2>&1 ||
  { cat "$dir/watch.log" "$dir/worker.log"; fail "tessera watch $job failed or timed out"; }
status=$("$cli_bin" "${operator[@]}" status "$job") || fail "tessera status $job"
grep -qi succeeded <<<"$status" || { echo "$status"; cat "$dir/worker.log"; fail "job $job did not succeed"; }

pkill_worker || fail "the worker strace started is not running"
rc=0
wait "$worker_pid" || rc=$?
worker_pid=
[[ $rc -eq 0 ]] || { cat "$dir/worker.log"; fail "the worker exited $rc on SIGTERM"; }

check_trace "$dir/trace" "$unit" "the worker"
echo "the worker, through a job of two rounds on the CPU under strace, made $(traced_calls "$dir/trace" | wc -l) kinds of call, all allowed by $(basename "$unit")"
