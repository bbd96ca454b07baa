#!/usr/bin/env bash
# gpu-check.sh: everything that needs an NVIDIA GPU, in one go (about 10 minutes on a 16-core
# machine with an H100/H200): configure build-gpu with CUDA and NCCL required, build the device
# tests, the collectives tests and bench_gpu, then run
#   device_tests                               (the cuda instances of the generic op suites)
#   collectives_tests --gtest_filter='*nccl*'  (NCCL on the GPU)
#   federation_tests --gtest_filter='*Cuda*'   (a site cohort training on the GPU through NCCL)
#   bench_gpu                                  (GEMM TFLOP/s, op errors vs the CPU, SimpleCNN)
# Everything goes under "${OUT:-gpu-results}/": one log per step and summary.txt.
# Usage: scripts/gpu-check.sh [build-dir]   (CUDA_ARCH=90 by default; TIMEOUT_S per step)
set -uo pipefail

cd "$(dirname "$0")/.."
BUILD="${1:-build-gpu}"
RESULTS="${OUT:-gpu-results}"
ARCH="${CUDA_ARCH:-90}"
STEP_TIMEOUT="${TIMEOUT_S:-300}"
mkdir -p "$RESULTS"
SUMMARY="$RESULTS/summary.txt"
: >"$SUMMARY"
START=$(date +%s)

note() { echo "$*" | tee -a "$SUMMARY"; }

# run NAME COMMAND...: runs with a timeout, logs to $RESULTS/NAME.log, notes the result.
run() {
  local name="$1"; shift
  local began=$(date +%s)
  timeout "$STEP_TIMEOUT" "$@" >"$RESULTS/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - began ))" "$*")"
  return $rc
}

note "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$RESULTS/nvidia-smi.txt" 2>&1
  note "gpu: $(head -1 "$RESULTS/nvidia-smi.txt")"
else
  note "gpu: nvidia-smi not found"
fi

run configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTESSERA_WITH_CUDA=ON -DTESSERA_WITH_NCCL=ON || {
  note "configure failed: see $RESULTS/configure.log"; exit 1; }
run build cmake --build "$BUILD" -j"$(nproc)" --target device_tests collectives_tests federation_tests bench_gpu || {
  note "build failed: see $RESULTS/build.log"; tail -30 "$RESULTS/build.log" >>"$SUMMARY"; exit 1; }

failed=0
run device_tests "$BUILD/tests/device/device_tests" || failed=1
run collectives_nccl "$BUILD/tests/collectives/collectives_tests" --gtest_filter='*nccl*' || failed=1
run cohort_cuda "$BUILD/tests/integration/federation_tests" --gtest_filter='*Cuda*' || failed=1
run bench_gpu "$BUILD/bench/bench_gpu" || failed=1

# What ran on the GPU and what was skipped, from the test logs.
for log in device_tests collectives_nccl cohort_cuda; do
  {
    echo "--- $log"
    grep -E '^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]' "$RESULTS/$log.log" | tail -6
    # gtest lists each skipped test once more at the end, without its time: count those lines.
    skipped=$(grep -iE '^\[  SKIPPED \] [^ ]*(cuda|nccl)[^ ]*$' "$RESULTS/$log.log" | wc -l)
    echo "    cuda/nccl instances skipped: $skipped"
    if [ "$skipped" -gt 0 ]; then
      echo "    WARNING: $skipped GPU instances did not run; their reasons:"
      grep -iE 'not viable' "$RESULTS/$log.log" | grep -iE 'cuda|nccl' | sort | uniq -c | sort -rn | head -5
    fi
  } >>"$SUMMARY"
done
echo "--- bench_gpu" >>"$SUMMARY"
cat "$RESULTS/bench_gpu.log" >>"$SUMMARY"
note "total $(( $(date +%s) - START ))s; $([ $failed = 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED')"
exit $failed
