#!/usr/bin/env bash
# Issue 17's memory acceptance: BERT-base (random weights, models/bert_base.toml) PLL of a 256-token sentence
# under --max-memory 1024 gives the same output as unchunked, byte for byte, and its peak RSS stays within
# the limit of that of scoring a short (12-token) sentence. Prints one line per run (peak RSS, time, the
# kernels' measured peak temporaries) and IDENTICAL / DIFFERENT. About 6 minutes on 2 cores.
#   scripts/bench-pll-memory.sh [WORK_DIR] [THREADS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build/bench-pll-memory}
threads=${2:-2}
lmcc="$root/build/bin/lmcc"
spec="$root/models/bert_base.toml"
mkdir -p "$work" && cd "$work"
[ -s w.safetensors ] || "$lmcc" init "$spec" --seed 1 -o w.safetensors
python3 -c "
import random; r = random.Random(1)
print(' '.join(['101'] + [str(r.randrange(1000, 30000)) for _ in range(254)] + ['102']))
print(' '.join(['101'] + [str(r.randrange(1000, 30000)) for _ in range(10)] + ['102']))" > both.txt
head -n 1 both.txt > long.txt
tail -n 1 both.txt > short.txt
command -v /usr/bin/time > /dev/null || { SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get install -y -qq time > /dev/null; }
"$lmcc" score "$spec" --weights w.safetensors --ids short.txt > /dev/null # compile into the cache first
for run in "short short.txt" "chunked long.txt --max-memory 1024" "unchunked long.txt"; do
  set -- $run; name=$1; shift
  /usr/bin/time -f "%M" -o "$name.rss" "$lmcc" score "$spec" --weights w.safetensors --ids "$@" --threads "$threads" \
    --timing > "$name.jsonl" 2> "$name.err"
  printf '%-9s peak RSS %6.0f MB  %s\n' "$name" "$(python3 -c "print($(cat "$name.rss") / 1024)")" \
    "$(sed -n 's/^timing: 1 sentences in \([0-9.]*\) ms.*/\1 ms/p; s/^timing: peak kernel temporaries \(.*\)/kernel temporaries \1/p' "$name.err" | paste -sd ' ')"
done
cmp -s chunked.jsonl unchunked.jsonl && echo "IDENTICAL (chunked vs unchunked)" || echo "DIFFERENT (chunked vs unchunked)"
