#!/usr/bin/env python3
"""Training text for experiments/seeds: the King James Bible (one verse a line) and Debian's fortunes cut
into sentences, shuffled together with a fixed seed. Usage: prep.py KJV.txt FORTUNES_DIR OUT.txt"""
import os, random, re, sys

kjv, fdir, out = sys.argv[1:4]
lines = [l.strip() for l in open(kjv, encoding="utf-8") if l.strip()]
n_kjv = len(lines)
skip = {"ascii-art"}  # pictures, not prose
split = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")
n_fortunes = 0
for name in sorted(os.listdir(fdir)):
    path = os.path.join(fdir, name)
    if "." in name or name in skip or not os.path.isfile(path) or os.path.islink(path):
        continue
    text = open(path, encoding="utf-8", errors="replace").read()
    for fortune in text.split("\n%\n"):
        flat = " ".join(fortune.split())
        if not flat or "\ufffd" in flat:
            continue
        n_fortunes += 1
        for s in split.split(flat):
            if len(s.split()) >= 3:
                lines.append(s)
random.Random(1).shuffle(lines)
with open(out + ".tmp", "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
os.replace(out + ".tmp", out)
words = sum(len(l.split()) for l in lines)
print(f"corpus: {len(lines)} lines ({n_kjv} KJV verses, {len(lines) - n_kjv} sentences of {n_fortunes} fortunes), {words} words")
