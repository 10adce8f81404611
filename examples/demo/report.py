#!/usr/bin/env python3
"""Prints the demo's table: each sentence and its scrambled version scored by T-TA (one pass) and the biLM (PLL).

report.py PAIRS.json TTA_SCORES.jsonl BILM_SCORES.jsonl (scores of the originals then the scrambled, one a line)"""
import json, sys

pairs = json.load(open(sys.argv[1]))
n = len(pairs["original"])
tta = [json.loads(l)["score"] for l in open(sys.argv[2])]
bilm = [json.loads(l)["score"] for l in open(sys.argv[3])]
wins = {"T-TA": 0, "biLM": 0}
print(f"{'sentence (and its words scrambled)':<74} {'T-TA':>8} {'biLM PLL':>9}")
for i in range(n):
    for label, j in (("", i), ("  scrambled: ", n + i)):
        text = label + (pairs["original"][i] if j < n else pairs["scrambled"][i])
        print(f"{text[:74]:<74} {tta[j]:8.2f} {bilm[j]:9.2f}")
    wins["T-TA"] += tta[i] > tta[n + i]
    wins["biLM"] += bilm[i] > bilm[n + i]
print(f"the original scores above its scrambled version: T-TA {wins['T-TA']}/{n}, biLM {wins['biLM']}/{n}")
