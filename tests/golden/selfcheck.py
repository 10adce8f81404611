#!/usr/bin/python3
"""Self-consistency checks of torch_ref.py over the fixtures (not run by ctest).

    /usr/bin/python3 tests/golden/selfcheck.py

* the fixture jsonl files equal a fresh `torch_ref.run` (deterministic);
* float32 vs float64 compute differ by far less than the C++ test tolerance (conditioning);
* a second, naive per-query/per-head loop implementation in numpy float64, written
  straight from SEMANTICS.md, agrees with the vectorized torch one (float64);
* padded batch == one sentence at a time;
* dependency structure: T-TA row i does not depend on x_i; causal rows t-1.. do not
  depend on later tokens; anticausal copy i does not depend on earlier tokens;
* score/embed bookkeeping (lp[0] = 0 for causal, specials zero and uncounted).
"""
import json
import math
import os
import random
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import torch_ref  # noqa: E402

FIX = os.path.join(HERE, "fixtures")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


# ---------------------------------------------------------------------------
# Naive implementation (numpy float64, loops)
# ---------------------------------------------------------------------------

def naive_hidden(s, W, x):
    w = {k: v.double().numpy() for k, v in W.items()}
    n, D, H = len(x), s.d_model, s.heads
    dh = D // H

    def ln(v, p):
        mu = v.mean()
        var = ((v - mu) ** 2).mean()
        return (v - mu) / math.sqrt(var + s.eps) * w[p + ".weight"] + w[p + ".bias"]

    def lin(v, p):
        return w[p + ".weight"] @ v + w[p + ".bias"]

    def act(v):
        if s.activation == "gelu":
            return np.array([a * 0.5 * (1 + math.erf(a / math.sqrt(2))) for a in v])
        if s.activation == "gelu_tanh":
            return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
        return np.maximum(v, 0)

    def pos(t):
        if s.position == "learned":
            return w["embed.position"][t]
        if s.position == "none":
            return np.zeros(D)
        p = np.zeros(D)
        for i in range(D // 2):
            p[2 * i] = math.sin(t / 10000 ** (2 * i / D))
            p[2 * i + 1] = math.cos(t / 10000 ** (2 * i / D))
        return p.astype(np.float32).astype(np.float64)

    ne = (lambda v: ln(v, "embed.norm")) if s.embedding_norm else (lambda v: v)
    X = [ne(w["embed.token"][x[t]] + pos(t)) for t in range(n)]
    if s.first_query == "embedding":
        h = list(X)
    elif s.first_query == "position":
        h = [ne(pos(t)) for t in range(n)]
    else:
        h = [ne(w["embed.token"][s.mask_id] + pos(t)) for t in range(n)]

    def vis(i, j):
        return {"none": True, "causal": j <= i, "anticausal": j >= i, "diagonal": j != i}[s.mask]

    k = s.relative_positions
    for li in range(s.layers):
        p = "layers.%d." % li
        qin = h if s.norm == "post" else [ln(v, p + "attn_norm") for v in h]
        kvin = qin if s.keys_values == "hidden" else X
        Q = [lin(v, p + "attn.q") for v in qin]
        K = [lin(v, p + "attn.k") for v in kvin]
        Vv = [lin(v, p + "attn.v") for v in kvin]
        out = []
        for i in range(n):
            ctx = np.zeros(D)
            for hh in range(H):
                sl = slice(hh * dh, (hh + 1) * dh)
                js = [j for j in range(n) if vis(i, j)]
                if not js:
                    continue
                sc = []
                for j in js:
                    v = Q[i][sl] @ K[j][sl]
                    if k:
                        v += Q[i][sl] @ w[p + "attn.rel_k"][min(max(j - i, -k), k) + k]
                    sc.append(v / math.sqrt(dh))
                sc = np.array(sc)
                e = np.exp(sc - sc.max())
                pr = e / e.sum()
                for pj, j in zip(pr, js):
                    ctx[sl] += pj * Vv[j][sl]
                    if k:
                        ctx[sl] += pj * w[p + "attn.rel_v"][min(max(j - i, -k), k) + k]
            out.append(lin(ctx, p + "attn.o"))
        nh = []
        for i in range(n):
            if s.norm == "post":
                a = ln(h[i] + out[i], p + "attn_norm")
                nh.append(ln(a + lin(act(lin(a, p + "ffn.in")), p + "ffn.out"), p + "ffn_norm"))
            else:
                a = h[i] + out[i]
                nh.append(a + lin(act(lin(ln(a, p + "ffn_norm"), p + "ffn.in")), p + "ffn.out"))
        h = nh
    if s.norm == "pre":
        h = [ln(v, "final_norm") for v in h]
    return np.stack(h)


def naive_logprobs(s, W, Hs):
    w = {k: v.double().numpy() for k, v in W.items()}
    t = Hs
    if s.head_transform:
        u = t @ w["head.transform.weight"].T + w["head.transform.bias"]
        u = torch_ref.Model(s, W, torch.float64).act(torch.from_numpy(u)).numpy()
        mu = u.mean(-1, keepdims=True)
        var = ((u - mu) ** 2).mean(-1, keepdims=True)
        t = (u - mu) / np.sqrt(var + s.eps) * w["head.norm.weight"] + w["head.norm.bias"]
    lg = t @ (w["embed.token"] if s.tied else w["head.output.weight"]).T
    if s.head_bias:
        lg = lg + w["head.bias"]
    m = lg.max(-1, keepdims=True)
    return lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True))


