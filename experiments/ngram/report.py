#!/usr/bin/env python3
"""results.md and ppl.svg from logs/ (run.sh): test perplexity per model and lambda beside the paper's Table 1."""
import json
import os
import sys

here = sys.argv[1]
logs = os.path.join(here, "logs")
test = {}
for line in open(os.path.join(logs, "test.txt")):
    m, lam, ppl = line.split()
    test[(m, float(lam))] = float(ppl)
LAMBDAS = [0.0, 0.2, 0.4, 0.6]
PAPER = {"plain": [161.0], "sim2": [150.8, 134.6, 135.3, 156.3], "sim3": [153.3, 134.4, 133.0, 151.9],
         "wdr2": [149.0, 136.5, 129.8, 128.1], "wdr3": [153.1, 136.1, 128.2, 128.8]}
LABEL = {"plain": "TF (plain causal)", "sim2": "TF+Sim N=2", "sim3": "TF+Sim N=3", "wdr2": "TF+WDR N=2",
         "wdr3": "TF+WDR N=3"}
models = [m for m in ["plain", "sim2", "sim3", "wdr2", "wdr3"] if (m, 0.0) in test]


def valid_summary(m):
    lines = [l.split() for l in open(os.path.join(logs, m + "-valid.txt")) if l.startswith("step")]
    return ", ".join("%s: %s" % (l[1], l[3]) for l in lines)


def last_loss(m, k=20):
    rows = [json.loads(l) for l in open(os.path.join(logs, m + "-train.jsonl")) if l.strip()]
    tail = rows[-k:]
    return sum(r["loss"] for r in tail) / len(tail), len(rows)


out = ["# The ngram-wdr paper's Table 1 at this machine's scale (issue 18)", "",
       "`experiments/ngram/run.sh`; data, training and validation logs in `logs/`. Word-level KJV "
       "(Debian `bible-kjv`), lowercased, one verse a sentence; every 20th verse test, the next one validation, "
       "the rest training (`logs/data.txt`); vocabulary: `lmcc vocab --word-level --size 10000` on the training "
       "verses (5 specials + 9995 words; others are [UNK]). Model: pre-norm causal Transformer, 2 layers, "
       "d_model 256, 4 heads, d_ff 1024, max_len 64 (longer verses truncated); n-gram heads of width 256 "
       "(`d_hidden`). AdamW lr 1e-3, warm-up 10%, linear decay, dropout 0.1, label smoothing 0.1, batches of "
       "24 verses, one thread. Each model is validated (main head, lambda = 0) at every segment end; the best "
       "checkpoint is scored on the test verses. Perplexity = exp(-sum log p / tokens) over every predicted "
       "token including [EOS] (`[score] skip_special = false`).", "",
       "| model | test PPL, lambda = 0 | 0.2 | 0.4 | 0.6 | paper (PTB): 0 / 0.2 / 0.4 / 0.6 |", "|---|---|---|---|---|---|"]
for m in models:
    row = [("%.1f" % test[(m, l)]) if (m, l) in test else "-" for l in LAMBDAS]
    out.append("| %s | %s | %s |" % (LABEL[m], " | ".join(row), " / ".join("%.1f" % v for v in PAPER[m])))
out += ["", "| model | training steps | mean training loss (its own objective), last 20 steps | validation PPL (main head) by step |", "|---|---|---|---|"]
for m in models:
    loss, steps = last_loss(m)
    out.append("| %s | %d | %.3f | %s |" % (LABEL[m], steps, loss, valid_summary(m)))
out += ["", "![test perplexity vs lambda](ppl.svg)", ""]
analysis = os.path.join(here, "analysis.md")
if os.path.exists(analysis):
    out += [open(analysis).read()]
with open(os.path.join(here, "results.md"), "w") as f:
    f.write("\n".join(out) + "\n")

# A small SVG line plot (no plotting library needed): test PPL against lambda, one line per model.
W, H, L, R, T, B = 560, 360, 60, 150, 20, 40
vals = [v for v in test.values()]
lo, hi = min(vals) * 0.97, max(vals) * 1.03
x = lambda l: L + (W - L - R) * l / 0.6
y = lambda v: T + (H - T - B) * (hi - v) / (hi - lo)
colors = {"plain": "#000000", "sim2": "#1f77b4", "sim3": "#2ca02c", "wdr2": "#d62728", "wdr3": "#ff7f0e"}
svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
       '<rect width="100%" height="100%" fill="white"/>',
       '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - R, H - B),
       '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, T, L, H - B)]
for l in LAMBDAS:
    svg.append('<text x="%.1f" y="%d" text-anchor="middle">%.1f</text>' % (x(l), H - B + 16, l))
for k in range(5):
    v = lo + (hi - lo) * k / 4
    svg.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>' % (L - 6, y(v) + 4, v))
svg.append('<text x="%d" y="%d" text-anchor="middle">lambda</text>' % ((L + W - R) // 2, H - 6))
svg.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">test perplexity</text>'
           % (H // 2, H // 2))
for i, m in enumerate(models):
    pts = [(x(l), y(test[(m, l)])) for l in LAMBDAS if (m, l) in test]
    if m == "plain":
        svg.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="black" stroke-dasharray="4 3"/>'
                   % (L, pts[0][1], W - R, pts[0][1]))
    else:
        svg.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (colors[m], " ".join("%.1f,%.1f" % p for p in pts)))
        for p in pts:
            svg.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (p[0], p[1], colors[m]))
    svg.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - R + 10, T + 16 + 18 * i, colors[m], LABEL[m]))
svg.append("</svg>")
with open(os.path.join(here, "ppl.svg"), "w") as f:
    f.write("\n".join(svg) + "\n")
