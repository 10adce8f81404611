"""Independent expected values for tests/cli/eval.test, from `lmcc embed` / `lmcc score` outputs (no numpy).

  expected.py sts DATA.tsv glue|original EMBED1.jsonl EMBED2.jsonl OURS.json
      cosine of each pair's embeddings, Pearson and Spearman (average ranks) x 100 against the gold scores
  expected.py blimp GOOD_SCORES.jsonl BAD_SCORES.jsonl PAIRS.jsonl OURS.json
      accuracy per paradigm (UID), per field, mean over paradigms (PAIRS: the pairs in file order)
  expected.py rerank NBEST.jsonl LM_SCORES.jsonl LAMBDA|tune:DEV.jsonl:DEV_LM.jsonl OURS.jsonl
      the chosen hypotheses, WER before/after in percent; with tune: the grid 0, 0.05, ..., 2 on the dev file

Compares with OURS (lmcc's output) within 1e-6 relative and exits 1 on a difference."""
import json
import math
import sys


def close(a, b, what):
    if isinstance(a, float) or isinstance(b, float):
        ok = math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    else:
        ok = a == b
    if not ok:
        sys.exit(f"{what}: expected {a}, lmcc printed {b}")


def pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def sts(data, layout, e1, e2, ours):
    rows = [l.rstrip("\n").split("\t") for l in open(data, encoding="utf-8")]
    if layout == "glue":
        rows = rows[1:]
    gold = [float(r[9] if layout == "glue" else r[4]) for r in rows]
    a, b = lines(e1), lines(e2)
    cos = []
    for x, y in zip(a, b):
        x, y = x["embedding"], y["embedding"]
        dot = sum(p * q for p, q in zip(x, y))
        cos.append(dot / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y)))
    got = json.load(open(ours))
    close(len(gold), got["pairs"], "pairs")
    close(100 * pearson(cos, gold), got["pearson"], "pearson")
    close(100 * pearson(ranks(cos), ranks(gold)), got["spearman"], "spearman")


def blimp(good, bad, pairs, ours):
    g, b, p = lines(good), lines(bad), lines(pairs)
    per, field = {}, {}
    for x, y, pair in zip(g, b, p):
        c = per.setdefault(pair["UID"], [0, 0])
        c[0] += x["score"] > y["score"]
        c[1] += 1
        field[pair["UID"]] = pair["field"]
    acc = {u: c[0] / c[1] for u, c in per.items()}
    got = json.load(open(ours))
    close(sorted(acc), sorted(got["paradigms"]), "paradigms")
    for u in acc:
        close(acc[u], got["paradigms"][u], u)
    for f in set(field.values()):
        v = [acc[u] for u in acc if field[u] == f]
        close(sum(v) / len(v), got["fields"][f], f)
    close(sum(acc.values()) / len(acc), got["mean"], "mean")
    close(len(p), got["pairs"], "pairs")


def nbest_with_lm(nbest, lm):
    utts, scores = lines(nbest), [s["score"] for s in lines(lm)]
    k = 0
    for u in utts:
        for h in u["hyps"]:
            h["lm"] = scores[k]
            k += 1
    return utts


def edit(r, h):
    row = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        diag, row[0] = row[0], i
        for j in range(1, len(h) + 1):
            up = row[j]
            row[j] = min(row[j] + 1, row[j - 1] + 1, diag + (r[i - 1] != h[j - 1]))
            diag = up
    return row[len(h)]


def choose(u, lam):
    best, score = 0, -math.inf
    for i, h in enumerate(u["hyps"]):
        s = h["score"] + lam * h["lm"]
        if s > score:
            best, score = i, s
    return best, score


def wer(utts, lam):
    errors = sum(edit(u["ref"].split(), u["hyps"][choose(u, lam)[0]]["text"].split()) for u in utts)
    return 100 * errors / sum(len(u["ref"].split()) for u in utts)


def rerank(nbest, lm, lam, ours):
    got = lines(ours)
    if lam.startswith("tune:"):
        _, dev, dev_lm = lam.split(":")
        d = nbest_with_lm(dev, dev_lm)
        grid = [k / 20 for k in range(41)]
        best = min(grid, key=lambda l: (wer(d, l), l))
        close(best, got[0]["lambda"], "tuned lambda")
        close(wer(d, best), got[0]["dev_wer"], "dev WER")
        got, lam = got[1:], best
    else:
        lam = float(lam)
    utts = nbest_with_lm(nbest, lm)
    for u, line in zip(utts, got):
        i, s = choose(u, lam)
        close(u["id"], line["id"], "id")
        close(i, line["chosen"], f"choice of {u['id']}")
        close(u["hyps"][i]["text"], line["text"], "text")
        close(s, line["score"], "score")
    close(len(utts) + 1, len(got), "lines")
    close(wer(utts, 0.0), got[-1]["wer_before"], "WER before")
    close(wer(utts, lam), got[-1]["wer_after"], "WER after")


if __name__ == "__main__":
    {"sts": sts, "blimp": blimp, "rerank": rerank}[sys.argv[1]](*sys.argv[2:])
    print("ok")
