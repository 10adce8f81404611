#!/usr/bin/env python3
"""Training batches for `lmcc train --batches` from ids (one sentence a line, bos .. eos): shuffled with a
fixed seed, `size` sentences a batch, causal targets (x[i+1], -1 at the end; what objective ngram requires)."""
import json
import random
import sys

ids, out, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
sents = [[int(t) for t in l.split()] for l in open(ids) if l.strip()]
random.Random(1).shuffle(sents)
with open(out, "w") as f:
    for k in range(0, len(sents) - size + 1, size):
        b = sents[k:k + size]
        f.write(json.dumps({"inputs": b, "targets": [x[1:] + [-1] for x in b]}, separators=(",", ":")) + "\n")
