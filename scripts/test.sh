#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite under ctest.
#   scripts/test.sh [ctest arguments...]
# Environment: SKIP_SETUP=1 to skip installing, BUILD_DIR (default build), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  echo "== setting up"
  scripts/setup.sh
fi
echo "== building"
scripts/build.sh
echo "== testing"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${JOBS:-2}" "$@"
