#!/usr/bin/env bash
# Runs the coordinator under strace, serving TLS and its metrics port from start to SIGTERM, and
# checks that it makes no call the confinement of deploy/systemd/tessera-coordinator.service
# refuses, where systemd would kill it (SIGSYS) or it would fail: its system calls, socket
# families, memory mappings and /proc paths (unit_confinement_lib.sh says how each is read).
#   unit_confinement_test.sh COORDINATOR_BIN CLI_BIN UNIT_FILE
# Exit 77 (skipped) where strace or systemd-analyze is absent, or strace cannot trace here.
set -euo pipefail
coordinator_bin=$1
cli_bin=$2
unit=$3
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=tests/deploy/unit_confinement_lib.sh
source "$(dirname "$0")/unit_confinement_lib.sh"
confinement_preconditions

dir=$(mktemp -d)
pid=
# The coordinator is stopped by its own PID (its lock file holds it): strace does not pass on
# a SIGTERM of its own.
stop_coordinator() {
  local coordinator_pid
  coordinator_pid=$(tr -dc 0-9 <"$dir/state/coordinator.lock" 2>/dev/null || true)
  [[ -n $coordinator_pid ]] || return 1
  kill -TERM "$coordinator_pid"
}
cleanup() {
  if [[ -n $pid ]]; then
    stop_coordinator 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

unit_allowed_calls "$unit"

"$cli_bin" provision --out "$dir/pki" --coordinator-host 127.0.0.1 --workers w1 --operators ops >"$dir/provision.log" 2>&1 ||
  { cat "$dir/provision.log"; fail "tessera provision"; }
# As the unit runs it: not as root (SQLite, for one, hands its files to the database's owner
# only when it runs as root), and with OpenBLAS's threads as they come.
run_as=()
if [[ $(id -u) -eq 0 ]]; then
  run_as=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
  # A copy where that user cannot reach the build (under /root, say).
  if ! "${run_as[@]}" test -x "$coordinator_bin"; then
    mkdir "$dir/bin"
    cp "$coordinator_bin" "$dir/bin/"
    coordinator_bin="$dir/bin/$(basename "$coordinator_bin")"
  fi
  chown -R 65534:65534 "$dir"
fi
unset OPENBLAS_NUM_THREADS
"${run_as[@]}" strace -f -qq -o "$dir/trace" "$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$dir/state" \
  --tls-dir "$dir/pki/coordinator" --metrics-listen 127.0.0.1:0 >"$dir/coordinator.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q '^dashboard and metrics at' "$dir/coordinator.log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/coordinator.log"; fail "the coordinator exited at start"; }
  sleep 0.1
done
grep -q '^dashboard and metrics at' "$dir/coordinator.log" || { cat "$dir/coordinator.log"; fail "the coordinator did not start"; }
stop_coordinator || fail "no PID in $dir/state/coordinator.lock"
rc=0
wait "$pid" || rc=$?
pid=
[[ $rc -eq 0 ]] || { cat "$dir/coordinator.log"; fail "the coordinator exited $rc on SIGTERM"; }

check_trace "$dir/trace" "$unit" "the coordinator"
echo "the coordinator, started and stopped under strace, made $(traced_calls "$dir/trace" | wc -l) kinds of call, all allowed by $(basename "$unit")"
