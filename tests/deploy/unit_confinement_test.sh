#!/usr/bin/env bash
# Runs the coordinator under strace, serving TLS and its metrics port from start to SIGTERM, and
# checks that it makes no call the confinement of deploy/systemd/tessera-coordinator.service
# refuses, where systemd would kill it (SIGSYS) or it would fail:
#   - every system call is in the unit's SystemCallFilter= set (its lines applied in order, as
#     systemd does: an allow list, with @default always in it, then removals and additions);
#   - every socket() is of a family RestrictAddressFamilies= allows;
#   - under MemoryDenyWriteExecute=yes, no mprotect() adds PROT_EXEC and no mmap() asks for
#     PROT_WRITE|PROT_EXEC.
#   unit_confinement_test.sh COORDINATOR_BIN CLI_BIN UNIT_FILE
# Exit 77 (skipped) where strace or systemd-analyze is absent, or strace cannot trace here.
set -euo pipefail
coordinator_bin=$1
cli_bin=$2
unit=$3
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v strace >/dev/null || skip "no strace (scripts/setup.sh installs it)"
command -v systemd-analyze >/dev/null || skip "no systemd-analyze (Debian's systemd package)"
strace -f -qq -o /dev/null true 2>/dev/null || skip "strace cannot trace processes here"

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

# expand NAME...: the system calls each name stands for, a @group expanded to its members.
expand() {
  local name member
  for name in "$@"; do
    if [[ $name == @* ]]; then
      # One member per indented line; nested groups are named, not expanded, so expand them here.
      for member in $(systemd-analyze syscall-filter "$name" </dev/null 2>/dev/null | awk '/^ +@?[a-z0-9_-]+$/ { print $1 }'); do
        expand "$member"
      done
    else
      echo "$name"
    fi
  done
}

declare -A allowed=()
mapfile -t filters < <(sed -n 's/^SystemCallFilter=//p' "$unit")
((${#filters[@]})) || fail "$unit has no SystemCallFilter= line"
[[ ${filters[0]:0:1} != "~" ]] || fail "$unit's first SystemCallFilter= is a deny list; this test reads allow lists only"
for call in $(expand @default); do allowed[$call]=1; done
for line in "${filters[@]}"; do
  if [[ $line == "~"* ]]; then
    # shellcheck disable=SC2086
    for call in $(expand ${line#"~"}); do unset "allowed[$call]"; done
  else
    # shellcheck disable=SC2086
    for call in $(expand $line); do allowed[$call]=1; done
  fi
done
((${#allowed[@]} > 100)) || fail "the filter of $unit expanded to ${#allowed[@]} calls: systemd-analyze syscall-filter gave too little"

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

failures=()
# Each call's name, from lines such as `1234 mbind(0x7f.., 134217728, MPOL_PREFERRED, NULL, 0, 0) = 0`.
for call in $(sed -nE 's/^[0-9]+ +([a-z0-9_]+)\(.*/\1/p' "$dir/trace" | sort -u); do
  [[ -n ${allowed[$call]:-} ]] || failures+=("system call $call: not in the unit's SystemCallFilter=")
done
families=$(sed -n 's/^RestrictAddressFamilies=//p' "$unit")
for family in $(sed -nE 's/^[0-9]+ +socket\((AF_[A-Z0-9]+),.*/\1/p' "$dir/trace" | sort -u); do
  if [[ -n $families ]] && ! grep -qw "$family" <<<"$families"; then
    failures+=("socket family $family: not in the unit's RestrictAddressFamilies=")
  fi
done
if grep -q '^MemoryDenyWriteExecute=yes' "$unit"; then
  while IFS= read -r line; do failures+=("under MemoryDenyWriteExecute=yes: $line"); done < <(
    grep -E '^[0-9]+ +(mprotect|pkey_mprotect)\([^)]*PROT_EXEC|^[0-9]+ +mmap\([^)]*(PROT_WRITE\|PROT_EXEC|PROT_EXEC\|PROT_WRITE)' "$dir/trace" |
      sed -E 's/^[0-9]+ +//' | cut -c1-120 | sort -u)
fi
if ((${#failures[@]})); then
  printf '  %s\n' "${failures[@]}" >&2
  fail "the coordinator does what $(basename "$unit") forbids: systemd would stop or kill it"
fi
echo "the coordinator, started and stopped under strace, made $(sed -nE 's/^[0-9]+ +([a-z0-9_]+)\(.*/\1/p' "$dir/trace" | sort -u | wc -l) kinds of call, all allowed by $(basename "$unit")"
