#!/usr/bin/env bash
# Installs what the benchmarks compare against and the tests do not need (OpenBLAS), then
# builds the benchmark programs (build/bench/kernel_bench includes OpenBLAS when present).
# Usage: scripts/bench-deps.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! dpkg-query -W -f='${Status}' libopenblas-dev python3-venv 2>/dev/null | grep -c "install ok installed" | grep -q 2; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libopenblas-dev python3-venv >/dev/null
fi
"$root/scripts/setup.sh"
cmake "$root/build" >/dev/null
cmake --build "$root/build" --target kernel_bench model_bench lmcc
