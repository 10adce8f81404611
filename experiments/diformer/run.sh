#!/usr/bin/env bash
# The Diformer experiment of issue 19 (experiments/diformer/README.md), one script:
#   run.sh train   synthetic data + `lmcc train` (directional objective, compiled trainer, 1 thread)
#   run.sh eval    `lmcc translate` (compiled) in every mode, with and without --rerank, BLEU (sacreBLEU) and
#                  batch-1 wall-clock per sentence, and the reference executor's decoding for comparison;
#                  writes results.md
#   run.sh         both
# Outputs go to experiments/diformer/out/ (not committed except results.md and the training log).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
lmcc=${LMCC:-$root/build/bin/lmcc}
out=$here/out
steps=${STEPS:-4500}
phase=${1:-all}
mkdir -p "$out"
export OMP_NUM_THREADS=1

if [ "$phase" = train ] || [ "$phase" = all ]; then
  /usr/bin/python3 "$here/make_data.py" "$out/data" 40000 32
  "$lmcc" train "$here/model.toml" --batches "$out/data/train.jsonl" -o "$out/model" --steps "$steps" \
    --save-every 250 --threads 1 > "$out/train.log"
  cp "$out/train.log" "$here/train.log"
fi

if [ "$phase" = eval ] || [ "$phase" = all ]; then
  venv=$root/experiments/.venv-sacrebleu
  [ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q sacrebleu==2.6.0; }
  head -n "${TEST_N:-200}" "$out/data/test.src" > "$out/test.src"
  head -n "${TEST_N:-200}" "$out/data/test.ref" > "$out/test.ref"
  for mode in l2r r2l mask-predict easy-first; do
    for rr in "" --rerank; do
      tag=$mode${rr:+-rerank}
      "$lmcc" translate "$here/model.toml" --weights "$out/model/weights.safetensors" --ids "$out/test.src" \
        --mode "$mode" --beam 4 --length-beam 5 --iterations 10 $rr > "$out/$tag.jsonl"
    done
  done
  # The same decoders on the reference executor (the numeric oracle), for the compiled-vs-reference comparison.
  for mode in l2r r2l mask-predict easy-first; do
    "$lmcc" translate "$here/model.toml" --weights "$out/model/weights.safetensors" --ids "$out/test.src" \
      --mode "$mode" --beam 4 --length-beam 5 --iterations 10 --reference > "$out/ref-$mode.jsonl"
  done
  # Cheaper NAR settings for the speed comparison: one length, 4 passes.
  for mode in mask-predict easy-first; do
    "$lmcc" translate "$here/model.toml" --weights "$out/model/weights.safetensors" --ids "$out/test.src" \
      --mode "$mode" --length-beam 1 --iterations 4 > "$out/$mode-fast.jsonl"
  done
  "$venv/bin/python" "$here/evaluate.py" "$out" "$here/results.md"
fi
