#!/usr/bin/env bash
# .ci/run against a stand-in for scripts/test.sh: it passes on the run's exit status; a run past
# CI_TIMEOUT ends with exit 124 and a message naming the step and the tests still running, and
# every process of the run is stopped, those outside it left alone; SIGTERM to .ci/run stops
# the run too.
#   ci_run_test.sh SOURCE_DIR
set -euo pipefail
source_dir=$1
root=$(mktemp -d)
outside=
cleanup() {
  local pid
  [[ -z $outside ]] || kill "$outside" 2>/dev/null || true
  # What a failed bound left running: the stand-in and its child, known by the ROOT they carry
  # (a PID in a file may have been given to another process since).
  cat "$root"/*.pid 2>/dev/null | while read -r pid; do
    if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "ROOT=$root"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$root"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ ! -f $root/out ]] || cat "$root/out" >&2; exit 1; }

mkdir -p "$root/.ci" "$root/scripts"
cp "$source_dir/.ci/run" "$root/.ci/run"
# The stand-in: STUB=pass exits 0, STUB=fail exits 3; STUB=hang prints what scripts/test.sh and
# ctest print, starts a child, records both PIDs and sleeps.
cat >"$root/scripts/test.sh" <<'STUB'
#!/usr/bin/env bash
echo "== building"
echo "== testing"
case $STUB in
  pass) exit 0 ;;
  fail) exit 3 ;;
esac
echo "      Start  1: quick_test"
echo "      Start  2: hung_test"
echo "1/2 Test  #1: quick_test .......................   Passed    0.01 sec"
sleep 1000 &
echo $! >"$ROOT/child.pid"
echo $$ >"$ROOT/stub.pid"
wait
STUB
chmod +x "$root/.ci/run" "$root/scripts/test.sh"
export ROOT=$root

# gone PIDFILE: the process it names has ended (or is a zombie, ended but not yet reaped by
# whoever inherited it). A signalled process takes a moment to end: it is asked again for a
# while.
gone() {
  local pid state
  pid=$(cat "$1")
  for _ in $(seq 100); do
    state=$(sed -E 's/^[0-9]+ \(.*\) (.).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 0
    [[ $state != Z ]] || return 0
    sleep 0.1
  done
  return 1
}

rc=0
STUB=pass timeout 60 "$root/.ci/run" >"$root/out" 2>&1 || rc=$?
[[ $rc -eq 0 ]] || fail "a passing run exited $rc"
rc=0
STUB=fail timeout 60 "$root/.ci/run" >"$root/out" 2>&1 || rc=$?
[[ $rc -eq 3 ]] || fail "a run whose tests fail (exit 3) exited $rc"
if grep -q 'TIMED OUT' "$root/out"; then fail "a run that ended by itself reported a timeout"; fi
rc=0
STUB=pass CI_TIMEOUT=forever timeout 60 "$root/.ci/run" >"$root/out" 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "CI_TIMEOUT=forever: exit $rc, not 2"
grep -q 'CI_TIMEOUT=forever: expected a duration' "$root/out" || fail "CI_TIMEOUT=forever was not refused"

# A process beside the run, in this script's process group, which the bound must not touch.
sleep 1000 &
outside=$!
rc=0
# The outer timeout only keeps a .ci/run without a bound from holding this test.
STUB=hang CI_TIMEOUT=2s timeout --signal=KILL 60 "$root/.ci/run" >"$root/out" 2>&1 || rc=$?
[[ $rc -eq 124 ]] || fail "a run past CI_TIMEOUT exited $rc, not 124"
grep -q 'CI: TIMED OUT after 2s (CI_TIMEOUT) while testing; tests still running: hung_test\.' "$root/out" ||
  fail "the timeout's message does not name the step and the test that was running"
gone "$root/stub.pid" || fail "scripts/test.sh still runs after the bound"
gone "$root/child.pid" || fail "a process scripts/test.sh started still runs after the bound"
kill -0 "$outside" 2>/dev/null || fail "the bound stopped a process outside the run"

# SIGTERM to .ci/run (a CI cancelling the job, Ctrl-C's SIGINT likewise) stops the run.
rm -f "$root/stub.pid" "$root/child.pid"
STUB=hang timeout --signal=KILL 60 "$root/.ci/run" >"$root/out" 2>&1 &
ci=$!
for _ in $(seq 600); do [[ -s $root/child.pid ]] && break; sleep 0.1; done
[[ -s $root/child.pid ]] || fail "the stand-in did not start"
kill -TERM "$ci"
rc=0
wait "$ci" || rc=$?
[[ $rc -ne 0 ]] || fail ".ci/run exited 0 after SIGTERM"
gone "$root/stub.pid" || fail "scripts/test.sh still runs after .ci/run got SIGTERM"
gone "$root/child.pid" || fail "a process scripts/test.sh started still runs after .ci/run got SIGTERM"
kill -0 "$outside" 2>/dev/null || fail "SIGTERM to .ci/run stopped a process outside the run"
echo ".ci/run: exit status passed on, bound applied to its process group only, SIGTERM passed on"
