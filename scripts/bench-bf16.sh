#!/usr/bin/env bash
# bf16 weights (issue 20): lmcc --weights-dtype bf16 vs its fp32 libraries, PyTorch fp32 and PyTorch bf16
# autocast, side by side, and the bf16 error on every bundled model. Writes bench/results/<date>-bf16.md.
#   scripts/bench-bf16.sh [--threads K]      (about 6 minutes here once built)
# Uses the benchmark environment of scripts/bench.sh (made there on first use).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${LMCC_BENCH_VENV:-$HOME/.cache/lmcc-bench/venv}
if ! "$venv/bin/python" -c 'import torch, numpy' 2>/dev/null; then
  echo "bench-bf16.sh: installing torch and numpy into $venv (PyPI)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch numpy
fi
ninja -C "$root/build" lmcc model_bench kernel_bench >/dev/null
"$venv/bin/python" "$root/bench/bf16.py" "$@"
