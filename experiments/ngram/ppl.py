#!/usr/bin/env python3
"""Perplexity of `lmcc score` output: exp(-sum of scores / sum of n_scored)."""
import json
import math
import sys

total = n = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    total += r["score"]
    n += r["n_scored"]
print("%.2f" % math.exp(-total / n))
