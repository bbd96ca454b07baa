#!/usr/bin/env bash
# Round overhead: what a federated round costs the coordinator when the clients do nothing
# but the protocol. For each row, a fresh tessera-coordinator on loopback (state in a
# temporary directory) runs a job whose rounds take all N clients, simulated by one
# tessera-loadgen process; then one loopback TCP stream moves the round's bytes
# (2 x N x the model's bytes: every download and every upload), the floor the round is held
# against. Last, 1,000 idle joined clients heartbeat for a while and the coordinator's CPU
# use is read from /proc.
#
#   bench/round_overhead.sh [BUILD_DIR]          (default: build)
#
# Environment:
#   ROWS    model:N pairs, models tiny (SimpleCNN, 44,426 parameters), mlp10 (MLP 784-3297-10,
#           2,621,125 parameters, 10 MiB), mlp4 (784-1320-10, 4.2 MB), mlp1 (784-330-10, 1.05 MB)
#           and micro (MLP 784-1-10, 805 parameters: the per-client cost of a round without its
#           bytes)
#           (default: tiny:10,tiny:50,tiny:100,tiny:1000,mlp10:10,mlp10:50,mlp10:100)
#   ROUNDS  rounds per row (default 14); the first WARMUP (default 6) are left out of the medians:
#           with 100 clients of the small model, rounds 1-6 are 1.5-4x slower than the later ones
#           while the connections' TCP buffers grow
#           (docs/benchmarks/round-overhead-history-2026-12-01-02.md)
#   UPDATE  zero or random: what every client uploads (default random)
#   CHANNELS  gRPC channels (TCP connections) the simulated clients share (default 0: one per
#           client, as real workers; shared connections make heartbeats wait behind transfers)
#   MAX_TEST_SAMPLES  test images the coordinator evaluates on after each round (default 100)
#   IDLE_CLIENTS, IDLE_S  the heartbeat row (default 1000 clients for 20 s; IDLE_CLIENTS=0 skips it)
#   COORDINATOR_FLAGS  added to every coordinator's command line (default none: its defaults,
#           heartbeats every 5 s, a worker silent for 15 s dropped from its round)
#   LOADGEN_FLAGS  added to every load generator's command line of the round rows (default
#           none; --always-download makes the clients download models small enough to ride
#           in their tasks, --chunk-kib N cuts their uploads into N KiB chunks, --trained-weights
#           sends each update as the trained model, which the coordinator subtracts its model from,
#           --stream-window-kib N gives the clients a fixed HTTP/2 receive window without probing)
#   COORDINATOR_CPUS, LOADGEN_CPUS  CPU lists (taskset -c) to hold the coordinator and the load
#           generator to (default: unset, the scheduler's choice). COORDINATOR_CPUS=0 LOADGEN_CPUS=1
#           gives each process a core of its own, as on machines of their own: no thread of one
#           waits for a core the other holds, and a wake-up inside a process stays on its core
#           (docs/benchmarks/round-overhead-history-2026-12-03.md). The floor's two threads are
#           not held.
#   FLOOR_REPEAT  transfers the floor is the median of (default 9)
#   KEEP=1  keep the logs (their directory is printed)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/round_overhead_common.sh
. "$here/round_overhead_common.sh"
overhead_binaries "${1:-build}"

