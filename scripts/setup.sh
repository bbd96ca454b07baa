#!/usr/bin/env bash
# Installs every build and run dependency of Tessera from Debian 12's archive.
# Idempotent: packages already present are left alone. Needs root (or sudo).
#
#   scripts/setup.sh            build, run and test dependencies
#   scripts/setup.sh --bench    also PyTorch on the CPU, for the comparison benchmarks
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev libopenblas-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev zlib1g-dev libssl-dev libcpp-httplib-dev
  libgloo-dev libopenmpi-dev openmpi-bin
  libxrt-dev
  dataset-fashion-mnist
  systemd
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
