#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang under ASan+UBSan into ./build-fuzz and
# runs each for SECONDS (default 60) over a copy of its seed corpus (tests/fuzz/corpus/<target>/),
# then prints per target: executions, final coverage (cov/ft), corpus size and crashes.
#   scripts/fuzz.sh [SECONDS]        build, then fuzz every target (or those in FUZZERS)
#   scripts/fuzz.sh --build          build only
#   scripts/fuzz.sh --write-corpus   rewrite the seed corpora with tests/fuzz/corpus_generator.cc
#                                    (keeping the found_* inputs)
# Environment: BUILD_DIR (default build-fuzz), JOBS (default 2), FUZZERS (targets to run, space
# separated; default all), PARALLEL (targets fuzzed at once, default 1), RUN_DIR (where the
# working corpora, logs and crash inputs go; default $BUILD_DIR/runs/<UTC time>).
# Exits non-zero when a target crashed; its inputs are in RUN_DIR/<target>/artifacts/.
# `ctest --test-dir build-fuzz` replays each seed corpus once, without fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_dir="${BUILD_DIR:-build-fuzz}"
jobs="${JOBS:-2}"
all_fuzzers="tensor_transfer_fuzzer update_envelope_fuzzer checkpoint_fuzzer idx_fuzzer dataset_fuzzer job_spec_toml_fuzzer job_spec_proto_fuzzer revocation_list_fuzzer http_head_fuzzer"
fuzzers="${FUZZERS:-$all_fuzzers}"
parallel="${PARALLEL:-1}"

mode=fuzz
seconds=60
case "${1:-}" in
  --build) mode=build ;;
  --write-corpus) mode=corpus ;;
  "") ;;
  *[!0-9]*) echo "usage: $0 [SECONDS | --build | --write-corpus]" >&2; exit 2 ;;
  *) seconds=$1 ;;
esac

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTESSERA_FUZZ=ON \
  -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF \
  -DTESSERA_WITH_CUDA=OFF -DTESSERA_WITH_NCCL=OFF >/dev/null
if [[ $mode == corpus ]]; then
  cmake --build "$build_dir" -j "$jobs" --target fuzz_corpus_generator
  # The generated seeds are rewritten; the inputs that once found a bug (found_*) stay.
  if [[ -d tests/fuzz/corpus ]]; then find tests/fuzz/corpus -type f ! -name 'found_*' -delete; fi
  "$build_dir/tests/fuzz/fuzz_corpus_generator" "$root" tests/fuzz/corpus
  exit 0
fi
# shellcheck disable=SC2086
cmake --build "$build_dir" -j "$jobs" --target $fuzzers
[[ $mode == build ]] && exit 0

run_dir="${RUN_DIR:-$build_dir/runs/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$run_dir"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

fuzz_one() {
  local target=$1 dir=$run_dir/$1
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -r "tests/fuzz/corpus/$target/." "$dir/corpus/"
  "$build_dir/tests/fuzz/$target" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1 || true
}

running=0
for target in $fuzzers; do
  echo "fuzzing $target for ${seconds}s (log: $run_dir/$target/log)"
  fuzz_one "$target" &
  running=$((running + 1))
  if (( running >= parallel )); then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
printf '\n%-24s %12s %8s %8s %8s %8s\n' target runs cov ft corpus crashes
for target in $fuzzers; do
  dir=$run_dir/$target
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$dir/log" | tail -1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corpus=$(find "$dir/corpus" -type f | wc -l)
  crashes=$(find "$dir/artifacts" -type f | wc -l)
  printf '%-24s %12s %8s %8s %8s %8s\n' "$target" "${runs:-?}" "${cov:-?}" "${ft:-?}" "$corpus" "$crashes"
  if (( crashes > 0 )) || ! grep -q '^Done [0-9]* runs' "$dir/log"; then
    failed=1
    echo "  $target: see $dir/log and $dir/artifacts/" >&2
  fi
done
exit "$failed"
