#!/usr/bin/env bash
# What serving metrics costs a round: the same load-generated job run with the coordinator's
# --metrics-listen port scraped every second (as a Prometheus would, /metrics with the admin
# token) and not scraped, alternating, each on a fresh coordinator. Prints each run's median
# round time and the ratio of the scraped medians to the unscraped ones.
#
#   bench/metrics_cost.sh [BUILD_DIR]          (default: build)
# Environment: ROW (model:N, default tiny:100), PAIRS (default 3), ROUNDS (default 60, the first
# WARMUP=2 left out), SCRAPE_S (default 1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/round_overhead_common.sh
. "$here/round_overhead_common.sh"
overhead_binaries "${1:-build}"
row=${ROW:-tiny:100}
pairs=${PAIRS:-3}
rounds=${ROUNDS:-60}
warmup=${WARMUP:-2}
scrape_s=${SCRAPE_S:-1}
model=${row%%:*}
n=${row##*:}
flags=$(model_flags "$model")
command -v curl >/dev/null || { echo "metrics_cost: needs curl" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-metrics-cost.XXXXXX")
coordinator_pid=
scraper_pid=
cleanup() {
  if [ -n "$scraper_pid" ]; then kill "$scraper_pid" 2>/dev/null || true; wait "$scraper_pid" 2>/dev/null || true; fi
  if [ -n "$coordinator_pid" ]; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1
export COORDINATOR_FLAGS="${COORDINATOR_FLAGS:-} --metrics-listen 127.0.0.1:0"

echo "== metrics cost: $row, $rounds rounds a run (medians of rounds $((warmup + 1))-$rounds), $pairs pairs," \
  "scraping every ${scrape_s} s; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %-12s %10s %9s %s\n' pair scraped round_ms scrapes metrics_bytes
declare -a off on
for pair in $(seq 1 "$pairs"); do
  for scraped in no yes; do
    start_coordinator
    url=
    for _ in $(seq 1 100); do
      url=$(sed -n 's|^dashboard and metrics at \(http://[^ ]*\)/ and.*|\1|p' "$row_dir/coordinator.log")
      [ -n "$url" ] && break
      sleep 0.1
    done
    [ -n "$url" ] || { echo "the coordinator did not say where its metrics are" >&2; cat "$row_dir/coordinator.log" >&2; exit 1; }
    scrapes=0
    bytes=0
    if [ "$scraped" = yes ]; then
      (
        count=0
        while :; do
          curl -sf -H "Authorization: Bearer $(cat "$admin_file")" "$url/metrics" -o "$row_dir/metrics.txt" && count=$((count + 1))
          echo "$count $(stat -c %s "$row_dir/metrics.txt" 2>/dev/null || echo 0)" > "$row_dir/scrapes"
          sleep "$scrape_s"
        done
      ) &
      scraper_pid=$!
    fi
    log="$row_dir/loadgen.log"
    # shellcheck disable=SC2086
    "$loadgen_bin" --coordinator "127.0.0.1:$coordinator_port" --join-token-file "$token_file" \
      --admin-token-file "$admin_file" --clients "$n" $flags --rounds "$rounds" --warmup "$warmup" \
      --max-test-samples 100 --timeout-s 300 > "$log" 2>&1 || { echo "loadgen failed:" >&2; tail -5 "$log" >&2; exit 1; }
    if [ -n "$scraper_pid" ]; then
      kill "$scraper_pid" 2>/dev/null || true
      wait "$scraper_pid" 2>/dev/null || true
      scraper_pid=
      read -r scrapes bytes < "$row_dir/scrapes" || true
    fi
    stop_coordinator
    round=$(field "$log" summary round_ms)
    printf '%-5s %-12s %10s %9s %s\n' "$pair" "$scraped" "$round" "$scrapes" "$bytes"
    if [ "$scraped" = yes ]; then on+=("$round"); else off+=("$round"); fi
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
m_off=$(median "${off[@]}")
m_on=$(median "${on[@]}")
awk -v a="$m_on" -v b="$m_off" 'BEGIN { printf "median round: scraped %.1f ms, not scraped %.1f ms, ratio %.3f\n", a, b, (b > 0 ? a / b : 0) }'
