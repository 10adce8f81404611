#!/usr/bin/env bash
# The benchmarks' Python environment ($LMCC_BENCH_VENV, default ~/.cache/lmcc-bench/venv), made on first use
# with the PyPI wheels named (import names equal package names for all of them); the tests need none of it.
# Prints the environment's path:   venv=$("$root/scripts/bench-venv.sh" torch numpy)
set -euo pipefail
venv=${LMCC_BENCH_VENV:-$HOME/.cache/lmcc-bench/venv}
modules=$(IFS=,; echo "$*")
if ! "$venv/bin/python" -c "import $modules" 2>/dev/null; then
  echo "$(basename "$0"): installing $* into $venv (PyPI)" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q "$@" >&2
fi
echo "$venv"
