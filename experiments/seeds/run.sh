#!/usr/bin/env bash
# The seeds' central claims at this machine's scale (issue 17): a uniLM, a biLM and a T-TA of the same size
# (3 layers, d 256, pre-norm, the T-TA paper's 29,530-piece vocabulary) trained identically (same corpus, seed,
# steps, batch budget, optimizer) on Debian's bible-kjv + fortunes, then STS-B, BLiMP and the cost per sentence.
#
#   experiments/seeds/run.sh [train|eval|all]      (default all; reruns everything from a fresh clone)
#
# Environment: WORK (default experiments/seeds/work, not committed), STEPS (600), THREADS (1 for training),
# BLIMP_PAIRS (pairs per BLiMP paradigm, default 1000 = all, as in results.md; about 30 minutes), EVAL_THREADS,
# MODELS (eval.sh: which models to evaluate), NO_SETUP=1 (lmcc already built).
# Writes logs/ (training logs and every evaluation's output) and results.md + plots beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
what=${1:-all}
[ -n "${NO_SETUP:-}" ] || "$root/scripts/setup.sh" >/dev/null
need=""
command -v bible >/dev/null || need="$need bible-kjv"
[ -d /usr/share/games/fortunes ] || need="$need fortunes"
if [ -n "$need" ]; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi
shared=${LMCC_SHARED_DATA:-$root/../shared/data}
work=${WORK:-$here/work}
logs="$here/logs"
steps=${STEPS:-600}
threads=${THREADS:-1}
mkdir -p "$work/bin" "$work/lib" "$logs"
# A private copy of the binary: a rebuild of build/ during the (long) run must not swap it under the script.
if [ "$what" != eval ] || [ ! -x "$work/bin/lmcc" ]; then
  cp "$root/build/lib/liblmrt.so" "$root/build/lib/lmrt.h" "$work/lib/"
  cp "$root/build/bin/lmcc" "$work/bin/lmcc.tmp" && mv "$work/bin/lmcc.tmp" "$work/bin/lmcc"
fi
lmcc="$work/bin/lmcc"
cp "$shared/tta/vocab-lower.sub-32k.txt" "$work/vocab.txt"
for fam in tta bilm unilm; do cp "$here/seeds_$fam.toml" "$work/"; done

if [ "$what" = train ] || [ "$what" = all ]; then
  "$root/scripts/kjv.sh" "$work/kjv.txt"
  python3 "$here/prep.py" "$work/kjv.txt" /usr/share/games/fortunes "$work/corpus.txt" | tee "$logs/data.txt"
  for fam in tta bilm unilm; do
    # --resume continues an interrupted run (and refuses one with other settings).
    "$lmcc" train "$work/seeds_$fam.toml" --data "$work/corpus.txt" -o "$work/run-$fam" --resume --steps "$steps" \
      --batch-tokens 2048 --threads "$threads" --log-every 25 --valid-every 100 --checkpoint-every 100 \
      > "$logs/train-$fam.json" 2> "$logs/train-$fam.log"
    cp "$work/run-$fam/log.jsonl" "$logs/train-$fam.jsonl"
    cp "$work/run-$fam/loss.png" "$here/loss-$fam.png"
  done
fi
if [ "$what" = eval ] || [ "$what" = all ]; then
  "$here/eval.sh"
fi
