#!/usr/bin/env bash
# Runs scripts/demo.sh against stand-ins for the build, the coordinator, the workers and the CLI
# (in a scratch copy of the repository, so nothing is built or installed) and checks how it
# runs them: a BUILD_DIR given as an absolute path (with a space in it), a job file named relative
# to the directory it is started from, a worker listing that
# fails while the coordinator starts, and that every process it started is stopped when the
# job ends, when watching it fails, on Ctrl-C and on SIGTERM to the script alone; that a job an interrupted demo left running
# is cancelled first; and that DEVICE, FALLBACK_DEVICE, EVAL_DEVICE and SKIP_BUILD reach the workers,
# the coordinator and the build.
#   demo_script_test.sh SOURCE_DIR
set -euo pipefail
src="$1"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

root="$scratch/repo"
mkdir -p "$root/scripts" "$root/examples"
echo 'name = "default"' >"$root/examples/fmnist-fedavg.toml"
cp "$src/scripts/demo.sh" "$root/scripts/"
printf '#!/usr/bin/env bash\necho built >>"$STUB_PIDS.built"\n' >"$root/scripts/build.sh"
printf '#!/usr/bin/env bash\necho "setup must not run with SKIP_SETUP=1" >&2; exit 1\n' >"$root/scripts/setup.sh"
chmod +x "$root/scripts/"*.sh

bin="$scratch/build dir"
mkdir -p "$bin/server" "$bin/worker" "$bin/cli"
# The daemons record their PIDs and wait to be stopped.
cat >"$bin/server/tessera-coordinator" <<'EOF'
#!/usr/bin/env bash
echo $$ >>"$STUB_PIDS"
echo "$*" >>"$STUB_PIDS.coordinator-args"
echo "tessera-coordinator listening on port 7070"
exec sleep 600
EOF
cat >"$bin/worker/tessera-worker" <<'EOF'
#!/usr/bin/env bash
echo $$ >>"$STUB_PIDS"
echo "$*" >>"$STUB_PIDS.args"
exec sleep 600
EOF
# The CLI: `workers` fails on its first call, then lists every worker ready; `watch` does what
# STUB_WATCH says (ok, fail, hang).
cat >"$bin/cli/tessera" <<'EOF'
#!/usr/bin/env bash
for arg in "$@"; do
  case $arg in
    provision) exit 0 ;;
    workers)
      if [[ ! -e "$STUB_PIDS.listed" ]]; then touch "$STUB_PIDS.listed"; echo "unavailable" >&2; exit 14; fi
      for i in $(seq -w 1 "$WORKERS"); do echo "worker-$i yes"; done; exit 0 ;;
    jobs)
      printf '%-18s %-10s %11s %9s  %s\n' JOB STATE ROUNDS ACCURACY NAME
      if [[ -n "${STUB_LEFT:-}" ]]; then
        printf '%-18s %-10s %11s %9s  %s\n' "$STUB_LEFT" running "3/8" "80.00%" fmnist-fedavg
        printf '%-18s %-10s %11s %9s  %s\n' job-0-done succeeded "8/8" "86.70%" fmnist-fedavg
      fi
      exit 0 ;;
    cancel) echo "${*: -1}" >>"$STUB_PIDS.cancelled"; exit 0 ;;
    submit)
      [[ -r "${*: -1}" ]] || { echo "stub tessera: cannot read ${*: -1}" >&2; exit 2; }
      echo "${*: -1}" >>"$STUB_PIDS.submitted"; echo "job-1"; exit 0 ;;
    watch)
      case $STUB_WATCH in
        ok) echo "final test accuracy: 86.70% after 8 rounds"; exit 0 ;;
        fail) echo "watch: the coordinator went away" >&2; exit 14 ;;
        hang) echo $$ >>"$STUB_PIDS.watch"; exec sleep 600 ;;
      esac ;;
  esac
done
echo "stub tessera: unexpected arguments $*" >&2; exit 2
EOF
chmod +x "$bin/server/tessera-coordinator" "$bin/worker/tessera-worker" "$bin/cli/tessera"

# demo CASE WATCH [RUNNER...]: runs the demo, its exit status in $rc, its output in $scratch/CASE.log.
demo() {
  local name=$1 watch=$2
  shift 2
  export STUB_PIDS="$scratch/$name.pids"
  rm -f "$STUB_PIDS" "$STUB_PIDS.listed" "$STUB_PIDS.watch" "$STUB_PIDS.cancelled" "$STUB_PIDS.args" "$STUB_PIDS.built" \
    "$STUB_PIDS.coordinator-args" "$STUB_PIDS.submitted"
  rc=0
  STUB_WATCH=$watch SKIP_SETUP=1 BUILD_DIR="$bin" STATE_DIR="$scratch/state $name" WORKERS=3 \
    timeout 60 "$@" "$root/scripts/demo.sh" ${demo_args[@]+"${demo_args[@]}"} >"$scratch/$name.log" 2>&1 || rc=$?
}
demo_args=()
# None of the processes the demo started is left running.
all_stopped() {
  local name=$1 pid
  [[ -s "$scratch/$name.pids" ]] || { cat "$scratch/$name.log"; fail "$name: the demo started no daemon"; }
  [[ $(wc -l <"$scratch/$name.pids") -eq 4 ]] || { cat "$scratch/$name.log"; fail "$name: expected a coordinator and 3 workers"; }
  for _ in $(seq 50); do
    local alive=0
    while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$scratch/$name.pids"
    ((alive == 0)) && return 0
    sleep 0.1
  done
  while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$scratch/$name.pids"
  cat "$scratch/$name.log"
  fail "$name: the demo left a daemon running"
}

