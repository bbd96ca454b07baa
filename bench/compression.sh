#!/usr/bin/env bash
# Update compression on the demo's federation: one coordinator and ten workers on loopback,
# and the demo's job (examples/fmnist-fedavg.toml) once per encoding (of the updates, or of
# the model sent, examples/fmnist-download-*.toml, when given), one after the
# other on the same processes. Prints, per job, the update and model bytes of each round as
# the round records give them, and the test accuracy; then one summary line per job.
#
#   bench/compression.sh [JOB.toml ...]
#     default: examples/fmnist-fedavg.toml examples/fmnist-float16.toml
#              examples/fmnist-int8.toml examples/fmnist-topk.toml
# Environment: BUILD_DIR (default build), WORKERS (default 10). Plaintext on loopback
# (--insecure), the state in a temporary directory removed at the end; every process started
# here is ended here, by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
workers=${WORKERS:-10}
if [ $# -gt 0 ]; then
  jobs=("$@")
else
  jobs=(examples/fmnist-fedavg.toml examples/fmnist-float16.toml examples/fmnist-int8.toml examples/fmnist-topk.toml)
fi
coordinator_bin="$build_dir/server/tessera-coordinator"
worker_bin="$build_dir/worker/tessera-worker"
cli_bin="$build_dir/cli/tessera"
for bin in "$coordinator_bin" "$worker_bin" "$cli_bin"; do
  [ -x "$bin" ] || { echo "missing $bin: build first (scripts/build.sh)" >&2; exit 2; }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/join-token"
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/admin-token"
"$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$work/state" --join-token-file "$work/join-token" \
  --insecure --admin-token-file "$work/admin-token" --log-level warn > "$work/coordinator.log" 2>&1 &
pids+=($!)
port=
for _ in $(seq 1 200); do
  port=$(sed -n 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "$work/coordinator.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "the coordinator did not start:" >&2; cat "$work/coordinator.log" >&2; exit 1; }
for i in $(seq 1 "$workers"); do
  OPENBLAS_NUM_THREADS=1 "$worker_bin" --coordinator "127.0.0.1:$port" --insecure --join-token-file "$work/join-token" \
    --name "bench-worker-$i" > "$work/worker-$i.log" 2>&1 &
  pids+=($!)
done
cli=("$cli_bin" --coordinator "127.0.0.1:$port" --insecure --admin-token-file "$work/admin-token")
for _ in $(seq 1 300); do
  ready=$("${cli[@]}" workers 2>/dev/null | grep -c "bench-worker-" || true)
  [ "$ready" -ge "$workers" ] && break
  sleep 0.2
done

echo "bench/compression.sh, $(date -u +%Y-%m-%d), $workers workers, $(nproc) cores"
summary=()
for job in "${jobs[@]}"; do
  id=$("${cli[@]}" submit "$job")
  start=$(date +%s)
  "${cli[@]}" watch "$id" > "$work/watch-$id.log" 2>&1 || true
  seconds=$(( $(date +%s) - start ))
  "${cli[@]}" status "$id" --json > "$work/status-$id.json"
  summary+=("$(/usr/bin/python3 - "$job" "$work/status-$id.json" "$seconds" <<'PY'
import json, sys
job, path, seconds = sys.argv[1], sys.argv[2], sys.argv[3]
status = json.load(open(path))
spec = status["job"]["spec"]
compression = spec.get("compression", {})
encoding = compression.get("encoding", "ENCODING_FLOAT32").replace("ENCODING_", "").lower()
if float(compression.get("fraction", 0)) > 0:
    encoding += " %g" % float(compression["fraction"])
if "download" in compression:
    encoding += ", model " + compression["download"].replace("ENCODING_", "").lower()
rounds = status.get("rounds", [])
print("%s (%s): state %s" % (job, encoding, status["job"].get("state", "?")), file=sys.stderr)
for r in rounds:
    print("  round %2d: %d/%d reported, updates %9d bytes, models %9d bytes, accuracy %.2f%%" % (
        r["round"], r.get("clients_reported", 0), r.get("clients_selected", 0), int(r.get("upload_bytes", 0)),
        int(r.get("download_bytes", 0)), 100 * r.get("test_accuracy", 0)), file=sys.stderr)
per_update = [int(r.get("upload_bytes", 0)) / max(1, r.get("clients_reported", 1)) for r in rounds]
last = rounds[-1] if rounds else {}
print("%-40s %-22s %6d rounds  %10.0f bytes/update  %10.0f update bytes/round  %10.0f model bytes/round  accuracy %.2f%%  %s s" % (
    job, encoding, len(rounds), sum(per_update) / max(1, len(per_update)),
    sum(int(r.get("upload_bytes", 0)) for r in rounds) / max(1, len(rounds)),
    sum(int(r.get("download_bytes", 0)) for r in rounds) / max(1, len(rounds)), 100 * last.get("test_accuracy", 0), seconds))
PY
)")
done
echo
printf '%s\n' "${summary[@]}"
