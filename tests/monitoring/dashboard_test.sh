#!/usr/bin/env bash
# Runs dashboard_test.mjs (the dashboard in headless chromium) where it can run: skipped, with
# the reason, without chromium, node, the npm packages scripts/setup.sh installs, or the
# Fashion-MNIST test set the coordinator evaluates on.
#   dashboard_test.sh COORDINATOR_BIN WORKER_BIN CLI_BIN SCREENSHOT_PNG
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
chromium=${CHROMIUM:-$(command -v chromium || true)}
[ -n "$chromium" ] || skip "no chromium (Debian's chromium package; scripts/setup.sh installs it)"
command -v node > /dev/null || skip "no node (Debian's nodejs package; scripts/setup.sh installs it)"
[ -e "$here/node_modules/puppeteer-core/package.json" ] ||
  skip "no $here/node_modules: scripts/setup.sh runs npm ci there"
[ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] ||
  skip "the coordinator evaluates on Fashion-MNIST's test set (Debian's dataset-fashion-mnist), not installed"
export CHROMIUM=$chromium
exec node "$here/dashboard_test.mjs" "$@"
