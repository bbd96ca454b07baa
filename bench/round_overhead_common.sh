# shellcheck shell=bash disable=SC2034
# Shared by bench/round_overhead.sh and bench/round_overhead_workers.sh (sourced, not run):
# a coordinator per row on loopback with its state in a temporary directory, the loopback
# floor, and the table's columns. Every process started here is ended here, by its pid.
# The sourcing script sets $work (a temporary directory); the functions set the globals they
# name (worker_bin, row_round_ms, ...) for it to read.

# Sets $build_dir from $1 (default build) and checks the binaries.
overhead_binaries() {
  build_dir=${1:-build}
  coordinator_bin="$build_dir/server/tessera-coordinator"
  worker_bin="$build_dir/worker/tessera-worker"
  loadgen_bin="$build_dir/bench/loadgen/tessera-loadgen"
  floor_bin="$build_dir/bench/bench_loopback_floor"
  for bin in "$coordinator_bin" "$loadgen_bin" "$floor_bin"; do
    if [ ! -x "$bin" ]; then
      echo "missing $bin: build first (BUILD_DIR=$build_dir scripts/build.sh)" >&2
      exit 2
    fi
  done
}

# Model names of the rows: their loadgen flags and parameter counts (4 bytes each).
model_flags() {
  case "$1" in
    tiny) echo "--model simplecnn" ;;
    mlp10) echo "--model mlp --hidden 3297" ;;
    micro) echo "--model mlp --hidden 1" ;;
    mlp1) echo "--model mlp --hidden 330" ;;
    mlp4) echo "--model mlp --hidden 1320" ;;
    *) echo "unknown model '$1' (expected tiny, mlp10, mlp4, mlp1 or micro)" >&2; return 1 ;;
  esac
}
model_parameters() {
  case "$1" in
    tiny) echo 44426 ;;
    mlp10) echo 2621125 ;;
    micro) echo 805 ;;
    mlp1) echo 262690 ;;
    mlp4) echo 1049470 ;;
  esac
}

# Starts a coordinator in a fresh directory under $work, with $COORDINATOR_FLAGS added to its
# command line (e.g. "--heartbeat-timeout-ms 30000") and, when $COORDINATOR_CPUS is set, held
# to those CPUs (taskset -c); sets $coordinator_pid, $coordinator_port, $row_dir and $token_file.
start_coordinator() {
  local pin=()
  if [ -n "${COORDINATOR_CPUS:-}" ]; then pin=(taskset -c "$COORDINATOR_CPUS"); fi
  row_dir=$(mktemp -d "${work:?}/row.XXXXXX")
  token_file="$row_dir/join-token"
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token_file"
  admin_file="$row_dir/admin-token"
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$admin_file"
  # shellcheck disable=SC2086
  "${pin[@]}" "$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$row_dir/state" --join-token-file "$token_file" \
    --insecure --admin-token-file "$admin_file" \
    --log-level "${COORDINATOR_LOG_LEVEL:-warn}" ${COORDINATOR_FLAGS:-} > "$row_dir/coordinator.log" 2>&1 &
  coordinator_pid=$!
  coordinator_port=
  for _ in $(seq 1 200); do
    coordinator_port=$(sed -n 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "$row_dir/coordinator.log")
    [ -n "$coordinator_port" ] && return 0
    kill -0 "$coordinator_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "the coordinator did not start; its log:" >&2
  cat "$row_dir/coordinator.log" >&2
  return 1
}

