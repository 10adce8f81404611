#!/usr/bin/env python3
"""Compares lmcc with sentence-transformers on the STS-B dev split (needs sentence-transformers; not run by ctest).

    python3 tests/golden/hf/stsb_check.py ST_FOLDER [--lmcc build/bin/lmcc] [--reference]

Imports ST_FOLDER with `lmcc import-hf`, embeds every STS-B dev sentence (../shared/data/stsb/dev.tsv) with
`lmcc embed --text --truncate` and with SentenceTransformer.encode, and prints the largest absolute difference
of the embeddings and both models' Pearson and Spearman correlations (x 100) of cosine similarity with the gold
scores.
"""
import argparse, json, os, subprocess, sys, tempfile

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sentence_transformers import SentenceTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--lmcc", default=os.path.join(ROOT, "build", "bin", "lmcc"))
    ap.add_argument("--reference", action="store_true")
    a = ap.parse_args()
    pairs, gold = [], []
    with open(os.path.join(ROOT, "..", "shared", "data", "stsb", "dev.tsv"), encoding="utf-8") as f:
        for i, line in enumerate(f.read().split("\n")):
            cols = line.split("\t")
            if i and len(cols) >= 10:
                pairs.append((cols[7], cols[8]))
                gold.append(float(cols[9]))
    sentences = [s for p in pairs for s in p]
    tmp = tempfile.mkdtemp()
    spec = os.path.join(tmp, "st.toml")
    subprocess.run([a.lmcc, "import-hf", a.folder, "-o", spec, "--name", "st"], check=True)
    text = os.path.join(tmp, "s.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(s.replace("\n", " ") for s in sentences) + "\n")
    weights = os.path.join(a.folder, "model.safetensors")
    cmd = [a.lmcc, "embed", spec, "--weights", weights, "--text", text, "--truncate", "--threads", "2"]
    out = subprocess.run(cmd + (["--reference"] if a.reference else []), check=True, capture_output=True, text=True)
    ours = np.array([json.loads(l)["embedding"] for l in out.stdout.splitlines()])
    theirs = SentenceTransformer(a.folder, device="cpu").encode(sentences, convert_to_numpy=True)
    print(f"{len(sentences)} sentences, max |lmcc - sentence-transformers| = {np.abs(ours - theirs).max():.3g}")
    for name, e in (("lmcc", ours), ("sentence-transformers", theirs)):
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        cos = (e[0::2] * e[1::2]).sum(1)
        print(f"{name}: STS-B dev Pearson {100 * pearsonr(cos, gold)[0]:.2f}, Spearman {100 * spearmanr(cos, gold)[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
