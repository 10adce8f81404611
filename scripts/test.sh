#!/usr/bin/env bash
# Runs every test from nothing: installs what is missing, builds, then runs the
# GoogleTest suites and the lit tests through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cd "$root/build"
ctest --output-on-failure -j"$(nproc)"