# Peak RSS of the coordinator in MiB (VmHWM), then SIGTERM and wait.
stop_coordinator() {
  coordinator_peak_mib=$(awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$coordinator_pid/status" 2>/dev/null || echo "?")
  kill -TERM "$coordinator_pid" 2>/dev/null || true
  wait "$coordinator_pid" 2>/dev/null || true
  coordinator_pid=
}

# Sets $floor_ms: the median time to move $1 bytes over one loopback TCP stream, of
# $FLOOR_REPEAT transfers (default 9).
measure_floor() {
  floor_ms=$("$floor_bin" --bytes "$1" --repeat "${FLOOR_REPEAT:-9}" | sed -n 's/.*floor_ms=\([0-9.]*\).*/\1/p')
}

# key=value from the loadgen's line starting with $2, in file $1.
field() {
  sed -n "s/^$2.* $3=\([^ ]*\).*/\1/p" "$1" | head -n 1
}

# With show_fit=1 (bench/round_overhead.sh), a last column, cpu_fit: the two processes' CPU
# per round over what the machine's cores give in twice the floor.
print_header() {
  printf '%-6s %5s %4s %9s %9s %7s %7s %8s %8s %8s %8s %8s %7s %7s %8s %9s %8s %5s' \
    model N rnds round_ms floor_ms ratio select distrib compute upload straggle aggreg eval commit peak_MiB coord_cpu% gen_cpu% ok
  if [ "${show_fit:-0}" = 1 ]; then printf ' %7s' cpu_fit; fi
  printf '\n'
}

# One row from a loadgen log ($1) and what the script measured: model, N, floor, peak.
print_row() {
  local log=$1 model=$2 n=$3
  local round ratio ok
  round=$(field "$log" summary round_ms)
  # Two decimals: the targets are checked on the ratio itself (row_ratio), never on a rounding
  # of it (2.04 printed as "2.0" is over 2x).
  ratio=$(awk -v r="$round" -v f="$floor_ms" 'BEGIN { if (f > 0 && r != "") printf "%.2f", r / f; else print "?" }')
  ok=$(field "$log" summary all_accepted)
  grep -q '^FAILED' "$log" && ok=no
  row_round_ms=$round
  row_ratio_shown=$ratio
  row_ratio=$(awk -v r="$round" -v f="$floor_ms" 'BEGIN { if (f > 0 && r != "") printf "%.6f", r / f; else print "?" }')
  row_ok=${ok:-no}
  printf '%-6s %5s %4s %9s %9s %7s %7s %8s %8s %8s %8s %8s %7s %7s %8s %9s %8s %5s' \
    "$model" "$n" "$(field "$log" summary measured)" "$round" "$floor_ms" "$ratio" \
    "$(field "$log" summary selection_ms)" "$(field "$log" summary distribution_ms)" \
    "$(field "$log" summary compute_ms)" \
    "$(field "$log" summary upload_ms)" "$(field "$log" summary straggler_ms)" \
    "$(field "$log" summary aggregation_ms)" "$(field "$log" summary evaluation_ms)" \
    "$(field "$log" summary commit_ms)" "$coordinator_peak_mib" "$(field "$log" coordinator: cpu_pct)" \
    "$(field "$log" 'loadgen (job window)' cpu_pct)" "${ok:-no}"
  if [ "${show_fit:-0}" = 1 ]; then
    # Both processes' CPU per round (their shares of a core over the job, times the median
    # interval from one round's start to the next) over cores x 2 x floor: above 1, no
    # placement of their threads could make 2x the floor here.
    printf ' %7s' "$(awk -v c="$(field "$log" coordinator: cpu_pct)" -v g="$(field "$log" 'loadgen (job window)' cpu_pct)" \
      -v i="$(field "$log" summary interval_ms)" -v f="$floor_ms" -v k="$(nproc)" \
      'BEGIN { if (c != "" && g != "" && i > 0 && f > 0) printf "%.2f", (c + g) / 100 * i / (k * 2 * f); else print "?" }')"
  fi
  printf '\n'
}

# Figures measured earlier on this machine, printed beside ours (they are not rerun here:
# Flower is not installable from Debian). "-" where none was taken.
flower_reference() {
  case "$1:$2" in
    tiny:10) echo "65 ms" ;; tiny:50) echo "302 ms" ;; tiny:100) echo "656 ms" ;;
    mlp10:10) echo "838 ms" ;; mlp10:50) echo ">8 GB RSS, stopped" ;; *) echo "-" ;;
  esac
}
previous_reference() {
  case "$1:$2" in
    tiny:10) echo "47 ms" ;; tiny:50) echo "158 ms" ;; tiny:100) echo "344-470 ms" ;;
    tiny:1000) echo "5.1 s, 548 MB peak" ;; mlp10:10) echo "934 ms" ;; mlp10:50) echo "7.7 s, 1.3 GB peak" ;;
    *) echo "-" ;;
  esac
}
# The target a row is meant to meet, and whether this run met it.
target_check() {
  local model=$1 n=$2 round=$3 ratio=$4 peak=$5 ok=$6
  case "$model:$n" in
    tiny:100) awk -v r="$round" 'BEGIN { printf "round <= 60 ms: %s", (r != "" && r <= 60) ? "met" : "not met" }' ;;
    mlp10:50) awk -v x="$ratio" 'BEGIN { printf "round <= 2x floor: %s", (x != "?" && x <= 2) ? "met" : "not met" }' ;;
    mlp10:100) awk -v p="$peak" 'BEGIN { printf "peak RSS <= 300 MB: %s", (p != "?" && p * 1.048576 <= 300) ? "met" : "not met" }' ;;
    tiny:1000) awk -v x="$ratio" -v ok="$ok" \
      'BEGIN { printf "round <= 2x floor, no refused/dropped client: %s", (x != "?" && x <= 2 && ok == "yes") ? "met" : "not met" }' ;;
    *) echo "-" ;;
  esac
}