demo ok ok
[[ $rc -eq 0 ]] || { cat "$scratch/ok.log"; fail "the demo failed (rc $rc) with an absolute BUILD_DIR and a first listing that failed"; }
grep -q "final test accuracy" "$scratch/ok.log" || { cat "$scratch/ok.log"; fail "the demo did not watch its job"; }
all_stopped ok

[[ "$(cat "$scratch/ok.pids.submitted")" == *examples/fmnist-fedavg.toml ]] ||
  fail "the demo did not submit examples/fmnist-fedavg.toml by default: $(cat "$scratch/ok.pids.submitted")"
[[ ! -e "$scratch/ok.pids.cancelled" ]] || fail "the demo cancelled a job when none was left running"

# A job file named relative to the directory the demo is started from, outside the repository.
mkdir -p "$scratch/elsewhere"
echo 'name = "mine"' >"$scratch/elsewhere/my job.toml"
demo_args=("my job.toml")
cd "$scratch/elsewhere"
demo relative ok
cd - >/dev/null
demo_args=()
[[ $rc -eq 0 ]] || { cat "$scratch/relative.log"; fail "the demo failed with a job file relative to where it was started"; }
[[ "$(cat "$scratch/relative.pids.submitted")" == "$scratch/elsewhere/my job.toml" ]] ||
  { cat "$scratch/relative.log"; fail "the demo did not submit the job file relative to where it was started"; }
all_stopped relative
[[ -e "$scratch/ok.pids.built" ]] || fail "the demo did not build"
[[ $(grep -c -- '--device cpu --fallback-device cpu$' "$scratch/ok.pids.args") -eq 3 ]] ||
  { cat "$scratch/ok.pids.args"; fail "the workers were not started on the CPU with the CPU as fallback"; }

# DEVICE and FALLBACK_DEVICE reach every worker (an empty fallback as an empty value), and
# SKIP_BUILD=1 runs what BUILD_DIR holds.
DEVICE=cuda FALLBACK_DEVICE= EVAL_DEVICE=cuda SKIP_BUILD=1 demo gpu ok
[[ $rc -eq 0 ]] || { cat "$scratch/gpu.log"; fail "the demo failed with DEVICE=cuda"; }
[[ ! -e "$scratch/gpu.pids.built" ]] || fail "the demo built although SKIP_BUILD=1"
[[ $(grep -c -- '--device cuda --fallback-device $' "$scratch/gpu.pids.args") -eq 3 ]] ||
  { cat "$scratch/gpu.pids.args"; fail "the workers were not started with --device cuda and an empty fallback"; }
grep -q -- '--eval-device cuda$' "$scratch/gpu.pids.coordinator-args" ||
  { cat "$scratch/gpu.pids.coordinator-args"; fail "the coordinator was not started with --eval-device cuda"; }
grep -q -- '--eval-device cpu$' "$scratch/ok.pids.coordinator-args" || fail "the coordinator did not evaluate on the CPU by default"
grep -q "workers on device cuda" "$scratch/gpu.log" || { cat "$scratch/gpu.log"; fail "the demo did not say which device"; }
all_stopped gpu

# A job an earlier, interrupted demo left running in the state directory is cancelled before
# this one is submitted; an ended one is left alone.
STUB_LEFT=job-0-left demo left ok
[[ $rc -eq 0 ]] || { cat "$scratch/left.log"; fail "the demo failed with a job left running"; }
[[ "$(cat "$scratch/left.pids.cancelled" 2>/dev/null)" == "job-0-left" ]] ||
  { cat "$scratch/left.log"; fail "the job left running was not cancelled (alone)"; }
all_stopped left

demo fail fail
[[ $rc -ne 0 ]] || { cat "$scratch/fail.log"; fail "the demo succeeded although watching its job failed"; }
all_stopped fail

# Ctrl-C: SIGINT to the demo's whole process group while it watches.
demo interrupt hang python3 -c '
import os, signal, subprocess, sys, time
p = subprocess.Popen(sys.argv[2:], start_new_session=True,
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
for _ in range(300):
    if os.path.exists(sys.argv[1]): break
    time.sleep(0.1)
os.killpg(p.pid, signal.SIGINT)
sys.exit(p.wait())' "$scratch/interrupt.pids.watch"
[[ -e "$scratch/interrupt.pids.watch" ]] || { cat "$scratch/interrupt.log"; fail "the demo never reached watching its job"; }
[[ $rc -ne 0 ]] || fail "the interrupted demo exited 0"
all_stopped interrupt

# SIGTERM to the demo alone (a service manager's stop, `kill PID`): it ends while its watch
# hangs, and stops the watch with the daemons.
demo terminate hang python3 -c '
import os, signal, subprocess, sys, time
p = subprocess.Popen(sys.argv[2:], start_new_session=True)
for _ in range(300):
    if os.path.exists(sys.argv[1]): break
    time.sleep(0.1)
p.send_signal(signal.SIGTERM)
sys.exit(p.wait())' "$scratch/terminate.pids.watch"
[[ -e "$scratch/terminate.pids.watch" ]] || { cat "$scratch/terminate.log"; fail "the demo never reached watching its job"; }
[[ $rc -ne 0 ]] || fail "the terminated demo exited 0"
all_stopped terminate
watcher=$(cat "$scratch/terminate.pids.watch")
for _ in $(seq 50); do kill -0 "$watcher" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$watcher" 2>/dev/null; then kill -KILL "$watcher"; fail "the watch outlived the demo stopped by SIGTERM"; fi
echo "demo.sh: absolute BUILD_DIR, a job file relative to the caller, a failed first listing, and every daemon stopped on success, failure, Ctrl-C and SIGTERM, a job left running cancelled, DEVICE, FALLBACK_DEVICE, EVAL_DEVICE and SKIP_BUILD honoured"
