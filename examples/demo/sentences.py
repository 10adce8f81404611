#!/usr/bin/env python3
"""The demo's sentences: a few plain English sentences and the same words scrambled (a fixed seed).

sentences.py OUT_DIR  writes OUT_DIR/sentences.txt (originals then scrambled, one a line) and OUT_DIR/pairs.json."""
import json, os, random, sys

SENTENCES = [
    "and god said , let there be light , and there was light .",
    "the lord is my shepherd ; i shall not want .",
    "and the king sent his servants to the city .",
    "blessed are the poor in spirit : for theirs is the kingdom of heaven .",
    "and he went up into the mountain to pray .",
]
out = sys.argv[1]
rng = random.Random(4)
scrambled = []
for s in SENTENCES:
    words = s.split()
    while True:
        w = words[:]
        rng.shuffle(w)
        if w != words:
            break
    scrambled.append(" ".join(w))
with open(os.path.join(out, "sentences.txt"), "w") as f:
    f.write("\n".join(SENTENCES + scrambled) + "\n")
with open(os.path.join(out, "pairs.json"), "w") as f:
    json.dump({"original": SENTENCES, "scrambled": scrambled}, f)
