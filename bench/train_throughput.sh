#!/bin/sh
# SimpleCNN training throughput on one core: Tessera (bench_train_throughput) against PyTorch
# (bench/torch_simplecnn.py under Debian's /usr/bin/python3), same model, batch and optimiser.
#   bench/train_throughput.sh [BUILD_DIR]     (default: build)
# Environment: MODEL (simplecnn, the default, mcmahan-cnn or resnet8), STEPS (Tessera's timed steps).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
# The PyTorch peer: Debian's python3-torch, installed when missing.
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  "$here/../scripts/setup.sh"
fi
model=${MODEL:-simplecnn}
tessera=$(taskset -c 0 "$build/bench/bench_train_throughput" --threads 1 --model "$model" --steps "${STEPS:-300}")
torch=$(taskset -c 0 /usr/bin/python3 "$here/torch_simplecnn.py" --threads 1 --model "$model")
echo "$tessera"
echo "$torch"
t=$(echo "$tessera" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p')
p=$(echo "$torch" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p')
echo "ratio tessera/torch = $(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.2f", t / p }')"
