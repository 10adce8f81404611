#!/usr/bin/env bash
# bf16 weights (issue 20): lmcc --weights-dtype bf16 vs its fp32 libraries, PyTorch fp32 and PyTorch bf16
# autocast, side by side, and the bf16 error on every bundled model. Writes bench/results/<date>-bf16.md
# (<date>-bf16-b.md, ... when that day has one).
#   scripts/bench-bf16.sh [--threads K]      (about 6 minutes here once built)
# Uses the benchmark environment of scripts/bench.sh (made there on first use).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$root/scripts/bench-venv.sh" torch numpy)
ninja -C "$root/build" lmcc model_bench kernel_bench >/dev/null
"$venv/bin/python" "$root/bench/bf16.py" "$@"
