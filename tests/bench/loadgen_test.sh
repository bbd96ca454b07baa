#!/usr/bin/env bash
# tessera-loadgen against a real tessera-coordinator on loopback: 20 simulated clients run a
# 2-round SimpleCNN job (random updates, hash-checked downloads); every round must commit on
# its first attempt with all 20 clients accepted, and no client may be refused or dropped.
# Then 10 clients run another job with downloads checked in place (no hashes), as the
# benchmark runs them, and two more that download the model instead of taking it inside
# their tasks (--always-download), with and without hashes, and one whose updates are sent as
# the trained model (--trained-weights), and two of a job whose model travels compressed
# (--download).
# Then the same clients idle for a second: every heartbeat answered. No timing is asserted.
#   loadgen_test.sh COORDINATOR_BIN LOADGEN_BIN
set -euo pipefail
coordinator_bin=$1
loadgen_bin=$2
if [ ! -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ]; then
  echo "SKIP: the coordinator evaluates on Fashion-MNIST's test set (Debian's dataset-fashion-mnist), not installed"
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/loadgen-test.XXXXXX")
coordinator_pid=
cleanup() {
  if [ -n "$coordinator_pid" ]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "--- $f"; tail -n 40 "$f"; done
  exit 1
}

echo loadgen-test-token > "$dir/token"
echo loadgen-test-admin > "$dir/admin"
"$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$dir/state" --join-token-file "$dir/token" \
  --insecure --admin-token-file "$dir/admin" \
  > "$dir/coordinator.log" 2>&1 &
coordinator_pid=$!
port=
for _ in $(seq 1 300); do
  port=$(sed -n 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "$dir/coordinator.log")
  [ -n "$port" ] && break
  kill -0 "$coordinator_pid" 2>/dev/null || fail "the coordinator exited"
  sleep 0.1
done
[ -n "$port" ] || fail "the coordinator did not say which port it listens on"

# Bad flags are refused before anything runs.
if "$loadgen_bin" --no-such-flag > "$dir/usage.log" 2>&1; then fail "an unknown flag was accepted"; fi
if "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --update sometimes \
  > "$dir/usage.log" 2>&1; then fail "--update sometimes was accepted"; fi
if "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" \
  --rounds 5 --warmup 5 > "$dir/usage.log" 2>&1; then fail "--warmup 5 of --rounds 5 was accepted"; fi
grep -q "leaves none of the 5 rounds" "$dir/usage.log" || fail "the refusal of --warmup 5 does not say why"
# Numbers are read as the flag parser reads them: no sign, space or trailing text. (The bad
# --partition after them is refused too, so a width taken by mistake runs nothing.)
for hidden in +64 " 64" 64x 64, -1; do
  if "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" \
    --model mlp --hidden "$hidden" --partition none > "$dir/usage.log" 2>&1; then fail "--hidden '$hidden' was accepted"; fi
  grep -qF "flag --hidden: expected comma-separated integers from 1 to 1000000, got '$hidden'" "$dir/usage.log" ||
    fail "the refusal of --hidden '$hidden' does not name the flag and its range: $(cat "$dir/usage.log")"
done
if "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" \
  --timeout-s +60 > "$dir/usage.log" 2>&1; then fail "--timeout-s +60 was accepted"; fi
grep -qF "flag --timeout-s: expected a finite decimal number, got '+60'" "$dir/usage.log" ||
  fail "the refusal of --timeout-s +60 does not name the flag"

export OPENBLAS_NUM_THREADS=1
if ! "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --clients 20 --channels 2 \
    --rounds 2 --warmup 0 --update random --verify-downloads --max-test-samples 100 --timeout-s 240 \
    --coordinator-pid "$coordinator_pid" > "$dir/rounds.log" 2>&1; then
  fail "the load generator reported a failure"
fi
grep -q 'summary: .* state=JOB_SUCCEEDED rounds=2 .* clients=20 .*all_accepted=yes' "$dir/rounds.log" ||
  fail "expected 2 committed rounds with all 20 clients accepted"
