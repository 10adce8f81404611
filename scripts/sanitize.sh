#!/usr/bin/env bash
# ASan + UBSan job (run by ctest as the `sanitizers` test): builds liblmrt and the runtime
# tests with sanitizers into build-asan/, runs them, then compiles a small model with the
# regular lmcc, swaps in the sanitized liblmrt.so and runs the contract client (good and
# bad calls) under the sanitizers. Usage: scripts/sanitize.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
asan=$root/build-asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
. "$root/scripts/ccache-launcher.sh"
if [ ! -f "$asan/build.ninja" ]; then
  launcher=$(ccache_launcher "$root")
  cmake -S "$root" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMCC_SANITIZE=ON \
    -DCMAKE_C_COMPILER_LAUNCHER="$launcher" -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" > /dev/null
fi
cmake --build "$asan" --target lmrt RuntimeTest WeightsTest -- -j"$(nproc)" > "$asan/build.log" 2>&1 || { tail -50 "$asan/build.log"; exit 1; }
"$asan/tests/unit/RuntimeTest" --gtest_brief=1
"$asan/tests/unit/WeightsTest" --gtest_brief=1

work=$asan/compiled-model
rm -rf "$work" && mkdir -p "$work"
"$build/bin/lmcc" compile "$root/tests/inputs/specs/tiny_bilm.toml" -o "$work/lib"
cp "$asan/lib/liblmrt.so" "$work/lib/liblmrt.so"
"$build/bin/lmcc" init "$root/tests/inputs/specs/tiny_bilm.toml" --seed 3 -o "$work/w.safetensors"
sed -e 's/MODEL_MAX_LEN_MACRO/TINY_BILM_MAX_LEN/; s/MODEL_VOCAB_MACRO/TINY_BILM_VOCAB/; s/MODEL/tiny_bilm/g' \
  "$root/tests/inputs/contracts/score_client.c" > "$work/client.c"
cc -g -fsanitize=address,undefined -fno-omit-frame-pointer "$work/client.c" -I "$work/lib" -L "$work/lib" \
  -ltiny_bilm -o "$work/client"
printf '3 17 42 8 1\n3 20 1\n9\n3 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 1\n' > "$work/ids.txt"
"$work/client" "$work/w.safetensors" "$work/ids.txt" > "$work/out.jsonl"
[ "$(wc -l < "$work/out.jsonl")" = 4 ] || { echo "sanitize: expected 4 scored lines"; exit 1; }
echo "sanitizers: runtime tests and a compiled model under ASan+UBSan passed"
