#!/usr/bin/env bash
# The main job: set up and build, check every spec in models/ and verify its IR, then train a small T-TA and a
# biLM of the same size on the King James Bible (Debian's bible-kjv, installed when missing) for about a minute
# each with `lmcc train --data` (progress, validation, checkpoints, loss.png), score a few sentences and their
# scrambled versions with both trained models (compiled), and time T-TA's single pass against the biLM's
# mask-and-predict PLL, optimized and naive, per sentence. Everything lands in build/demo/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" >&2
bin="$root/build/bin"
out="$root/build/demo"
mkdir -p "$out"
export LMCC_CACHE_DIR="$out/cache"
start=$(date +%s)

echo "== every spec in models/: checked, IR emitted and verified"
for spec in "$root"/models/*.toml; do
  name=$(basename "$spec" .toml)
  "$bin/lmcc" check "$spec" > "$out/$name.resolved.toml"
  "$bin/lmcc" emit-mlir "$spec" | "$bin/lmcc-opt" > "$out/$name.mlir"
  echo "$name: spec ok, IR verified ($(grep -c ' = lm\.' "$out/$name.mlir") lm ops) -> build/demo/$name.mlir"
done

echo "== training text: the King James Bible, one verse a line; a 4,000-piece WordPiece vocabulary built from it"
"$root/scripts/kjv.sh" "$out/kjv.txt"
[ -s "$out/vocab.txt" ] || "$bin/lmcc" vocab --corpus "$out/kjv.txt" --size 4000 --lowercase -o "$out/vocab.txt"
echo "$(wc -l < "$out/kjv.txt") verses, $(wc -w < "$out/kjv.txt") words"
cp "$root"/examples/demo/demo_tta.toml "$root"/examples/demo/demo_bilm.toml "$out/"

for model in tta bilm; do
  echo "== lmcc train demo_$model (compiles the training library, then about a minute of training on 2 threads)"
  rm -rf "$out/run-$model"
  "$bin/lmcc" train "$out/demo_$model.toml" --data "$out/kjv.txt" -o "$out/run-$model" \
    --batch-tokens 1024 --threads 2 --log-every 50 --valid-every 100 --checkpoint-every 100 > "$out/run-$model.json"
  echo "-> build/demo/run-$model: $(ls "$out/run-$model" | tr '\n' ' ')"
done

echo "== scores of five sentences and their scrambled versions (compiled libraries, trained weights)"
python3 "$root/examples/demo/sentences.py" "$out"
for model in tta bilm; do
  "$bin/lmcc" score "$out/demo_$model.toml" --weights "$out/run-$model/final/weights.safetensors" \
    --text "$out/sentences.txt" --threads 2 > "$out/scores-$model.jsonl"
done
python3 "$root/examples/demo/report.py" "$out/pairs.json" "$out/scores-tta.jsonl" "$out/scores-bilm.jsonl"

echo "== time per sentence: 200 verses of Revelation, one batch, 2 threads (the compiled call alone)"
tail -200 "$out/kjv.txt" > "$out/timing.txt"
time_of() { # prints the per-sentence milliseconds of lmcc score --timing
  "$bin/lmcc" score "$@" --text "$out/timing.txt" --truncate --threads 2 --timing 2>&1 > /dev/null |
    sed -n 's/^timing: .*(\([0-9.]*\) ms per sentence.*/\1/p'
}
tta_ms=$(time_of "$out/demo_tta.toml" --weights "$out/run-tta/final/weights.safetensors")
pll_ms=$(time_of "$out/demo_bilm.toml" --weights "$out/run-bilm/final/weights.safetensors")
naive_ms=$(time_of "$out/demo_bilm.toml" --weights "$out/run-bilm/final/weights.safetensors" --naive)
printf '%-46s %9s ms\n' "T-TA, one pass" "$tta_ms" "biLM PLL, optimized (batched mask-and-predict)" "$pll_ms" \
  "biLM PLL, naive (one pass per position)" "$naive_ms"

echo "== the trained T-TA as a library an application links"
"$bin/lmcc" compile "$out/demo_tta.toml" --weights "$out/run-tta/final/weights.safetensors" -o "$out/demo_tta"
echo "build/demo/demo_tta: $(ls "$out/demo_tta" | tr '\n' ' ')"
echo "demo done in $(( $(date +%s) - start )) s"
