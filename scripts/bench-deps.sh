#!/usr/bin/env bash
# Installs what the benchmarks compare against and the tests do not need (OpenBLAS), then
# reconfigures so build/bench/gemm_bench includes it. Usage: scripts/bench-deps.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! dpkg-query -W -f='${Status}' libopenblas-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libopenblas-dev >/dev/null
fi
"$root/scripts/setup.sh"
cmake "$root/build" >/dev/null
cmake --build "$root/build" --target gemm_bench
