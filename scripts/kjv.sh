#!/usr/bin/env bash
# Writes the King James Bible (Debian's bible-kjv, installed when missing) to $1, one verse a line, without
# the verse references: 31,102 lines, about 0.8M words.
set -euo pipefail
out=${1:?usage: kjv.sh OUT.txt}
if ! command -v bible > /dev/null; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "kjv: installing bible-kjv" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends bible-kjv > /dev/null
fi
if [ ! -s "$out" ]; then
  bible -f "Gen1:1-Rev22:21" | sed -E 's/^\S+\s+//' | grep -v '^\s*$' > "$out.tmp"
  mv "$out.tmp" "$out"
fi
