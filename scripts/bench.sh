#!/usr/bin/env bash
# The benchmark suite: lmcc's generated libraries vs PyTorch and ONNX Runtime, against the machine's
# measured peak and bandwidth. Writes bench/results/<date>.md and PNG plots (bench/run.py says how).
#   scripts/bench.sh            the full grid (n 10..128, batch 1 and 32, 1 and 2 threads; 50-75 min: 74 on the
#                               2026-11-29 Xeon), then the training grid (scripts/bench-train.sh, about 15 min)
#   scripts/bench.sh --quick    n = 20, batch 1, 1 thread (under 3 minutes once built)
#   scripts/bench.sh --only RE  the grid's entries whose name matches RE (e.g. 'tta/opt/score/n:10/batch:1/'),
#                               machine limits only
#   scripts/bench.sh --no-train the full grid without the training grid that follows it (about 15 min less)
#   scripts/bench.sh --help     every option (bench/run.py's), before anything is installed
# Every kind of run writes bench/results/<date>.md (its title says the kind) when that file does not exist yet;
# otherwise <date>-quick.md, <date>-only.md or <date>-partial.md, then -b, -c, ... (a day's first report is kept).
# A run stopped before its end leaves its results so far in ~/.cache/lmcc-bench/work/raw[-quick|-only].json:
#   "$LMCC_BENCH_VENV"/bin/python bench/run.py --report-from ~/.cache/lmcc-bench/work/raw.json  (a partial report)
# Needs nothing the tests install: OpenBLAS (scripts/bench-deps.sh) and a virtual environment with the
# PyPI wheels of torch (CPU), onnxruntime, onnx, onnxscript and matplotlib ($LMCC_BENCH_VENV,
# default ~/.cache/lmcc-bench/venv), made here on first use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The arguments first, by run.py's own parser under the system python3 (it needs nothing from the venv): a wrong one
# stops here with the usage and status 2, before anything is installed, built or made; --help prints it and stops,
# and so does --check-args (the check alone).
for arg in "$@"; do
  case "$arg" in
    -h | --help) LMCC_BENCH_SCRIPT=1 exec python3 "$root/bench/run.py" --help ;;
    --check-args) LMCC_BENCH_SCRIPT=1 exec python3 "$root/bench/run.py" "$@" ;;
  esac
done
LMCC_BENCH_SCRIPT=1 python3 "$root/bench/run.py" --check-args "$@"
"$root/scripts/bench-deps.sh"
venv=$("$root/scripts/bench-venv.sh" torch onnxruntime onnx onnxscript numpy matplotlib)
args=() train=1
for arg in "$@"; do
  if [ "$arg" = --no-train ]; then train=0; else args+=("$arg"); fi
done
LMCC_BENCH_SCRIPT=1 LMCC_BENCH_NO_TRAIN=$((1 - train)) "$venv/bin/python" "$root/bench/run.py" "${args[@]}"
# The full grid also times training (issue 14): bench/results/<date>-train.md (scripts/bench-train.sh).
case " ${args[*]} " in
  *" --quick "* | *" --only "* | *" --only="*) ;;
  *) [ "$train" = 0 ] || "$root/scripts/bench-train.sh" --steps 5 ;;
esac
