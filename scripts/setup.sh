#!/usr/bin/env bash
# Installs every Debian package the build and tests need (only those missing), then configures and builds
# lmcc into build/ with Ninja. Safe to run repeatedly: a warm tree rebuilds incrementally.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# One setup of a tree at a time: a second one (scripts/bench-deps.sh runs this one, and so do demo.sh and test.sh)
# waits here. Two at once raced in apt-get and in build/, and doubled the compilers: on a 24 GB machine the kernel
# killed them (a compile of codegen/ reached 12 GB).
exec 9<"$root/scripts/setup.sh"
flock 9

packages=(
  cmake ninja-build ccache g++ pkg-config python3
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools lld-19 clang-19
  libeigen3-dev libtbb-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libutf8proc-dev libplplot-dev plplot-driver-cairo
  zlib1g-dev libzstd-dev libedit-dev libxml2-dev libcurl4-openssl-dev libffi-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

. "$root/scripts/ccache-launcher.sh"
if [ ! -f "$root/build/build.ninja" ]; then
  launcher=$(ccache_launcher "$root")
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER_LAUNCHER="$launcher" -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >/dev/null
fi
cmake --build "$root/build" -- -j"$(nproc)"
