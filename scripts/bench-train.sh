#!/usr/bin/env bash
# The training benchmark (issue 14): lmcc's compiled train step (build/bench/train_bench) vs PyTorch eager
# (bench/train_peers.py) at the T-TA paper config for tta_base / bilm_base / unilm_base, batch 32 x n 64 and
# 8 x n 128, 1 and 2 threads. Writes bench/results/<date>-train.md and -train.jsonl (bench/train_grid.py).
#   scripts/bench-train.sh                       the full grid (5 timed steps per entry, 3 alternating lmcc / torch rounds; ~20 min)
#   scripts/bench-train.sh --steps 5 --threads 1 --models unilm_base --shapes 8x128   any part of it
#   scripts/bench-train.sh --rounds 1             one lmcc / torch pair per entry (the grids before 2026-12-04-e)
# Builds lmcc, liblmrt and train_bench; needs the virtual environment with the PyPI torch wheel that
# scripts/bench.sh makes ($LMCC_BENCH_VENV, default ~/.cache/lmcc-bench/venv; made here if missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$root/scripts/bench-venv.sh" torch numpy)
[ -f "$root/build/build.ninja" ] || "$root/scripts/setup.sh"
ninja -C "$root/build" -j2 bin/lmcc lib/liblmrt.so train_bench >/dev/null
exec "$venv/bin/python" "$root/bench/train_grid.py" "$@"
