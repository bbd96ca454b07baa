#!/usr/bin/env bash
# Installs every build and run dependency of Tessera from Debian 12's archive.
# Idempotent: packages already present are left alone. Needs root (or sudo).
#
#   scripts/setup.sh            build, run and test dependencies (PyTorch, NumPy and ONNX on the
#                               CPU included: the export tests load exported models into PyTorch
#                               and check ONNX files, and the comparison benchmarks train with it),
#                               and clang with its libFuzzer runtime for scripts/fuzz.sh (clang
#                               only recommends the runtime, which --no-install-recommends skips)
# Then installs the dashboard test's npm packages (tests/monitoring, from its package-lock.json)
# so that nothing is fetched when the tests run.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev libopenblas-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libxxhash-dev
  libgtest-dev libgmock-dev zlib1g-dev libssl-dev libcpp-httplib-dev
  libgloo-dev libopenmpi-dev openmpi-bin
  libxrt-dev
  dataset-fashion-mnist
  systemd
  chromium prometheus jq curl strace xz-utils
  python3-numpy python3-torch python3-onnx libonnx-dev
  python3-sklearn
  clang libclang-rt-dev
)
# The dashboard test drives chromium with puppeteer-core under node. A node that already
# brings its own npm (a vendor's nodejs package) is kept: Debian's npm conflicts with it.
if ! command -v npm > /dev/null 2>&1; then
  packages+=(nodejs npm)
fi
if (($# > 0)); then
  echo "setup: unexpected argument '$1' (scripts/setup.sh takes none)" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm ci again only when the lock file changed since the last install.
monitoring=tests/monitoring
if [[ ! -e $monitoring/node_modules/.package-lock.json ||
      $monitoring/package-lock.json -nt $monitoring/node_modules/.package-lock.json ]]; then
  echo "setup: npm ci in $monitoring"
  (cd "$monitoring" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
fi
