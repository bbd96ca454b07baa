#!/usr/bin/env bash
# gpu-check.sh: everything that needs an NVIDIA GPU, built on a development machine and run on
# a bare GPU machine in one short session (docs/DEVICES.md, "Running the GPU check").
#
#   scripts/gpu-check.sh pack [BUILD_DIR]  here: configure BUILD_DIR (default build-gpu) with
#        CUDA and NCCL required for sm_${CUDA_ARCH:-90}, build the GPU binaries, and pack them
#        into gpu-pack/ (gitignored): payload.tar.xz (the binaries and the backend modules
#        they load, libtessera_cuda.so and libtessera_nccl.so, without debug sections (the binaries
#        without symbols either), and the
#        shared libraries ldd says they need beyond a base system and the CUDA libraries a GPU
#        machine has), Fashion-MNIST, and a MANIFEST. Fails when the pack exceeds
#        PACK_LIMIT_MIB (60).
#   scripts/gpu-check.sh run  there, from gpu-pack/ (carried beside the working tree),
#        unpacked into UNPACK_DIR (/tmp/tessera-gpu-pack): a preflight that stops at the first
#        thing missing (the driver, CUDA, NCCL, a library), then the checks, within TOTAL_S
#        seconds (540) altogether.
#   scripts/gpu-check.sh dry [BUILD_DIR]  pack, then run's preflight here. Without a GPU that
#        ends "SKIPPED: no GPU", never a pass.
#
# The checks, in order (a later one is NOT RUN when the time is spent):
#   device    device_tests, every CUDA test but training: the generic op suites' cuda instances,
#             the backend's own contracts (name, pool, TF32 engaging, max pool determinism,
#             scratch exhaustion reported)
#   nccl      collectives_tests: the communicator suite on device buffers (every op, dtype and
#             reduce op) for as many ranks as there are GPUs, as threads and as forked
#             processes (each in a process of its own: CUDA is not fork-safe), the deadline
#             check (a rank that never arrives gives DEADLINE_EXCEEDED) and the
#             compute-then-allreduce ordering check
#   cohort    federation_tests: a one-member site cohort training a round on CUDA, its gradients
#             reduced on the GPU through NCCL, in a real coordinator and worker (in one
#             process); its output goes into nccl.log
#   sweep     bench_tests: every op on CUDA against the CPU at odd shapes, guarded buffers
#   training  device_tests: two epochs of SimpleCNN on CUDA and on the CPU from one seed
#   bench     bench_gpu --quick: GEMM against raw cuBLAS (>= 0.9x), op errors, samples/s
#   federation the demo (scripts/demo.sh): a coordinator (evaluating on the GPU) and ten
#             workers, all on this GPU (no fallback device), train examples/fmnist-fedavg.toml over mutual TLS; passes when
#             the demo ends well, every worker lists the GPU as its device, and the final test
#             accuracy is at least 85% (86.7% on the CPU)
#   memcheck  compute-sanitizer memcheck over the CUDA device tests
#   racecheck compute-sanitizer racecheck over the tests of the kernels using shared memory
# A gtest step fails when a test fails, when none ran, and when any was skipped: on a GPU
# machine a skipped CUDA or NCCL test proves nothing. A sanitizer step whose tool is not on the
# machine is UNAVAILABLE, and one that ran out of time having found nothing is INCOMPLETE:
# the verdict is then INCOMPLETE, not PASS.
#
# STEPS=device,nccl,... runs only the steps named (default: all nine), so one lease can be spent
# in two shorter calls; a name that is not a step is an error. The verdict of such a run names
# the steps it covered.
#
# CHECKS_WITHOUT_GPU=1 makes run go on past a preflight that found no GPU, to test this
# script itself: every step then fails on its skipped tests.
#
# Output: at most 8 files under ${OUT:-gpu-results}: summary.txt and one log per step
# (preflight, device, nccl, sweep, training, bench, sanitizer; the federation's output goes into
# training.log after the training tests). Exit status of run: 0 PASS,
# 1 FAIL, 3 SKIPPED (no GPU), 4 INCOMPLETE. pack: 0 when the pack is complete. dry: 0 when
# the pack is complete and the preflight ran to its verdict (SKIPPED without a GPU), else 1.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PACK="$ROOT/gpu-pack"
RUN_DIR="${UNPACK_DIR:-/tmp/tessera-gpu-pack}"  # where run unpacks bin/ and lib/
RESULTS="${OUT:-$ROOT/gpu-results}"
ARCH="${CUDA_ARCH:-90}"
PACK_LIMIT_MIB="${PACK_LIMIT_MIB:-60}"
TOTAL_S="${TOTAL_S:-540}"
ALL_STEPS="device,nccl,cohort,sweep,training,bench,federation,memcheck,racecheck"
STEPS="${STEPS:-$ALL_STEPS}"
BINARIES=(device_tests collectives_tests bench_tests bench_gpu gpu_preflight federation_tests)
# The federation step's: the demo (scripts/demo.sh) with its ten workers on the GPU.
FEDERATION_BINARIES=(tessera tessera-coordinator tessera-worker)
# The backends the binaries load on first use (base/backend_module.h): packed into lib/tessera,
# beside bin/ as an installed Tessera has them, and found there through TESSERA_MODULE_DIR.
MODULES=(tessera_cuda tessera_nccl)
# Libraries every machine that can run these binaries has (glibc, the compiler's runtime),
# and the CUDA libraries a GPU machine brings (cuBLAS alone is over 500 MiB): not packed.
SYSTEM_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libutil|libresolv|libanl|libgcc_s|libstdc\+\+)\.so'
CUDA_LIBS='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]+|libnvJitLink|libnvrtc)\.so'
FASHION_DIR=/usr/share/datasets/fashion-mnist

usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 1; }

# ---------------------------------------------------------------- pack (here)

build() {
  local build_dir="$1"
  echo "== configure $build_dir (CUDA and NCCL required, sm_$ARCH)"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DTESSERA_WITH_CUDA=ON -DTESSERA_WITH_NCCL=ON >"$RESULTS/configure.txt" 2>&1 || {
    tail -20 "$RESULTS/configure.txt"; echo "configure failed"; return 1; }
  echo "== build ${BINARIES[*]} ${FEDERATION_BINARIES[*]} ${MODULES[*]}"
  cmake --build "$build_dir" -j "${JOBS:-2}" --target "${BINARIES[@]}" "${FEDERATION_BINARIES[@]}" "${MODULES[@]}" >"$RESULTS/build.txt" 2>&1 || {
    grep -E 'error|FAILED' "$RESULTS/build.txt" | head -30; echo "build failed: see $RESULTS/build.txt"; return 1; }
}

where_built() {  # the path of binary $2 under build dir $1
  case "$2" in
    device_tests) echo "$1/tests/device/device_tests" ;;
    collectives_tests) echo "$1/tests/collectives/collectives_tests" ;;
    bench_tests) echo "$1/tests/bench/bench_tests" ;;
    federation_tests) echo "$1/tests/integration/federation_tests" ;;
    tessera) echo "$1/cli/tessera" ;;
    tessera-coordinator) echo "$1/server/tessera-coordinator" ;;
    tessera-worker) echo "$1/worker/tessera-worker" ;;
    *) echo "$1/bench/$2" ;;
  esac
}

