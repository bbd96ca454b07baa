#!/usr/bin/env bash
# Debian's prometheus against a real federation, with deploy/prometheus as shipped: a
# coordinator under mutual TLS (certificates from `tessera provision`) serving --metrics-listen,
# three workers serving theirs, scraped with prometheus.yml (its targets files written with the
# ports chosen here, the operator's certificate beside it, the intervals cut to 1 s) and
# rules.yml, while a short job runs. Then, through Prometheus' HTTP API:
#   - `promtool check config` and `promtool check rules` pass;
#   - every target is up, and the coordinator's series carry tessera_job, not exported_job;
#   - every rule is healthy; every recording rule has data, and so does every alert's
#     expression without its threshold (`SERIES > N`);
#   - every query of deploy/grafana/tessera-federation.json returns data ($tessera_job as .+,
#     $__rate_interval as 30s).
# Bound to 127.0.0.1 on ports the kernel picks. No timing is asserted.
#   prometheus_test.sh COORDINATOR_BIN WORKER_BIN CLI_BIN DEPLOY_DIR
set -euo pipefail
coordinator_bin=$1
worker_bin=$2
cli_bin=$3
deploy=$4
skip() { echo "SKIP: $*"; exit 77; }
command -v prometheus > /dev/null || skip "no prometheus (Debian's prometheus package; scripts/setup.sh installs it)"
command -v promtool > /dev/null || skip "no promtool (Debian's prometheus package)"
command -v jq > /dev/null || skip "no jq (scripts/setup.sh installs it)"
command -v curl > /dev/null || skip "no curl (scripts/setup.sh installs it)"
[ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] ||
  skip "the coordinator evaluates on Fashion-MNIST's test set (Debian's dataset-fashion-mnist), not installed"

# The help is read whole first: `grep -q` in a pipe stops reading at its match, and under
# pipefail the worker's SIGPIPE on its next write would read as "no such flag".
worker_help=$("$worker_bin" --help 2>&1) || true
grep -q -- --metrics-listen <<< "$worker_help" || skip "this build's tessera-worker has no --metrics-listen"

