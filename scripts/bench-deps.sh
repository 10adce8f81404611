#!/usr/bin/env bash
# Installs what the benchmarks need and the tests do not (OpenBLAS, which they compare against; perf, which
# profiles the report's gap entries), then builds the benchmark programs (build/bench/kernel_bench includes
# OpenBLAS when present).
# Usage: scripts/bench-deps.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! dpkg-query -W -f='${Status}\n' libopenblas-dev python3-venv linux-perf 2>/dev/null | grep -c "install ok installed" | grep -q 3; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libopenblas-dev python3-venv linux-perf >/dev/null
fi
"$root/scripts/setup.sh"
cmake "$root/build" >/dev/null
cmake --build "$root/build" --target kernel_bench model_bench lmcc
