#!/bin/sh
# Training throughput on one core: Tessera (bench_train_throughput) against PyTorch
# (bench/torch_simplecnn.py under Debian's /usr/bin/python3), same model, batch and optimiser.
#   bench/train_throughput.sh [BUILD_DIR]     (default: build)
# Environment: MODEL (simplecnn, the default, mcmahan-cnn or resnet8), STEPS (Tessera's timed
# steps), REPEATS (default 3): the two run alternately REPEATS times, each pinned to core 0,
# and the ratio is of the medians (the machine is shared: one run of either can be slowed).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
# The PyTorch peer: Debian's python3-torch, installed when missing.
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  "$here/../scripts/setup.sh"
fi
model=${MODEL:-simplecnn}
repeats=${REPEATS:-3}
rates_t=""
rates_p=""
i=0
while [ "$i" -lt "$repeats" ]; do
  tessera=$(taskset -c 0 "$build/bench/bench_train_throughput" --threads 1 --model "$model" --steps "${STEPS:-300}")
  torch=$(taskset -c 0 /usr/bin/python3 "$here/torch_simplecnn.py" --threads 1 --model "$model")
  echo "$tessera"
  echo "$torch"
  rates_t="$rates_t $(echo "$tessera" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p')"
  rates_p="$rates_p $(echo "$torch" | sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p')"
  i=$((i + 1))
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
t=$(median $rates_t)
p=$(median $rates_p)
echo "median samples/s: tessera $t, torch $p over $repeats runs each"
echo "ratio tessera/torch = $(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.2f", t / p }')"
