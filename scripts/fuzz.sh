#!/usr/bin/env bash
# libFuzzer targets (tests/fuzz/*_fuzzer.cpp: spec parser, safetensors reader, ids reader, tokenizer) built
# with Debian's clang 19 under ASan + UBSan into build-fuzz/, each run for SECONDS (default 60) from its seed
# corpus (tests/fuzz/corpus/<target>/, read-only; new inputs go to build-fuzz/corpus/). Every file of
# tests/fuzz/regressions/<target>/ (crashes found earlier, fixed since) is replayed first. A crash stops the
# script with its input under build-fuzz/ (add it to regressions/ with the fix).
#
#   scripts/fuzz.sh [SECONDS]   explore: a random seed, SECONDS per target
#   scripts/fuzz.sh --ci        CI: seed 1 and a fixed number of runs per target, so that a CI run explores
#                               exactly what it explored here (deterministic; a few minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ci=0
if [ "${1:-}" = "--ci" ]; then ci=1; seconds=0; else seconds=${1:-60}; fi
declare -A ciRuns=([spec]=150000 [safetensors]=6000 [ids]=150000 [tokenizer]=20000)
packages=(clang-19 libclang-rt-19-dev libtomlplusplus-dev nlohmann-json3-dev libutf8proc-dev ccache)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
out="$root/build-fuzz"
mkdir -p "$out/obj"
# -DNDEBUG as in the shipped (Release) build: toml++ 3.3's debug assertions fire on some malformed keys
# (tests/fuzz/regressions/spec/toml-key-newline.toml) that its release build reports as a parse error.
flags=(-std=c++17 -g -O1 -DNDEBUG -fsanitize=address,undefined -fno-sanitize-recover=undefined -I "$root")
sources=(frontend/Spec.cpp runtime/weights/Safetensors.cpp runtime/weights/Format.cpp runtime/train/Corpus.cpp
         runtime/train/Objectives.cpp runtime/lib/Tokenizer.cpp)
# Through the build trees' ccache (a fresh clone hits what another one compiled), two compiles at a time.
. "$root/scripts/ccache-launcher.sh"
IFS=';' read -r -a cxx <<< "$(ccache_launcher "$root");clang++-19"
compile() { # SOURCE OBJECT [FLAGS...]: compiles when the object is missing or older than the source
  local src=$1 obj=$2
  shift 2
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
    "${cxx[@]}" "${flags[@]}" "$@" -c "$src" -o "$obj"
  fi
}
objects=() pids=()
for src in "${sources[@]}" tests/fuzz/{spec,safetensors,ids,tokenizer}_fuzzer.cpp; do
  obj="$out/obj/$(echo "$src" | tr / _).o"
  compile "$root/$src" "$obj" -fsanitize=fuzzer-no-link &
  pids+=($!)
  [[ $src == tests/fuzz/* ]] || objects+=("$obj")
  if [ ${#pids[@]} -ge 2 ]; then
    wait "${pids[0]}" || exit 1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for target in spec safetensors ids tokenizer; do
  bin="$out/${target}_fuzzer"
  clang++-19 "${flags[@]}" -fsanitize=fuzzer "$out/obj/tests_fuzz_${target}_fuzzer.cpp.o" "${objects[@]}" -lutf8proc -o "$bin"
  regressions="$root/tests/fuzz/regressions/$target"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    "$bin" -runs=0 "$regressions"/* > "$out/$target-regressions.log" 2>&1 ||
      { tail -30 "$out/$target-regressions.log"; echo "fuzz: $target: a regression input fails again" >&2; exit 1; }
  fi
  mkdir -p "$out/corpus/$target"
  if [ $ci = 1 ]; then
    limit=(-seed=1 -runs="${ciRuns[$target]}")
    rm -rf "$out/corpus/$target" && mkdir -p "$out/corpus/$target"
    echo "fuzz: $target, seed 1, ${ciRuns[$target]} runs"
  else
    limit=(-max_total_time="$seconds")
    echo "fuzz: $target for $seconds s"
  fi
  (cd "$out" && "$bin" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "$out/corpus/$target" "$root/tests/fuzz/corpus/$target" > "$out/$target.log" 2>&1) ||
    { tail -40 "$out/$target.log"; echo "fuzz: $target found a crash (input saved in $out)" >&2; exit 1; }
  grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$out/$target.log" | tail -1
done
echo "fuzz: no crash"