for r in 1 2; do
  grep -Eq "^ +$r +1 +20/20 " "$dir/rounds.log" || fail "round $r: expected attempt 1 with 20/20 accepted"
done
grep -q ' uploads_accepted=40 ' "$dir/rounds.log" || fail "expected 40 accepted uploads"
grep -q ' downloads=40 ' "$dir/rounds.log" || fail "expected 40 checked downloads"

# Without --verify-downloads (the benchmark's way), chunks are checked in place, without a
# parse: the same job must pass the same way.
if ! "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --clients 10 \
    --name-prefix unverified --rounds 2 --warmup 0 --update zero --max-test-samples 100 --timeout-s 240 \
    > "$dir/unverified.log" 2>&1; then
  fail "the load generator without --verify-downloads reported a failure"
fi
grep -q 'summary: .* state=JOB_SUCCEEDED rounds=2 .* clients=10 .*all_accepted=yes' "$dir/unverified.log" ||
  fail "without --verify-downloads: expected 2 committed rounds with all 10 clients accepted"
grep -q ' downloads=20 ' "$dir/unverified.log" || fail "without --verify-downloads: expected 20 checked downloads"

# The jobs above send the model inside each task (it is small); with --always-download the
# clients refuse that at join and download it, as workers did before.
for verify in "" --verify-downloads; do
  if ! "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --clients 10 \
      --name-prefix "downloading$verify" --rounds 2 --warmup 0 --update zero --max-test-samples 100 --timeout-s 240 \
      --always-download $verify > "$dir/downloading.log" 2>&1; then
    fail "the load generator with --always-download $verify reported a failure"
  fi
  grep -q 'summary: .* state=JOB_SUCCEEDED rounds=2 .* clients=10 .*all_accepted=yes' "$dir/downloading.log" ||
    fail "with --always-download $verify: expected 2 committed rounds with all 10 clients accepted"
  grep -q ' downloads=20 ' "$dir/downloading.log" || fail "with --always-download $verify: expected 20 checked downloads"
done

# Updates sent as the trained model (--trained-weights), which the coordinator subtracts its
# model from as they land.
if ! "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --clients 10 \
    --name-prefix trained --rounds 2 --warmup 0 --update random --max-test-samples 100 --timeout-s 240 \
    --trained-weights > "$dir/trained.log" 2>&1; then
  fail "the load generator with --trained-weights reported a failure"
fi
grep -q 'summary: .* state=JOB_SUCCEEDED rounds=2 .* clients=10 .*all_accepted=yes' "$dir/trained.log" ||
  fail "with --trained-weights: expected 2 committed rounds with all 10 clients accepted"

# A job whose model travels compressed ([compression] download): its manifest gives each
# tensor in int8 or float16, which the clients check against its shape, inside the tasks with
# hashes and by DownloadModel in place; their updates keep the model's shapes.
for download in "int8 --verify-downloads" "float16 --always-download"; do
  if ! "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --clients 10 \
      --name-prefix "download-${download%% *}" --rounds 2 --warmup 0 --update random --max-test-samples 100 --timeout-s 240 \
      --download $download > "$dir/download.log" 2>&1; then
    fail "the load generator with --download $download reported a failure"
  fi
  grep -q 'summary: .* state=JOB_SUCCEEDED rounds=2 .* clients=10 .*all_accepted=yes' "$dir/download.log" ||
    fail "with --download $download: expected 2 committed rounds with all 10 clients accepted"
  grep -q ' downloads=20 ' "$dir/download.log" || fail "with --download $download: expected 20 checked downloads"
done
if "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --download topk \
  > "$dir/usage.log" 2>&1; then fail "--download topk was accepted"; fi

if ! "$loadgen_bin" --coordinator "127.0.0.1:$port" --join-token-file "$dir/token" --admin-token-file "$dir/admin" --clients 20 \
    --name-prefix idle --idle-s 1 --timeout-s 60 > "$dir/idle.log" 2>&1; then
  fail "idle clients reported a failure"
fi
grep -q '^idle: clients=20 ' "$dir/idle.log" || fail "expected the idle report"
echo "PASS"
cat "$dir/rounds.log"
