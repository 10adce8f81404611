#!/usr/bin/env bash
# The main job on the bundled models: set up and build, check every spec, emit and
# verify its IR, then score a few sentences on seeded random weights (T-TA single pass,
# biLM mask-and-predict, uniLM causal) with the reference executor and with compiled
# libraries, and compile T-TA into build/demo/tta_base (lib + header).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" >&2
bin="$root/build/bin"
out="$root/build/demo"
mkdir -p "$out"
for spec in "$root"/models/*.toml; do
  name=$(basename "$spec" .toml)
  "$bin/lmcc" check "$spec" > "$out/$name.resolved.toml"
  "$bin/lmcc" emit-mlir "$spec" | "$bin/lmcc-opt" > "$out/$name.mlir"
  echo "$name: spec ok, IR verified ($(grep -c ' = lm\.' "$out/$name.mlir") lm ops) -> build/demo/$name.mlir"
done
printf '3 17 942 2054 88 1\n3 1996 4937 2003 1\n' > "$out/ids.txt"
for name in tta_base bilm_base unilm_base; do
  [ -f "$out/$name.safetensors" ] || "$bin/lmcc" init "$root/models/$name.toml" --seed 1 -o "$out/$name.safetensors"
  echo "$name score (reference executor, random weights):"
  "$bin/lmcc" score "$root/models/$name.toml" --weights "$out/$name.safetensors" --ids "$out/ids.txt" --reference --threads 2
done
for name in tta_base bilm_base unilm_base; do
  echo "$name score (compiled library, cached under build/demo/cache):"
  LMCC_CACHE_DIR="$out/cache" "$bin/lmcc" score "$root/models/$name.toml" --weights "$out/$name.safetensors" --ids "$out/ids.txt" --threads 2
done
"$bin/lmcc" compile "$root/models/tta_base.toml" -o "$out/tta_base"
echo "compiled models/tta_base.toml -> build/demo/tta_base: $(ls "$out/tta_base" | tr '\n' ' ')"