def naive_score(s, W, x):
    n = len(x)
    if s.method == "mask-and-predict":
        rows = []
        for i in range(n):
            c = list(x)
            c[i] = s.mask_id
            rows.append(naive_hidden(s, W, c)[i])
        Hs = np.stack(rows)
    else:
        Hs = naive_hidden(s, W, x)
    LP = naive_logprobs(s, W, Hs)
    lp = []
    for t in range(n):
        if s.method == "causal":
            v = 0.0 if t == 0 else LP[t - 1, x[t]]
        else:
            v = LP[t, x[t]]
        if s.skip_special and x[t] in (s.bos, s.eos):
            v = 0.0
        lp.append(v)
    keep = [t for t in range(n) if x[t] not in (s.bos, s.eos)] or list(range(n))
    return np.array(lp), Hs[keep].mean(0)


# ---------------------------------------------------------------------------

def main():
    torch.set_num_threads(1)
    rng = random.Random(5)
    worst32 = 0.0
    for case in sorted(os.listdir(FIX)):
        d = os.path.join(FIX, case)
        sp, wp, ip = (os.path.join(d, f) for f in ("spec.toml", "weights.safetensors", "ids.txt"))
        s = torch_ref.load_spec(sp)
        W = torch_ref.load_weights(wp, s)
        sents = torch_ref.read_ids(ip)
        m32 = torch_ref.Model(s, W)
        m64 = torch_ref.Model(s, W, torch.float64)

        # 1. fixtures are reproducible
        for cmd in ("score", "embed"):
            with open(os.path.join(d, cmd + ".jsonl")) as f:
                check(f.read() == torch_ref.run(cmd, sp, wp, ip), "%s: %s.jsonl not reproducible" % (case, cmd))
        fx_score = [json.loads(l) for l in open(os.path.join(d, "score.jsonl"))]
        fx_embed = [json.loads(l) for l in open(os.path.join(d, "embed.jsonl"))]

        # 2. f32 vs f64 conditioning
        s32, s64 = m32.score(sents), m64.score(sents)
        e32, e64 = m32.embed(sents), m64.embed(sents)
        dlp = max(max(abs(a - b) for a, b in zip(r.get("token_logprobs"), q.get("token_logprobs")))
                  for r, q in zip(s32, s64))
        dem = max(max(abs(a - b) for a, b in zip(r["embedding"], q["embedding"])) for r, q in zip(e32, e64))
        worst32 = max(worst32, dlp, dem)
        check(dlp < 2e-5 and dem < 2e-5, "%s: f32 vs f64 differ by %.3g / %.3g" % (case, dlp, dem))

        # 3. naive float64 implementation (a few sentences, incl. 1-token and the longest)
        picks = sorted(range(len(sents)), key=lambda b: len(sents[b]))
        picks = [picks[0], picks[len(picks) // 2], picks[-1]] if s.method != "mask-and-predict" else picks[:3]
        dn = 0.0
        for b in picks:
            lp, emb = naive_score(s, W, sents[b])
            dn = max(dn, float(np.abs(lp - np.array(s64[b]["token_logprobs"])).max()),
                     float(np.abs(emb - np.array(e64[b]["embedding"])).max()))
        check(dn < 1e-9, "%s: naive vs torch f64 differ by %.3g" % (case, dn))

        # 4. bookkeeping against fixture
        for x, r, e in zip(sents, fx_score, fx_embed):
            check(len(r["token_logprobs"]) == len(x) and len(e["embedding"]) == s.d_model, "%s: sizes" % case)
            cnt = 0
            for t, v in enumerate(r["token_logprobs"]):
                special = s.skip_special and x[t] in (s.bos, s.eos)
                unscored = special or (s.method == "causal" and t == 0)
                check(not unscored or v == 0, "%s: unscored position %d has lp %g" % (case, t, v))
                check(v <= 0, "%s: positive log-prob" % case)
                cnt += not unscored
            check(cnt == r["n_scored"], "%s: n_scored %d vs %d" % (case, r["n_scored"], cnt))
            check(abs(sum(r["token_logprobs"]) - r["score"]) < 1e-5, "%s: score != sum" % case)

        # 5. batch vs single
        hb = m32.run_hidden(sents)
        db = max(float((hb[b] - m32.run_hidden([x])[0]).abs().max()) for b, x in enumerate(sents))
        check(db < 1e-5, "%s: batch vs single differ by %.3g" % (case, db))

        # 6. dependency structure (float64 log-prob rows)
        x = max(sents, key=len)
        n = len(x)

        def rows(y):
            return m64.per_position_states(y)[1]

        base = rows(x)
        words = [t for t in range(s.vocab) if t not in (s.bos, s.eos)]
        for _ in range(3):
            i = rng.randrange(1, n - 1)
            y = list(x)
            y[i] = rng.choice([t for t in words if t != x[i]])
            new = rows(y)
            if s.family == "tta" or s.method == "mask-and-predict":
                check(float((new[i] - base[i]).abs().max()) < 1e-12, "%s: row %d depends on x_%d" % (case, i, i))
                check(float((new - base).abs().max()) > 1e-6, "%s: nothing depends on x_%d" % (case, i))
            if s.mask == "causal":
                check(float((new[:i] - base[:i]).abs().max()) < 1e-12, "%s: rows < %d see x_%d" % (case, i, i))
                check(float((new[i:] - base[i:]).abs().max()) > 1e-6, "%s: rows >= %d ignore x_%d" % (case, i, i))
            if s.mask == "anticausal":
                check(float((new[i + 1:] - base[i + 1:]).abs().max()) < 1e-12,
                      "%s: rows > %d see x_%d" % (case, i, i))
                check(float((new[:i] - base[:i]).abs().max()) > 1e-6, "%s: rows < %d ignore x_%d" % (case, i, i))
        print("%-24s ok  f32-f64 %.2g/%.2g  naive %.2g  batch %.2g" % (case, dlp, dem, dn, db))
    print("worst f32 vs f64 difference: %.3g" % worst32)
    if failures:
        print("%d FAILURES" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
