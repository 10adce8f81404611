#!/usr/bin/env python3
"""Split the KJV verses (one a line, verse numbers stripped) into train / valid / test text files:
every 20th verse is test, the one after it validation, the rest training (deterministic)."""
import re
import sys

src, out = sys.argv[1], sys.argv[2]
verses = []
for line in open(src, encoding="utf-8"):
    m = re.match(r"\s*\d+\s+(.*\S)", line)
    if m:
        verses.append(m.group(1))
parts = {"train": [], "valid": [], "test": []}
for i, v in enumerate(verses):
    parts["test" if i % 20 == 0 else "valid" if i % 20 == 1 else "train"].append(v)
for name, lines in parts.items():
    with open("%s/%s.txt" % (out, name), "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in lines))
    print(name, len(lines), "verses", sum(len(l.split()) for l in lines), "words")
