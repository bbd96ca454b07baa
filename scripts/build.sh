#!/usr/bin/env bash
# Configures and builds Tessera into ./build (Ninja, ccache when present, RelWithDebInfo).
#   scripts/build.sh [extra cmake arguments...]
# Environment: BUILD_DIR (default build), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
jobs="${JOBS:-2}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs"