pack() {
  local build_dir="${1:-build-gpu}"
  mkdir -p "$RESULTS"
  build "$build_dir" || return 1
  echo "== pack into gpu-pack/"
  rm -rf "$PACK"
  local stage="$PACK/stage"
  mkdir -p "$stage/bin" "$stage/lib/compiler" "$stage/lib/tessera" "$PACK/data/fashion-mnist"
  local binary path module
  for binary in "${BINARIES[@]}" "${FEDERATION_BINARIES[@]}"; do
    path="$(where_built "$build_dir" "$binary")"
    [ -x "$path" ] || { echo "missing $path"; return 1; }
    strip --strip-unneeded -o "$stage/bin/$binary" "$path" || return 1  # no symbols either: the pack must fit
  done
  for module in "${MODULES[@]}"; do
    path="$build_dir/lib/tessera/lib$module.so"
    [ -f "$path" ] || { echo "missing $path"; return 1; }
    strip --strip-debug -o "$stage/lib/tessera/lib$module.so" "$path" || return 1
  done
  # Every library ldd resolves that is neither the base system nor CUDA's.
  local name target
  while read -r name target; do
    if [[ "$name" =~ $SYSTEM_LIBS || "$name" =~ $CUDA_LIBS ]]; then continue; fi
    [ -e "$stage/lib/$name" ] || cp -L "$target" "$stage/lib/$name" || { echo "cannot copy $target"; return 1; }
  done < <(for object in "$stage"/bin/* "$stage"/lib/tessera/*.so; do ldd "$object"; done |
           awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u)
  strip --strip-unneeded "$stage"/lib/*.so* 2>/dev/null
  # The compiler's runtime, used there only when that machine's is older than this build needs.
  for name in libstdc++.so.6 libgcc_s.so.1; do
    target="$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')"
    if [ -n "$target" ]; then cp -L "$target" "$stage/lib/compiler/$name" || { echo "cannot copy $target"; return 1; }; fi
  done
  # Fashion-MNIST, from Debian's dataset-fashion-mnist.
  local data
  data="$(dpkg -L dataset-fashion-mnist 2>/dev/null | grep -E 'idx[13]-ubyte(\.gz)?$' || true)"
  [ -n "$data" ] || data="$(ls "$FASHION_DIR"/*-ubyte* 2>/dev/null || true)"
  [ -n "$data" ] || { echo "Fashion-MNIST not found (apt-get install dataset-fashion-mnist)"; return 1; }
  cp $data "$PACK/data/fashion-mnist/" || { echo "cannot copy Fashion-MNIST into $PACK/data"; return 1; }
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), build $build_dir, sm_$ARCH, $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'nvcc ?')"
    echo "nccl headers $(awk '/define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' /usr/local/cuda/include/nccl.h 2>/dev/null)"
    echo "expected on the GPU machine: $(for object in "$stage"/bin/* "$stage"/lib/tessera/*.so; do ldd "$object"; done |
      awk '{print $1}' | grep -E "$CUDA_LIBS" | sort -u | tr '\n' ' ')"
    echo "payload.tar.xz holds:"
    (cd "$stage" && find . -type f -printf '%10s  %p\n' | sort -k2)
  } >"$PACK/MANIFEST"
  # xz: half gzip's size (16 MiB against 31; OpenBLAS alone is 35 MiB before compression), and
  # the pack and the working tree travel within one 64 MiB. Unpacked with xz, or with Python's
  # lzma where a machine has no xz (unpack_payload).
  rm -f "$PACK/payload.tar.gz"
  tar -C "$stage" -cf - bin lib | xz -9 -T0 >"$PACK/payload.tar.xz" || return 1
  local binaries libraries modules
  binaries=$(find "$stage/bin" -type f | wc -l); libraries=$(find "$stage/lib" -maxdepth 1 -type f | wc -l)
  modules=$(find "$stage/lib/tessera" -type f | wc -l)
  rm -rf "$stage"
  local mib=$(( $(du -sb "$PACK" | cut -f1) / 1048576 ))
  echo "pack: $binaries binaries, $modules backend modules, $libraries libraries, Fashion-MNIST; ${mib} MiB (limit ${PACK_LIMIT_MIB})"
  echo "pack size ${mib} MiB" >>"$PACK/MANIFEST"
  if [ "$mib" -gt "$PACK_LIMIT_MIB" ]; then
    du -sh "$PACK"/* | sort -h
    echo "the pack is over ${PACK_LIMIT_MIB} MiB"; return 1
  fi
}

# ---------------------------------------------------------------- run (there)

# ---------------------------------------------------------------- run (there)

SUMMARY=""
START=$(date +%s)
VERDICT_FAILED=0
VERDICT_INCOMPLETE=0

note() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }

# Finds a directory holding library $1 on this machine; prints it.
find_library_dir() {
  local soname="$1" dir found
  found="$(ldconfig -p 2>/dev/null | awk -v n="$soname" '$1 == n { print $NF; exit }')"
  [ -n "$found" ] && { dirname "$found"; return 0; }
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
             /usr/local/cuda-*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 \
             /usr/local/nvidia/lib /usr/lib64; do
    [ -e "$dir/$soname" ] && { echo "$dir"; return 0; }
  done
  # Python's CUDA wheels (nvidia-cublas, nvidia-nccl-...) carry them too.
  local python_dirs
  python_dirs="$(python3 -c 'import nvidia, sys; print("\n".join(nvidia.__path__))' 2>/dev/null || true)"
  for dir in $python_dirs; do
    found="$(find "$dir" -maxdepth 4 -name "$soname" 2>/dev/null | head -1)"
    [ -n "$found" ] && { dirname "$found"; return 0; }
  done
  found="$(timeout 60 find /usr /opt /root -xdev -name "$soname" 2>/dev/null | head -1)"
  [ -n "$found" ] && { dirname "$found"; return 0; }
  return 1
}

# The packed binaries and the backend modules they load.
# Unpacks payload $1 into directory $2: with xz where the machine has it, else with Python's
# lzma module (a GPU machine's image may lack xz-utils but not Python).
unpack_payload() {
  if command -v xz >/dev/null; then
    tar -C "$2" -xJf "$1"
  else
    echo "== no xz here: unpacking with Python's lzma"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$1" "$2"
  fi
}

packed_objects() { ls "$RUN_DIR"/bin/* "$RUN_DIR"/lib/tessera/*.so 2>/dev/null; }

# Sets LD_LIBRARY_PATH so that every packed binary and module finds every library, and
# TESSERA_MODULE_DIR to the packed modules; false when a library is missing from this machine.
resolve_libraries() {
  export LD_LIBRARY_PATH="$RUN_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TESSERA_MODULE_DIR="$RUN_DIR/lib/tessera"
  echo "  backend modules from $TESSERA_MODULE_DIR: $(cd "$TESSERA_MODULE_DIR" 2>/dev/null && ls | tr '\n' ' ')"
  local missing soname dir ok=0
  missing="$(for b in $(packed_objects); do ldd "$b" 2>/dev/null; done | awk '/not found/ { print $1 }' | sort -u)"
  for soname in $missing; do
    if dir="$(find_library_dir "$soname")"; then
      echo "  $soname from $dir"
      case ":$LD_LIBRARY_PATH:" in *":$dir:"*) ;; *) export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dir" ;; esac
    else
      echo "  $soname: NOT FOUND on this machine"; ok=1
    fi
  done
  # A machine whose C++ runtime is older than this build's gets the packed one.
  # (Read whole before grep: `grep -q` stops at its match, and under pipefail the loop's SIGPIPE
  # on its next write would turn a match into "no match".)
  local linked
  linked="$(for b in $(packed_objects); do ldd "$b" 2>&1; done)"
  if grep -q "version .GLIBCXX\|version .GCC_" <<< "$linked"; then
    echo "  this machine's libstdc++ is older than the build's: using the packed one"
    export LD_LIBRARY_PATH="$RUN_DIR/lib/compiler:$LD_LIBRARY_PATH"
  fi
  local still
  still="$(for b in $(packed_objects); do ldd "$b" 2>&1; done | grep -E 'not found' | sort -u)"
  if [ -n "$still" ]; then echo "$still" | sed 's/^/  unresolved: /'; ok=1; fi
  return $ok
}

# gtest_counts LOG: "ran skipped failed" summed over every gtest run in LOG.
gtest_counts() {
  awk '/^\[==========\] [0-9]+ tests? from .* ran/ { ran += $2 }
       /^\[  SKIPPED \] [0-9]+ tests?, listed below/ { skipped += $4 }
       /^\[  FAILED  \] [0-9]+ tests?, listed below/ { failed += $4 }
       END { print ran + 0, skipped + 0, failed + 0 }' "$1"
}

# step NAME LOG CAP_S COMMAND...: runs COMMAND (appending to LOG) within min(CAP_S, the time
# left); sets STEP_RC and STEP_SECONDS. When too little time is left it runs nothing, notes
# NAME as NOT RUN and returns 1 (STEP_RC 125).
step() {
  local name="$1" log="$2" cap="$3"; shift 3
  local left=$(( TOTAL_S - $(elapsed) ))
  STEP_SECONDS=0
  if [ "$left" -lt 20 ]; then
    note "$(printf '%-10s %-11s %4ss  %s' "$name" 'NOT RUN' 0 "the time was spent ($(elapsed)s of ${TOTAL_S}s)")"
    VERDICT_INCOMPLETE=1; STEP_RC=125; return 1
  fi
  local limit=$(( cap < left ? cap : left ))
  local began=$(date +%s)
  echo "\$ $*   (limit ${limit}s)" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  STEP_RC=$?
  STEP_SECONDS=$(( $(date +%s) - began ))
  return 0
}

# judge NAME LOG KIND RC SECONDS: the step's line in the summary.
judge() {
  local name="$1" log="$2" kind="$3" rc="$4" seconds="$5" result detail=""
  if [ "$kind" = gtest ] || [ "$kind" = sanitizer ]; then
    read -r ran skipped failed < <(gtest_counts "$log")
    detail="$ran tests, $skipped skipped, $failed failed"
    if [ "$rc" -eq 0 ] && [ "$ran" -gt 0 ] && [ "$skipped" -eq 0 ] && [ "$failed" -eq 0 ]; then result=PASS; else result=FAIL; fi
    [ "$ran" -eq 0 ] && detail="$detail (no test ran)"
    if [ "$skipped" -gt 0 ]; then
      detail="$detail; skipped on a GPU machine: $(grep -E '^\[  SKIPPED \] [^ ]+$' "$log" | awk '{print $4}' | sort -u | head -3 | tr '\n' ' ')"
    fi
    if [ "$kind" = sanitizer ]; then
      local errors
      errors="$(grep -o 'ERROR SUMMARY: [0-9]* error' "$log" | awk '{s += $3} END {print s + 0}')"
      detail="$detail; sanitizer errors: $errors"
      [ "$errors" -gt 0 ] && result=FAIL
    fi
  else
    result=$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)
    detail="$(grep -v '^ *$' "$log" | tail -1)"
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    detail="$detail; TIMED OUT"
    # A sanitizer that found nothing before its time ran out proved nothing either way.
    local reports
    reports="$(grep -E '^=========' "$log")"
    if [ "$kind" = sanitizer ] && ! grep -q '^\[  FAILED  \]' "$log" &&
       ! grep -qvE 'COMPUTE-SANITIZER|ERROR SUMMARY: 0 |^=+ *$' <<< "$reports"; then
      result=INCOMPLETE; VERDICT_INCOMPLETE=1
    else
      result=FAIL
    fi
  fi
  [ "$result" = FAIL ] && VERDICT_FAILED=1
  note "$(printf '%-10s %-11s %4ss  rc=%-3s %s' "$name" "$result" "$seconds" "$rc" "$detail")"
}

selected() { [[ ",$STEPS," == *",$1,"* ]]; }

# Every name in STEPS is a step; prints the first one that is not.
check_steps() {
  local name
  for name in ${STEPS//,/ }; do
    [[ ",$ALL_STEPS," == *",$name,"* ]] || { echo "$name"; return 1; }
  done
  return 0
}

# appended_step NAME LOG CAP KIND HEADER COMMAND...: as run_gtest_step, but the step's output
# goes to the end of LOG (which other steps write too), under HEADER.
appended_step() {
  local name="$1" log="$2" cap="$3" kind="$4" header="$5"; shift 5
  local part
  part="$(mktemp)"
  echo "$header" >>"$part"
  step "$name" "$part" "$cap" "$@" && judge "$name" "$part" "$kind" "$STEP_RC" "$STEP_SECONDS"
  cat "$part" >>"$log"; rm -f "$part"
}

run_gtest_step() {  # NAME LOG CAP KIND COMMAND...
  local name="$1" log="$2" cap="$3" kind="$4"; shift 4
  : >"$log"
  step "$name" "$log" "$cap" "$@" && judge "$name" "$log" "$kind" "$STEP_RC" "$STEP_SECONDS"
}

find_sanitizer() {
  local candidate
  for candidate in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
                   /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
                   /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [ -n "$candidate" ] && [ -x "$candidate" ] && { echo "$candidate"; return 0; }
  done
  return 1
}

# preflight: fails fast. Returns 0 (GPU ready), 3 (no GPU) or 1.
preflight() {
  local log="$RESULTS/preflight.log"
  {
    echo "== pack"; cat "$PACK/MANIFEST" 2>/dev/null | head -5
    echo "== machine: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "== nvidia-smi"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1
    else
      echo "nvidia-smi not found"
    fi
  } >"$log" 2>&1
  local gpu
  gpu="$(grep -A1 '^== nvidia-smi' "$log" | tail -1)"
  note "gpu: $gpu"
  if [ ! -f "$PACK/payload.tar.xz" ]; then
    note "preflight  FAIL      no gpu-pack/payload.tar.xz here: run 'scripts/gpu-check.sh pack' and carry gpu-pack"
    return 1
  fi
  rm -rf "$RUN_DIR" && mkdir -p "$RUN_DIR" && unpack_payload "$PACK/payload.tar.xz" "$RUN_DIR" >>"$log" 2>&1 || {
    note "preflight  FAIL      cannot unpack gpu-pack/payload.tar.xz into $RUN_DIR (neither xz nor Python's lzma worked; see $log)"; return 1; }
  echo "== unpacked into $RUN_DIR" >>"$log"
  echo "== libraries" >>"$log"
  if ! resolve_libraries >>"$log" 2>&1; then
    note "preflight  FAIL      a library is missing on this machine:"; grep -E 'NOT FOUND|unresolved' "$log" | tee -a "$SUMMARY"
    return 1
  fi
  {
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for b in $(packed_objects); do ldd "$b"; done | grep -E "^\s*($(echo "$CUDA_LIBS" | sed 's/^\^//'))" |
      sed 's/ (0x[0-9a-f]*)$//' | sort -u
  } >>"$log" 2>&1
  # Fashion-MNIST where the tests and bench_gpu look for it.
  if ! ls "$FASHION_DIR"/train-images-idx3-ubyte* >/dev/null 2>&1; then
    mkdir -p "$FASHION_DIR" 2>/dev/null && cp "$PACK"/data/fashion-mnist/* "$FASHION_DIR"/ 2>/dev/null &&
      echo "== Fashion-MNIST installed into $FASHION_DIR" >>"$log" ||
      echo "== Fashion-MNIST could NOT be installed into $FASHION_DIR" >>"$log"
  fi
  echo "== gpu_preflight" >>"$log"
  timeout 120 "$RUN_DIR/bin/gpu_preflight" >>"$log" 2>&1
  local rc=$?
  local said
  said="$(grep '^preflight: ' "$log" | tail -1)"
  local versions
  versions="$(grep -E '^(CUDA runtime of this build|CUDA driver|NCCL|cuBLAS):' "$log" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
  [ -n "$versions" ] && note "$versions"
  case $rc in
    0) note "$(printf '%-10s %-11s %4ss  %s' preflight PASS "$(elapsed)" "${said#preflight: }")"; return 0 ;;
    2) note "$(printf '%-10s %-11s %4ss  %s' preflight SKIPPED "$(elapsed)" "${said#preflight: }")"; return 3 ;;
    *) note "$(printf '%-10s %-11s %4ss  rc=%s %s' preflight FAIL "$(elapsed)" "$rc" "${said:-(no verdict; see preflight.log)}")"
       tail -5 "$log" >>"$SUMMARY"; return 1 ;;
  esac
}

run_checks() {
  local bin="$RUN_DIR/bin" gpus
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  [ "${gpus:-0}" -ge 1 ] || gpus=1
  local max_ranks=$(( gpus < 5 ? gpus : 5 ))
  local cuda_tests='*cuda*:*Cuda*-CudaTrainingTest.*'

  selected device && run_gtest_step device "$RESULTS/device.log" 150 gtest "$bin/device_tests" --gtest_filter="$cuda_tests"

  # NCCL: thread ranks and the NCCL tests in one process, then forked ranks, each size in a
  # process that has not initialised CUDA.
  local log="$RESULTS/nccl.log" filter="Nccl*" ranks rc=0 seconds=0
  : >"$log"
  for ranks in $(seq 1 "$max_ranks"); do filter="$filter:*nccl_threads_${ranks}ranks*"; done
  if selected nccl && step nccl "$log" 150 "$bin/collectives_tests" --gtest_filter="$filter"; then
    rc=$STEP_RC; seconds=$STEP_SECONDS
    for ranks in $(seq 1 "$max_ranks"); do
      step nccl "$log" 90 "$bin/collectives_tests" --gtest_filter="*nccl_processes_${ranks}ranks*" || break
      [ "$STEP_RC" -ne 0 ] && rc=$STEP_RC; seconds=$(( seconds + STEP_SECONDS ))
    done
    judge nccl "$log" gtest "$rc" "$seconds"
  fi

  # A cohort on the GPU: the worker's NCCL path inside a federated round. Appended to nccl.log.
  selected cohort && appended_step cohort "$RESULTS/nccl.log" 120 gtest "== cohort" \
    "$bin/federation_tests" --gtest_filter='CohortTest.AOneMemberCohortOnCuda*'

  selected sweep && run_gtest_step sweep "$RESULTS/sweep.log" 180 gtest "$bin/bench_tests" --gtest_filter='*cuda*'
  selected training &&
    run_gtest_step training "$RESULTS/training.log" 150 gtest "$bin/device_tests" --gtest_filter='CudaTrainingTest.*'

  log="$RESULTS/bench.log"; : >"$log"
  selected bench && step bench "$log" 180 "$bin/bench_gpu" --quick && judge bench "$log" plain "$STEP_RC" "$STEP_SECONDS"

  selected federation && federation "$RESULTS/training.log"

  # The sanitizers. memcheck: every CUDA device test but training (minutes under the tool),
  # TF32 (a 1024^3 GEMM checked for its numbers only) and the two that exhaust device memory
  # on purpose (their failed cudaMalloc calls would read as errors). racecheck looks at shared
  # memory only: the tests of the kernels that use it (the block reductions).
  local sanitizer tool filter
  log="$RESULTS/sanitizer.log"; : >"$log"
  if ! selected memcheck && ! selected racecheck; then
    :
  elif sanitizer="$(find_sanitizer)"; then
    for tool in memcheck racecheck; do
      selected "$tool" || continue
      if [ "$tool" = memcheck ]; then
        filter='*cuda*:*Cuda*-CudaTrainingTest.*:*ShortOfScratch*:*OutOfMemory*:*Tf32*'
      else
        filter='*cuda_bias_grad*:*cuda_softmax*:*cuda_reduce_sum*:*cuda_conv2d_backward_filter*:*BiasAdd*/cuda:*Softmax*/cuda:*ReduceSum*/cuda:*CopyToHostWaits*'
      fi
      appended_step "$tool" "$log" 200 sanitizer "== $sanitizer --tool $tool" "$sanitizer" --tool "$tool" \
        --error-exitcode 99 --print-limit 20 "$bin/device_tests" --gtest_filter="$filter"
    done
  else
    echo "compute-sanitizer not found on this machine (looked on PATH, under /usr/local/cuda* and /opt/nvidia)" >>"$log"
    for tool in memcheck racecheck; do
      selected "$tool" && note "$(printf '%-10s %-11s %4ss  %s' "$tool" UNAVAILABLE 0 'compute-sanitizer is not on this machine')"
    done
    VERDICT_INCOMPLETE=1
  fi
}

# The demo with its ten workers on this GPU, the binaries in the layout scripts/demo.sh runs
# from a build directory, its state in a fresh directory. Appends to LOG (the training log).
federation() {
  local log="$1" layout="$RUN_DIR/federation"
  rm -rf "$layout" && mkdir -p "$layout/build/server" "$layout/build/worker" "$layout/build/cli"
  ln -s "$RUN_DIR/bin/tessera-coordinator" "$layout/build/server/tessera-coordinator"
  ln -s "$RUN_DIR/bin/tessera-worker" "$layout/build/worker/tessera-worker"
  ln -s "$RUN_DIR/bin/tessera" "$layout/build/cli/tessera"
  echo "== federation: scripts/demo.sh, ten workers with --device cuda and no fallback, the coordinator evaluating on the GPU" >>"$log"
  step federation "$log" 240 env SKIP_SETUP=1 SKIP_BUILD=1 BUILD_DIR="$layout/build" STATE_DIR="$layout/state" \
    DEVICE=cuda FALLBACK_DEVICE= EVAL_DEVICE=cuda "$ROOT/scripts/demo.sh" || return
  local rc=$STEP_RC accuracy on_gpu on_cpu result detail
  accuracy="$(grep -o 'final test accuracy: [0-9.]*%' "$log" | tail -1 | grep -o '[0-9.]*' | head -1)"
  on_gpu="$(grep -cE '^worker-[0-9]+ +yes .*NVIDIA' "$log")"
  on_cpu="$(grep -cE '^worker-[0-9]+ +yes .*cpu \(' "$log")"
  detail="final accuracy ${accuracy:-none}; $on_gpu workers on the GPU, $on_cpu on the CPU"
  if [ "$rc" -eq 0 ] && [ -n "$accuracy" ] && [ "$on_gpu" -eq 10 ] && [ "$on_cpu" -eq 0 ] &&
     awk -v a="$accuracy" 'BEGIN { exit !(a >= 85) }'; then
    result=PASS
  else
    result=FAIL; VERDICT_FAILED=1
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && detail="$detail; TIMED OUT"
    # What the coordinator and a worker said, for the failure.
    { echo "== coordinator log (tail)"; tail -20 "$layout/state/logs/coordinator.log"
      echo "== worker-01 log (tail)"; tail -20 "$layout/state/logs/worker-01.log"; } >>"$log" 2>&1
  fi
  note "$(printf '%-10s %-11s %4ss  rc=%-3s %s' federation "$result" "$STEP_SECONDS" "$rc" "$detail")"
}

# The figures worth reading without opening the logs.
highlights() {
  {
    echo "--- training (two epochs, one seed)"
    grep -hE '^(cuda|cpu)(, initial weights moved by one ulp)?: mean training loss|^cuda against cpu:' \
      "$RESULTS/training.log" 2>/dev/null
    echo "--- federation (the demo's job, ten workers on the GPU)"
    sed -n '/^round accuracy/,/^final test accuracy/p' "$RESULTS/training.log" 2>/dev/null | grep -v '^  round' | head -14
    grep -A13 '^round latency by phase' "$RESULTS/training.log" 2>/dev/null
    echo "--- bench_gpu --quick"
    sed -n '/^bench_gpu on/,$p' "$RESULTS/bench.log" 2>/dev/null | grep -vE '^\$ ' | head -60
    echo "--- failures"
    grep -hE '^\[  FAILED  \] [^ ]+' "$RESULTS"/device.log "$RESULTS"/nccl.log "$RESULTS"/sweep.log \
      "$RESULTS"/training.log "$RESULTS"/sanitizer.log 2>/dev/null | sort -u | head -20
    grep -h -B1 -A3 'Failure$' "$RESULTS"/*.log 2>/dev/null | head -40
  } >>"$SUMMARY"
}

run() {
  local mode="${1:-full}"  # full, or preflight (dry)
  local unknown
  if ! unknown="$(check_steps)"; then
    echo "STEPS: '${unknown:0:40}' is not a step; expected a comma-separated list of $ALL_STEPS" >&2
    return 1
  fi
  mkdir -p "$RESULTS"
  SUMMARY="$RESULTS/summary.txt"
  : >"$SUMMARY"
  START=$(date +%s)
  note "gpu-check $mode $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n); $(head -1 "$PACK/MANIFEST" 2>/dev/null || echo 'no pack')"
  preflight
  local rc=$?
  if [ $rc -eq 3 ] && [ "$mode" = full ] && [ "${CHECKS_WITHOUT_GPU:-0}" = 1 ]; then
    note "CHECKS_WITHOUT_GPU=1: running the checks without a GPU (for testing this script; they cannot pass)"
  elif [ $rc -eq 3 ]; then
    note "verdict: SKIPPED: no GPU here; nothing was checked on a GPU$([ "$mode" = preflight ] && echo ' (dry run: build, pack and preflight only)')"
    return 3
  fi
  if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then note "verdict: FAIL (preflight)"; return 1; fi
  if [ "$mode" = preflight ]; then
    note "verdict: PREFLIGHT PASSED; the checks were not run (dry run)"
    return 0
  fi
  run_checks
  highlights
  note "total $(elapsed)s of ${TOTAL_S}s; steps: $STEPS"
  if [ $VERDICT_FAILED -ne 0 ]; then note "verdict: FAIL"; return 1; fi
  if [ $VERDICT_INCOMPLETE -ne 0 ]; then note "verdict: INCOMPLETE (no step failed, but not every step ran)"; return 4; fi
  if [ "$STEPS" != "$ALL_STEPS" ]; then note "verdict: PASS (of the steps $STEPS only)"; else note "verdict: PASS"; fi
  return 0
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run full ;;
  dry)
    shift
    pack "$@" || exit 1
    run preflight
    rc=$?
    # A dry run has done its job when the preflight ran: SKIPPED without a GPU, PASS with one.
    [ $rc -eq 3 ] || [ $rc -eq 0 ] && exit 0
    exit 1 ;;
  *) usage ;;
esac