dir=$(mktemp -d "${TMPDIR:-/tmp}/prometheus-test.XXXXXX")
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${KEEP_TEST_DIR:-0}" = 1 ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do echo "--- $f"; tail -n 30 "$f"; done
  exit 1
}
# wait_for_line LOG PID SED_EXPRESSION WHAT: prints the first line's capture.
wait_for_line() {
  local found
  for _ in $(seq 1 300); do
    found=$(sed -n "$3" "$1" | head -n 1)
    if [ -n "$found" ]; then echo "$found"; return; fi
    kill -0 "$2" 2>/dev/null || fail "$(basename "$1" .log) exited before printing $4"
    sleep 0.1
  done
  fail "$(basename "$1" .log) did not print $4 within 30 s"
}
# listening_port PID: the TCP port PID listens on (its only listening socket), from /proc.
listening_port() {
  local inodes="" fd link
  for fd in /proc/"$1"/fd/*; do
    link=$(readlink "$fd" 2>/dev/null) || continue
    case $link in socket:\[*\]) inodes+=" ${link//[^0-9]/}" ;; esac
  done
  local local_address state inode
  # shellcheck disable=SC2034
  while read -r _ local_address _ state _ _ _ _ _ inode _; do
    [ "$state" = 0A ] || continue
    for i in $inodes; do
      if [ "$i" = "$inode" ]; then echo $((16#${local_address##*:})); return; fi
    done
  done < <(tail -n +2 /proc/net/tcp)
}

workers=(prom-a prom-b prom-c)
"$cli_bin" provision --out "$dir/pki" --coordinator-host 127.0.0.1 \
  --workers "$(IFS=,; echo "${workers[*]}")" --operators prometheus > "$dir/provision.log" 2>&1 ||
  fail "tessera provision failed"

export OPENBLAS_NUM_THREADS=1
"$coordinator_bin" --listen 127.0.0.1:0 --state-dir "$dir/state" --tls-dir "$dir/pki/coordinator" \
  --metrics-listen 127.0.0.1:0 > "$dir/coordinator.log" 2>&1 &
coordinator_pid=$!
pids+=("$coordinator_pid")
port=$(wait_for_line "$dir/coordinator.log" "$coordinator_pid" 's/^tessera-coordinator listening on port \([0-9]*\).*/\1/p' "its port")
metrics_url=$(wait_for_line "$dir/coordinator.log" "$coordinator_pid" 's/^dashboard and metrics at \(.*\)\/ and .*/\1/p' "its metrics URL")
echo "coordinator on port $port, metrics at $metrics_url/metrics"

declare -A worker_metrics
for w in "${workers[@]}"; do
  "$worker_bin" --coordinator "127.0.0.1:$port" --name "$w" --tls-dir "$dir/pki/workers/$w" \
    --metrics-listen 127.0.0.1:0 > "$dir/$w.log" 2>&1 &
  pids+=("$!")
  worker_metrics[$w]=$(wait_for_line "$dir/$w.log" "$!" 's/^metrics at http:\/\/\([^/]*\)\/metrics.*/\1/p' "its metrics address")
done

# deploy/prometheus as shipped, with this federation's targets and credentials beside it.
prom=$dir/prometheus
mkdir -p "$prom/tessera" "$prom/targets"
cp "$deploy/prometheus/prometheus.yml" "$deploy/prometheus/rules.yml" "$prom/"
cp "$dir/pki/operators/prometheus/"{ca.crt,tls.crt,tls.key} "$prom/tessera/"
echo "- targets: [\"${metrics_url#https://}\"]" > "$prom/targets/coordinator.yml"
: > "$prom/targets/workers.yml"
for w in "${workers[@]}"; do
  printf -- '- targets: ["%s"]\n  labels: {worker: %s}\n' "${worker_metrics[$w]}" "$w" >> "$prom/targets/workers.yml"
done
sed -i -e 's/^\(  scrape_interval:\).*/\1 1s/' -e 's/^\(  evaluation_interval:\).*/\1 1s/' "$prom/prometheus.yml"
grep -q '^  scrape_interval: 1s' "$prom/prometheus.yml" || fail "prometheus.yml: no global scrape_interval to shorten"
promtool check config "$prom/prometheus.yml" > "$dir/promtool.log" 2>&1 || fail "promtool check config"
promtool check rules "$prom/rules.yml" >> "$dir/promtool.log" 2>&1 || fail "promtool check rules"

prometheus --config.file="$prom/prometheus.yml" --storage.tsdb.path="$prom/data" \
  --web.listen-address=127.0.0.1:0 --storage.tsdb.retention.time=1h > "$dir/prometheus.log" 2>&1 &
prometheus_pid=$!
pids+=("$prometheus_pid")
prometheus_port=
for _ in $(seq 1 300); do
  prometheus_port=$(listening_port "$prometheus_pid")
  [ -n "$prometheus_port" ] && curl -fsS "http://127.0.0.1:$prometheus_port/-/ready" > /dev/null 2>&1 && break
  kill -0 "$prometheus_pid" 2>/dev/null || fail "prometheus exited"
  sleep 0.1
done
api="http://127.0.0.1:$prometheus_port/api/v1"
curl -fsS "http://127.0.0.1:$prometheus_port/-/ready" > /dev/null || fail "prometheus not ready within 30 s"
echo "prometheus on port $prometheus_port"

# results QUERY: how many series QUERY returns now.
results() {
  curl -fsS -G "$api/query" --data-urlencode "query=$1" | jq '.data.result | length'
}
# The rules and panels are checked once the job has run; a query that has nothing yet is
# asked again for a while (rules are evaluated every second).
has_data() {
  local n
  for _ in $(seq 1 20); do
    n=$(results "$1") || fail "query refused: $1"
    [ "$n" -gt 0 ] && return 0
    sleep 1
  done
  return 1
}

cat > "$dir/job.toml" <<'EOF'
name = "prometheus-test"
rounds = 6
round_deadline_s = 120
seed = 9

[model]
name = "mlp"
hidden = [32]

[data]
max_train_samples = 1500
max_test_samples = 500

[data.partition]
kind = "iid"
parties = 3

[train]
local_epochs = 1
batch_size = 32
learning_rate = 0.05
momentum = 0.9
EOF
operator=(--coordinator "127.0.0.1:$port" --tls-dir "$dir/pki/operators/prometheus")
# The job starts once the three workers are seated.
for _ in $(seq 1 300); do
  alive=$("$cli_bin" "${operator[@]}" workers 2>/dev/null | grep -c 'prom-' || true)
  [ "$alive" -ge 3 ] && break
  sleep 0.2
done
[ "$alive" -ge 3 ] || fail "the three workers did not join within 60 s"
job=$("$cli_bin" "${operator[@]}" submit "$dir/job.toml" 2> "$dir/submit.log") || fail "tessera submit failed"
echo "submitted $job"
timeout 180 "$cli_bin" "${operator[@]}" watch "$job" > "$dir/watch.log" 2>&1 || fail "tessera watch $job failed or timed out"
job_status=$("$cli_bin" "${operator[@]}" status "$job") || fail "tessera status $job failed"
grep -qi succeeded <<< "$job_status" || fail "job $job did not succeed"
# A few scrapes and rule evaluations after the last round: the four targets up (a loaded
# machine may take a while to scrape them first), then three more seconds.
up=
for _ in $(seq 1 60); do
  up=$(curl -fsS -G "$api/query" --data-urlencode 'query=up' | jq -r '.data.result[] | "\(.metric.job) \(.metric.instance) \(.value[1])"')
  [ "$(grep -c ' 1$' <<< "$up")" -eq 4 ] && break
  sleep 1
done
echo "$up"
[ "$(grep -c ' 1$' <<< "$up")" -eq 4 ] || fail "expected 4 targets up within 60 s (a coordinator, three workers): $up"
sleep 3
[ "$(results 'tessera_rounds_committed_total{tessera_job!=""}')" -gt 0 ] || fail "no tessera_rounds_committed_total with a tessera_job label"
[ "$(results '{exported_job!=""}')" -eq 0 ] || fail "series still carry exported_job: prometheus.yml's relabelling did not apply"

failures=()
checked=0
# Rules: healthy; recording rules with data; alerts' expressions, less their threshold, with data.
rules=$(curl -fsS "$api/rules" | jq -c '.data.groups[].rules[]')
[ -n "$rules" ] || fail "prometheus loaded no rules"
while IFS= read -r rule; do
  name=$(jq -r .name <<< "$rule")
  health=$(jq -r .health <<< "$rule")
  [ "$health" = ok ] || failures+=("rule $name: health $health: $(jq -r .lastError <<< "$rule")")
  if [ "$(jq -r .type <<< "$rule")" = recording ]; then
    query=$name
  else
    query=$(jq -r .query <<< "$rule" | sed -E 's/[[:space:]]*(>|<|>=|<=|==|!=)[[:space:]]*[-+0-9.e]+[[:space:]]*$//')
  fi
  checked=$((checked + 1))
  has_data "$query" || failures+=("rule $name: no data for $query")
done <<< "$rules"

# The Grafana dashboard's queries, with its variables as Grafana would fill them for "All".
while IFS= read -r expr; do
  query=${expr//\$tessera_job/.+}
  query=${query//\$__rate_interval/30s}
  checked=$((checked + 1))
  has_data "$query" || failures+=("grafana: no data for $expr")
done < <(jq -r '.. | objects | select(has("expr")) | .expr' "$deploy/grafana/tessera-federation.json")

if ((${#failures[@]})); then
  printf '  %s\n' "${failures[@]}"
  fail "${#failures[@]} of $checked queries failed"
fi
echo "PASS: $checked rule and dashboard queries return data"
