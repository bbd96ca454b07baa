#!/usr/bin/env bash
# Writes the Wisconsin diagnostic breast cancer data (569 samples, 30 features, 2 classes; as
# Debian's python3-sklearn ships it) as the csv dataset examples/breast-cancer-csv.toml trains
# on: DIR/train.csv (456 rows) and DIR/test.csv (every fifth sample, 113 rows), with a header
# row and the label in the column "diagnosis" (0 malignant, 1 benign).
#   scripts/prepare-breast-cancer.sh [DIR]      (default: ./data/breast-cancer)
# Environment: SOURCE (default: python3-sklearn's breast_cancer.csv).
set -euo pipefail
out="${1:-data/breast-cancer}"
src="${SOURCE:-/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv}"
if [[ ! -r "$src" ]]; then
  echo "prepare-breast-cancer: $src not found; install python3-sklearn (scripts/setup.sh does) or set SOURCE" >&2
  exit 1
fi
mkdir -p "$out"
header="radius_mean,texture_mean,perimeter_mean,area_mean,smoothness_mean,compactness_mean,concavity_mean,\
concave_points_mean,symmetry_mean,fractal_dimension_mean,radius_se,texture_se,perimeter_se,area_se,smoothness_se,\
compactness_se,concavity_se,concave_points_se,symmetry_se,fractal_dimension_se,radius_worst,texture_worst,\
perimeter_worst,area_worst,smoothness_worst,compactness_worst,concavity_worst,concave_points_worst,symmetry_worst,\
fractal_dimension_worst,diagnosis"
# The first line is sklearn's own ("569,30,malignant,benign"); each other is 30 features and the label.
awk -v header="$header" -v train="$out/train.csv" -v test="$out/test.csv" -F, '
  NR == 1 { if ($1 != 569 || $2 != 30) { print "unexpected first line: " $0 > "/dev/stderr"; exit 1 }
            print header > train; print header > test; next }
  NF != 31 { print "line " NR ": expected 31 fields, got " NF > "/dev/stderr"; exit 1 }
  { if ((NR - 2) % 5 == 4) print > test; else print > train }' "$src"
echo "wrote $out/train.csv ($(($(wc -l <"$out/train.csv") - 1)) rows) and $out/test.csv ($(($(wc -l <"$out/test.csv") - 1)) rows)"
