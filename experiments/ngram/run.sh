#!/usr/bin/env bash
# The ngram-wdr paper's Table 1 at this machine's scale (issue 18): word-level KJV (Debian bible-kjv, ~0.8M
# words, 10k vocabulary), a 2-layer d 256 causal Transformer trained as the plain CLM, as Sim (n-gram heads,
# wdr = false) and as WDR, N = 2 and 3, each with dropout 0.1 and label smoothing 0.1; the checkpoint with the
# lowest validation perplexity (main head, lambda = 0) of SEGMENTS checkpoints is scored on the test verses
# with lambda in {0, 0.2, 0.4, 0.6}. Reruns from a fresh clone (builds lmcc, installs bible-kjv); one thread.
# Writes logs/ (training and validation logs) and results.md + ppl.svg beside this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[ -n "${NO_SETUP:-}" ] || "$root/scripts/setup.sh" >/dev/null  # NO_SETUP=1: lmcc is already built
command -v bible >/dev/null || { SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo;
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bible-kjv >/dev/null; }
work=${WORK:-$here/work}
logs="$here/logs"
mkdir -p "$work"
# A private copy of the binary: a rebuild of build/ during the (long) run must not swap it under the script.
# (lmcc finds liblmrt.so and lmrt.h in ../lib beside itself.)
mkdir -p "$work/bin" "$work/lib"
cp "$root/build/lib/liblmrt.so" "$root/build/lib/lmrt.h" "$work/lib/"
cp "$root/build/bin/lmcc" "$work/bin/lmcc.tmp" && mv "$work/bin/lmcc.tmp" "$work/bin/lmcc"
lmcc="$work/bin/lmcc"
segment=${SEGMENT:-120}     # optimizer steps between validations (120 x 3: the logs and results.md)
segments=${SEGMENTS:-3}     # validations (the schedule spans segment * segments steps)
batch=${BATCH:-24}          # sentences per batch
models=${MODELS:-"plain sim2 wdr2 sim3 wdr3"}  # MODELS="wdr3 sim3" WORK=... runs a subset (in parallel)
mkdir -p "$work" "$logs"
touch "$logs/test.txt" # the test lines of the models this run trains are replaced
for m in $models; do grep -v "^$m " "$logs/test.txt" > "$logs/test.tmp" || true; mv "$logs/test.tmp" "$logs/test.txt"; done

bible -l100000 "gen1:1-rev22:21" > "$work/kjv.txt"
python3 "$here/prep.py" "$work/kjv.txt" "$work" | tee "$logs/data.txt"
"$lmcc" vocab --word-level --size 10000 --lowercase --corpus "$work/train.txt" -o "$work/vocab.txt"

spec() { # name family n wdr
  cat <<SPEC
name = "kjv_$1"
family = "$2"

[dims]
vocab = 10000
max_len = 64
d_model = 256
heads = 4
d_ff = 1024
layers = 2

[block]
norm = "pre"

[head]
transform = false

[score]
skip_special = false

[tokenizer]
vocab = "vocab.txt"
lowercase = true

[train]
lr = 1e-3
warmup_steps = $((segment * segments / 10))
steps = $((segment * segments))
dropout = 0.1
label_smoothing = 0.1
SPEC
  if [ "$2" = ngram ]; then printf '\n[ngram]\nn = %s\nwdr = %s\nensemble_lambda = 0.4\n' "$3" "$4"; fi
}

spec plain unilm > "$work/plain.toml"
for part in train valid test; do
  "$lmcc" tokenize "$work/plain.toml" --text "$work/$part.txt" --truncate > "$work/$part.ids"
done
python3 "$here/batches.py" "$work/train.ids" "$work/train.jsonl" "$batch"
echo "batches of $batch: $(wc -l < "$work/train.jsonl")" >> "$logs/data.txt"

for m in $models; do
  case $m in
    plain) spec plain unilm > "$work/$m.toml" ;;
    sim2) spec $m ngram 2 false > "$work/$m.toml" ;;
    sim3) spec $m ngram 3 false > "$work/$m.toml" ;;
    wdr2) spec $m ngram 2 true > "$work/$m.toml" ;;
    wdr3) spec $m ngram 3 true > "$work/$m.toml" ;;
  esac
  lambda0=; [ $m = plain ] || lambda0="--lambda 0"
  "$lmcc" init "$work/$m.toml" --seed 1 -o "$work/$m-init.safetensors"
  : > "$logs/$m-train.jsonl"; : > "$logs/$m-valid.txt"
  best=; bestppl=
  for s in $(seq 1 "$segments"); do
    from="--weights $work/$m-init.safetensors"; [ "$s" = 1 ] || from="--resume $work/$m-seg$((s - 1))"
    start=$(date +%s)
    "$lmcc" train "$work/$m.toml" $from --batches "$work/train.jsonl" --steps "$segment" -o "$work/$m-seg$s" \
      --threads 1 >> "$logs/$m-train.jsonl"
    "$lmcc" score "$work/$m.toml" --weights "$work/$m-seg$s/weights.safetensors" --ids "$work/valid.ids" \
      --threads 1 $lambda0 > "$work/$m-valid-$s.jsonl"
    ppl=$(python3 "$here/ppl.py" "$work/$m-valid-$s.jsonl")
    echo "step $((s * segment)) valid_ppl $ppl seconds $(( $(date +%s) - start ))" | tee -a "$logs/$m-valid.txt"
    if [ -z "$bestppl" ] || python3 -c "import sys; sys.exit(not $ppl < $bestppl)"; then best=$s; bestppl=$ppl; fi
  done
  echo "best step $((best * segment)) valid_ppl $bestppl" >> "$logs/$m-valid.txt"
  lambdas="0 0.2 0.4 0.6"; [ $m = plain ] && lambdas=0
  for l in $lambdas; do
    lam=; [ $m = plain ] || lam="--lambda $l"
    "$lmcc" score "$work/$m.toml" --weights "$work/$m-seg$best/weights.safetensors" --ids "$work/test.ids" \
      --threads 1 $lam > "$work/$m-test-$l.jsonl"
    echo "$m $l $(python3 "$here/ppl.py" "$work/$m-test-$l.jsonl")" | tee -a "$logs/test.txt"
  done
done
python3 "$here/report.py" "$here"
