#!/usr/bin/env bash
# The evaluation half of run.sh (run.sh eval): STS-B, BLiMP and the cost per sentence of the three trained
# models, then results.md and the plots (report.py). Needs run.sh train's models in $WORK.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
shared=${LMCC_SHARED_DATA:-$root/../shared/data}
work=${WORK:-$here/work}
logs="$here/logs"
# Its own copy of the binary (training may still be running on work/bin's; a rebuild must not swap it).
mkdir -p "$work/eval/bin" "$work/eval/lib"
cp "$root/build/lib/liblmrt.so" "$root/build/lib/lmrt.h" "$work/eval/lib/"
cp "$root/build/bin/lmcc" "$work/eval/bin/lmcc.tmp" && mv "$work/eval/bin/lmcc.tmp" "$work/eval/bin/lmcc"
lmcc="$work/eval/bin/lmcc"
pairs=${BLIMP_PAIRS:-1000}
threads=${EVAL_THREADS:-$(nproc)}
spec() { echo "$work/seeds_$1.toml"; }
weights() { echo "$work/run-$1/final/weights.safetensors"; }
for m in tta bilm unilm; do [ -s "$(weights $m)" ] || { echo "eval: $(weights $m) missing: run run.sh train first" >&2; exit 1; }; done

# The biLM's embedding without mask-and-predict (one unmasked pass, mean-pooled): an encoder-only twin
# ([head] mlm = false: embed runs the encoder once) over the same weights minus the MLM head.
sed 's/^name = "seeds_bilm"/name = "seeds_bilm_plain"/; s/^\[tokenizer\]/[head]\nmlm = false\n\n[tokenizer]/' \
  "$work/seeds_bilm.toml" > "$work/seeds_bilm_plain.toml"
python3 "$here/strip_head.py" "$(weights bilm)" "$work/bilm_plain.safetensors"

echo "== STS-B (unsupervised: cosine of the two sentences' embeddings)"
for split in dev test; do
  for m in tta bilm bilm_plain unilm; do
    w=$(weights $m); [ $m = bilm_plain ] && w="$work/bilm_plain.safetensors"
    "$lmcc" sts "$(spec $m)" --weights "$w" --data "$shared/stsb/$split.tsv" --truncate --threads "$threads" \
      > "$logs/sts-$m-$split.json"
    echo "$m $split $(cat "$logs/sts-$m-$split.json")"
  done
done

echo "== BLiMP ($pairs pairs per paradigm)"
run_blimp() { # name spec weights [flags]
  local name=$1 s=$2 w=$3; shift 3
  local start=$(date +%s.%N)
  "$lmcc" blimp "$s" --weights "$w" --data "$shared/blimp" --max-pairs "$pairs" --truncate --threads "$threads" "$@" \
    > "$logs/blimp-$name.json"
  echo "$name $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["mean"], 4))' "$logs/blimp-$name.json") ($(python3 -c "print(round($(date +%s.%N) - $start))") s)"
}
run_blimp unilm "$(spec unilm)" "$(weights unilm)"
run_blimp tta "$(spec tta)" "$(weights tta)"
run_blimp bilm "$(spec bilm)" "$(weights bilm)"
run_blimp bilm-word-l2r "$(spec bilm)" "$(weights bilm)" --pll word-l2r
"$lmcc" blimp "$(spec tta)" --weights "$(weights tta)" --data "$shared/blimp" --max-pairs 1 --markdown \
  > "$logs/blimp-paper-models.md" # the BLiMP paper's models (models_summary.jsonl) for the table

echo "== cost per sentence: the first 400 first sentences of STS-B dev, one call, $threads threads"
tail -n +2 "$shared/stsb/dev.tsv" | cut -f8 | head -n 400 > "$work/cost.txt"
: > "$logs/cost.txt"
cost() { # name spec weights [flags]
  local name=$1 s=$2 w=$3; shift 3
  "$lmcc" score "$s" --weights "$w" --text "$work/cost.txt" --truncate --threads "$threads" --timing "$@" \
    2>&1 >/dev/null | sed "s/^/$name /" | tee -a "$logs/cost.txt"
}
cost tta "$(spec tta)" "$(weights tta)"
cost unilm "$(spec unilm)" "$(weights unilm)"
cost bilm-pll "$(spec bilm)" "$(weights bilm)"
cost bilm-pll-naive "$(spec bilm)" "$(weights bilm)" --naive
python3 "$here/report.py"
