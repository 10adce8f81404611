#!/usr/bin/env bash
# Times `lmcc compile` of two lmcc builds side by side, alternating per configuration (a slow spell of the host
# then hits both), and prints one markdown row per configuration: wall seconds (user seconds), the speedup and
# the two libraries' sizes:
#   scripts/compile-times.sh OLD/build/bin/lmcc build/bin/lmcc
# Configurations: CONFIGS, one "SPEC [FLAGS]" per line (specs relative to the repository root), default below.
# bench/results/2026-12-07-compile-time.md was measured with this (27e86c5's lmcc built in a git worktree).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1") new=$(realpath "$2")
default="models/bert_base.toml
models/bert_base.toml --train
models/bert_base.toml --naive
models/bilm_base.toml
models/bilm_base.toml --train
models/bilm_base.toml --naive
models/tta_base.toml --train
models/unilm_base.toml --train
models/diformer_base.toml
models/diformer_base.toml --train
models/ngram_clm.toml --train
tests/golden/diformer_fixtures/dif_pre/spec.toml --train
tests/golden/diformer_fixtures/dif_pre/spec.toml --train --naive"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "| spec | flags | old | new | speedup | library old | new |"
echo "|---|---|---|---|---|---|---|"
declare -A wall user size
while read -r spec flags; do
  [ -z "$spec" ] && continue
  for side in old new; do
    bin=$old; [ $side = new ] && bin=$new
    rm -rf "$work/$side"
    # shellcheck disable=SC2086 # the flags are words
    /usr/bin/time -f "%e %U" -o "$work/time" "$bin" compile "$root/$spec" $flags -o "$work/$side" > /dev/null
    read -r wall[$side] user[$side] < "$work/time"
    lib=$(ls "$work/$side"/lib*.so | grep -v '/liblmrt.so$')
    size[$side]=$(stat -c %s "$lib")
  done
  speedup=$(python3 -c "print(f'{${wall[old]} / ${wall[new]}:.2f}x')")
  echo "| $(basename "$spec" .toml) | $flags | ${wall[old]} s (${user[old]}) | ${wall[new]} s (${user[new]}) | $speedup |" \
       "${size[old]} B | ${size[new]} B |"
done <<< "${CONFIGS:-$default}"