rows=${ROWS:-tiny:10,tiny:50,tiny:100,tiny:1000,mlp10:10,mlp10:50,mlp10:100}
rounds=${ROUNDS:-14}
warmup=${WARMUP:-6}
update=${UPDATE:-random}
channels=${CHANNELS:-0}
max_test=${MAX_TEST_SAMPLES:-100}
idle_clients=${IDLE_CLIENTS:-1000}
idle_s=${IDLE_S:-20}

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-round-overhead.XXXXXX")
coordinator_pid=
cleanup() {
  if [ -n "$coordinator_pid" ]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1
loadgen_pin=()
if [ -n "${LOADGEN_CPUS:-}" ]; then loadgen_pin=(taskset -c "$LOADGEN_CPUS"); fi

echo "== round overhead: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "== $rounds rounds per row, medians of rounds $((warmup + 1))-$rounds; update $update;" \
  "$([ "$channels" = 0 ] && echo "one gRPC channel per simulated client" || echo "$channels shared gRPC channel(s)");" \
  "evaluation on $max_test test images${COORDINATOR_CPUS:+; the coordinator on CPUs $COORDINATOR_CPUS}${LOADGEN_CPUS:+; the load generator on CPUs $LOADGEN_CPUS}"
show_fit=1
print_header
status=0
references=()
for row in ${rows//,/ }; do
  model=${row%%:*}
  n=${row##*:}
  flags=$(model_flags "$model")
  bytes=$(( 2 * n * $(model_parameters "$model") * 4 ))
  start_coordinator
  log="$row_dir/loadgen.log"
  # shellcheck disable=SC2086
  if ! "${loadgen_pin[@]}" "$loadgen_bin" --coordinator "127.0.0.1:$coordinator_port" --join-token-file "$token_file" --admin-token-file "$admin_file" \
      --clients "$n" --channels "$channels" $flags --rounds "$rounds" --warmup "$warmup" --update "$update" \
      --max-test-samples "$max_test" ${LOADGEN_FLAGS:-} --coordinator-pid "$coordinator_pid" --timeout-s 300 > "$log" 2>&1; then
    status=1
  fi
  stop_coordinator
  measure_floor "$bytes"
  print_row "$log" "$model" "$n"
  cp "$log" "$work/loadgen-$model-$n.log"
  references+=("$(printf '%-6s %5s %11s %7s %9s | %-20s | %-20s | %s' "$model" "$n" "${row_round_ms:-?} ms" \
    "${row_ratio_shown}x" "$coordinator_peak_mib MiB" "$(flower_reference "$model" "$n")" \
    "$(previous_reference "$model" "$n")" \
    "$(target_check "$model" "$n" "$row_round_ms" "$row_ratio" "$coordinator_peak_mib" "$row_ok")")")
done

if [ "$idle_clients" -gt 0 ]; then
  start_coordinator
  log="$work/loadgen-idle-$idle_clients.log"
  if ! "$loadgen_bin" --coordinator "127.0.0.1:$coordinator_port" --join-token-file "$token_file" --admin-token-file "$admin_file" \
      --clients "$idle_clients" --channels "$channels" --idle-s "$idle_s" --coordinator-pid "$coordinator_pid" \
      --timeout-s 300 > "$log" 2>&1; then
    status=1
  fi
  stop_coordinator
  echo "== heartbeats: $idle_clients idle joined clients for $idle_s s:" \
    "coordinator $(field "$log" idle coordinator_cpu_pct)% of a core," \
    "$(field "$log" idle heartbeats_per_s) heartbeats/s, peak RSS $coordinator_peak_mib MiB;" \
    "loadgen $(field "$log" 'loadgen (idle window)' cpu_pct)% of a core," \
    "$(field "$log" 'loadgen (idle window)' threads) threads;" \
    "joined in $(sed -n 's/.* in \([0-9.]*\) s over.*/\1/p' "$log") s"
  grep '^FAILED' "$log" || true
  idle_pct=$(field "$log" idle coordinator_cpu_pct)
  references+=("$(printf '%-6s %5s %11s %7s %9s | %-20s | %-20s | %s' idle "$idle_clients" "${idle_pct}% cpu" "" \
    "$coordinator_peak_mib MiB" "-" "31% of a core" \
    "$(awk -v p="$idle_pct" 'BEGIN { printf "heartbeats <= 5%% of a core: %s", (p != "" && p <= 5) ? "met" : "not met" }')")")
fi

echo "== beside earlier figures (Flower 1.6.0 and the previous Tessera, measured on this machine"
echo "   before; not rerun here) and the targets"
printf '%-6s %5s %11s %7s %9s | %-20s | %-20s | %s\n' model N round ratio peak "Flower 1.6.0" "previous Tessera" target
for line in "${references[@]}"; do echo "$line"; done

echo "== what the columns say: round_ms, the median round (start to commit) after the warm-up;"
echo "   floor_ms, one loopback TCP stream moving 2 x N x the model's bytes; ratio = round/floor;"
echo "   select..commit, the medians of each phase from the coordinator's round records (upload is"
echo "   the median client's upload as the coordinator timed it; eval, the coordinator's evaluation"
echo "   on $max_test test images); peak_MiB, the coordinator's VmHWM; coord_cpu% and gen_cpu%,"
echo "   the coordinator's and the load generator's user+sys CPU over the job's wall time (percent"
echo "   of one core: on this machine's $(nproc) cores, they share $((100 * $(nproc)))%); ok, every round"
echo "   committed with every client accepted and no client refused or dropped; cpu_fit, the two"
echo "   processes' CPU per round (their shares over the job times the median interval between"
echo "   rounds' starts) over $(nproc) cores x 2 x floor: above 1, their work per round does not fit"
echo "   in twice the floor on this machine, however their threads are placed."
echo "== load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
for log in "$work"/loadgen-*.log; do
  if grep -q '^FAILED' "$log"; then
    echo "-- $(basename "$log"):"
    grep -E '^(FAILED|client error)' "$log"
  fi
done
exit $status
