#!/usr/bin/env bash
# Writes `lmcc score` and `lmcc embed` outputs of every pipeline (optimized, --naive, each --no-<pass>,
# --gemm eigen) for every bundled model that executes and every spec under tests/ (golden fixtures, tiny
# specs) into OUTDIR/<spec>/<pipeline>.{score,embed}.jsonl, so two builds can be compared bit for bit:
#   scripts/compare-outputs.sh OLD/build/bin/lmcc /tmp/old && scripts/compare-outputs.sh build/bin/lmcc /tmp/new
#   diff -r /tmp/old /tmp/new
# Paper-size models take long (BERT-base's naive PLL most): MODELS="tta_base bilm_base" and
# PAPER_PIPELINES="opt naive" restrict them; FIXTURES=0 skips the test specs.
# Numbers are printed with 9 significant digits, which round-trips float32: equal text = equal bits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lmcc=$(realpath "$1"); out=$2
mkdir -p "$out"
export LMCC_CACHE_DIR="$out/.cache"
pipelines=(opt naive no-fuse-attention no-fuse-logprob no-batch-mask-predict no-share-first-layer no-prune-rows
           no-hoist-isolated-kv no-fold-constants gemm-eigen)
flags_of() {
  case $1 in opt) ;; naive) echo --naive ;; gemm-eigen) echo --gemm eigen ;; *) echo "--$1" ;; esac
}
# Paper-size ids: 4 sentences (bos .. eos), lengths 2, 7, 19 and 33.
python3 - "$out/paper_ids.txt" <<'PY'
import random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for n in (2, 7, 19, 33):
        f.write(" ".join(["3"] + [str(r.randrange(5, 30522)) for _ in range(n - 2)] + ["1"]) + "\n")
PY
python3 - "$out/tiny_ids.txt" <<'PY'
import random, sys
r = random.Random(9)
with open(sys.argv[1], "w") as f:
    for n in (1, 2, 5, 13, 24):
        f.write(" ".join(str(r.randrange(5, 40)) for _ in range(n)) + "\n")
PY
run_spec() { # name spec weights ids
  local name=$1 spec=$2 weights=$3 ids=$4
  mkdir -p "$out/$name"
  for p in "${pipelines[@]}"; do
    # shellcheck disable=SC2046
    "$lmcc" score "$spec" --weights "$weights" --ids "$ids" $(flags_of "$p") > "$out/$name/$p.score.jsonl" 2>&1 || true
    # shellcheck disable=SC2046
    "$lmcc" embed "$spec" --weights "$weights" --ids "$ids" $(flags_of "$p") > "$out/$name/$p.embed.jsonl" 2>&1 || true
  done
}
for name in ${MODELS-tta_base tta_mask_base bilm_base unilm_base bert_base}; do
  spec=$root/models/$name.toml
  "$lmcc" init "$spec" --seed 11 -o "$out/.cache-$name.safetensors" >/dev/null
  pipelines_saved=("${pipelines[@]}")
  [ -n "${PAPER_PIPELINES:-}" ] && read -r -a pipelines <<< "$PAPER_PIPELINES"
  run_spec "$name" "$spec" "$out/.cache-$name.safetensors" "$out/paper_ids.txt"
  pipelines=("${pipelines_saved[@]}")
done
[ "${FIXTURES:-1}" = 0 ] && { rm -rf "$out/.cache" "$out"/.cache-*.safetensors; exit 0; }
for dir in "$root"/tests/golden/fixtures/*/; do
  run_spec "fixture-$(basename "$dir")" "$dir/spec.toml" "$dir/weights.safetensors" "$dir/ids.txt"
done
for spec in "$root"/tests/inputs/specs/tiny_*.toml; do
  name=$(basename "$spec" .toml)
  "$lmcc" init "$spec" --seed 5 -o "$out/.cache-$name.safetensors" >/dev/null
  run_spec "$name" "$spec" "$out/.cache-$name.safetensors" "$out/tiny_ids.txt"
done
rm -rf "$out/.cache" "$out"/.cache-*.safetensors
echo "compare-outputs: wrote $out"
