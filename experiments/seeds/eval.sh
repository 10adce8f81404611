#!/usr/bin/env bash
# The evaluation half of run.sh (run.sh eval): STS-B, BLiMP and the cost per sentence of the three trained
# models, then results.md and the plots (report.py). Needs run.sh train's models in $WORK.
#   MODELS="tta bilm unilm" (default all) evaluates those only (report.py uses every log there is).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
shared=${LMCC_SHARED_DATA:-$root/../shared/data}
work=${WORK:-$here/work}
logs="$here/logs"
pairs=${BLIMP_PAIRS:-1000}
threads=${EVAL_THREADS:-$(nproc)}
models=${MODELS:-"tta bilm unilm"}
# Its own copy of the binary (training may still be running on work/bin's; a rebuild must not swap it).
eval_dir="$work/eval-$$"
mkdir -p "$eval_dir/bin" "$eval_dir/lib"
cp "$root/build/lib/liblmrt.so" "$root/build/lib/lmrt.h" "$eval_dir/lib/"
cp "$root/build/bin/lmcc" "$eval_dir/bin/lmcc"
trap 'rm -rf "$eval_dir"' EXIT
lmcc="$eval_dir/bin/lmcc"
spec() { echo "$work/seeds_$1.toml"; }
weights() { [ "$1" = bilm_plain ] && echo "$work/bilm_plain.safetensors" || echo "$work/run-$1/final/weights.safetensors"; }
for m in $models; do [ -s "$(weights $m)" ] || { echo "eval: $(weights $m) missing: run run.sh train first" >&2; exit 1; }; done
sed -n "2,401p" "$shared/stsb/dev.tsv" | cut -f8 > "$work/cost.txt"
touch "$logs/cost.txt"
"$lmcc" tokenize "$(spec tta)" --text "$work/cost.txt" --truncate | python3 -c '
import sys; n = [len(l.split()) for l in sys.stdin]; w = [len(l.split()) for l in open(sys.argv[1])]
print("%.1f words, %.1f pieces with [SOS]/[EOS] on average" % (sum(w) / len(w), sum(n) / len(n)))' "$work/cost.txt" \
  > "$logs/cost-input.txt"

sts() { # model
  for split in dev test; do
    "$lmcc" sts "$(spec $1)" --weights "$(weights $1)" --data "$shared/stsb/$split.tsv" --truncate --threads "$threads" \
      > "$logs/sts-$1-$split.json"
    echo "sts $1 $split $(cat "$logs/sts-$1-$split.json")"
  done
}
blimp() { # name model [flags]
  local name=$1 m=$2 start; shift 2
  start=$(date +%s)
  "$lmcc" blimp "$(spec $m)" --weights "$(weights $m)" --data "$shared/blimp" --max-pairs "$pairs" --truncate \
    --threads "$threads" "$@" > "$logs/blimp-$name.json"
  echo "blimp $name $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["mean"], 4))' \
    "$logs/blimp-$name.json") ($(( $(date +%s) - start )) s)"
}
cost() { # name model [flags]: the first 400 first sentences of STS-B dev in one call
  local name=$1 m=$2; shift 2
  grep -v "^$name " "$logs/cost.txt" > "$logs/cost.tmp" || true
  "$lmcc" score "$(spec $m)" --weights "$(weights $m)" --text "$work/cost.txt" --truncate --threads "$threads" \
    --timing "$@" 2>&1 >/dev/null | grep 'sentences in' | sed "s/^/$name /" >> "$logs/cost.tmp"
  mv "$logs/cost.tmp" "$logs/cost.txt"
  grep "^$name " "$logs/cost.txt"
}
for m in $models; do
  case $m in
  tta)
    sts tta; blimp tta tta; cost tta tta ;;
  unilm)
    sts unilm; blimp unilm unilm; cost unilm unilm ;;
  bilm)
    # The biLM's embedding without mask-and-predict (one unmasked pass, mean-pooled): an encoder-only twin
    # ([head] mlm = false: embed runs the encoder once) over the same weights minus the MLM head.
    sed 's/^name = "seeds_bilm"/name = "seeds_bilm_plain"/; s/^\[tokenizer\]/[head]\nmlm = false\n\n[tokenizer]/' \
      "$work/seeds_bilm.toml" > "$work/seeds_bilm_plain.toml"
    python3 "$here/strip_head.py" "$(weights bilm)" "$work/bilm_plain.safetensors"
    sts bilm; sts bilm_plain
    blimp bilm bilm; blimp bilm-word-l2r bilm --pll word-l2r
    cost bilm-pll bilm; cost bilm-pll-naive bilm --naive ;;
  esac
done
"$lmcc" blimp "$(spec tta)" --weights "$(weights tta)" --data "$shared/blimp" --max-pairs 1 --markdown \
  > "$logs/blimp-paper-models.md" # the BLiMP paper's models (models_summary.jsonl) for the table
python3 "$here/report.py"
