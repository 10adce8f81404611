#!/usr/bin/env bash
# Trains examples/train/tta_kjv.toml (T-TA, the paper's vocabulary) on Debian's King James Bible with
# `lmcc train --data`, then scores a sentence and its scrambled version with the trained model.
#
#   examples/train/run.sh [WORK_DIR] [-- extra lmcc train flags, e.g. --steps 200]
#
# WORK_DIR (default build/examples/train) receives the text, the spec, and the run directory run/ (progress
# on the terminal, run/log.jsonl, run/loss.png, run/checkpoint-*/, run/final/weights.safetensors). Running
# the script again continues the run from its newest checkpoint (--resume); Ctrl-C stops it cleanly.
# The vocabulary is ../shared/data/tta/vocab-lower.sub-32k.txt beside this checkout (or $LMCC_SHARED_DATA/tta/);
# without it the script builds a vocabulary of the same size from the text with `lmcc vocab`, and says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$root/build/examples/train}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
"$root/scripts/setup.sh" >&2
bin="$root/build/bin"
mkdir -p "$work"
"$root/scripts/kjv.sh" "$work/kjv.txt"
shared=${LMCC_SHARED_DATA:-$root/../shared/data}
if [ -s "$shared/tta/vocab-lower.sub-32k.txt" ]; then
  cp "$shared/tta/vocab-lower.sub-32k.txt" "$work/vocab.txt"
  echo "vocabulary: $shared/tta/vocab-lower.sub-32k.txt (the T-TA paper's)"
else
  echo "vocabulary: $shared/tta not found; building 29,530 pieces from the text with lmcc vocab"
  "$bin/lmcc" vocab --corpus "$work/kjv.txt" --size 29530 --lowercase -o "$work/vocab.txt"
fi
cp "$root/examples/train/tta_kjv.toml" "$work/"
"$bin/lmcc" train "$work/tta_kjv.toml" --data "$work/kjv.txt" -o "$work/run" --resume --threads "$(nproc)" \
  --batch-tokens 1024 --log-every 25 --valid-every 100 --checkpoint-every 100 "$@"

printf '%s\n' "and the lord spake unto moses , saying" "unto and saying the spake , lord moses" > "$work/two.txt"
"$bin/lmcc" score "$work/tta_kjv.toml" --weights "$work/run/final/weights.safetensors" --text "$work/two.txt" \
  > "$work/two.jsonl"
paste -d '\t' "$work/two.txt" "$work/two.jsonl" |
  python3 -c 'import sys, json
for line in sys.stdin:
    text, result = line.rstrip("\n").split("\t")
    print("score %9.2f  %s" % (json.loads(result)["score"], text))'
