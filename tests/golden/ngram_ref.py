#!/usr/bin/python3
"""Independent PyTorch implementation of the ngram family (issue 18's contract), for golden fixtures.

Written from the issue's contract, not from the C++ code. The trunk (a causal uniLM stack) is
torch_ref.py's; this file adds the heads, the WDR conjugate (stop-gradient), the logit-space ensemble
score and the n-gram training loss:
  u_1(s) = H_s;  u_j(s) = out_j(act(in_j(H_s))) [+ sum_{i=1..j-1} (-1)^(i+1) C(j-1,i) sg(W)[x_{s+j-i}]]
  z_j(s) = W u_j(s) + b
  score: z(p) = (1-l) z_1(p-1) + l/(n-1) sum_{j=2..n} (p >= j ? z_j(p-j) : z_1(p-1)),
         token_logprob[p] = log_softmax(z(p))[x_p] for p >= 1 (specials skipped when skip_special)
  loss:  (S_1/2 + 1/(2(n-1)) sum_j S_j) / sum_b (L_b - 1),  S_j = sum_b sum_{s <= L_b-1-j} CE(z_j(s), x_{s+j})

Usage:
  ngram_ref.py score SPEC WEIGHTS IDS [--lambda X] [--f64]   like `lmcc score` (one JSON object per line)
  ngram_ref.py grad SPEC WEIGHTS BATCH.json OUT.safetensors [--f64]
                                     {"loss":L,"targets":T}; BATCH {"inputs":[[...]]} (targets optional,
                                     must be the causal shift)
  ngram_ref.py init SPEC SEED OUT.safetensors
  ngram_ref.py fdcheck SPEC SEED     float64 central finite differences of the loss, holding the
                                     conjugate's copy of W fixed, against autograd; prints the worst error
  ngram_ref.py fixtures DIR          writes DIR/<case>/{spec.toml,weights.safetensors,ids.txt,
                                     score_l<lambda>.jsonl,batch.json,grad.safetensors,grad.json}
"""
import json
import math
import os
import sys
import tomllib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref as tr  # noqa: E402


def resolve(doc):
    """The trunk spec (torch_ref's, as family unilm) plus the [ngram] options."""
    if doc.get("family") != "ngram":
        raise ValueError("ngram_ref: family must be \"ngram\"")
    trunk = dict(doc)
    trunk["family"] = "unilm"
    head = dict(doc.get("head", {}))
    if head.get("transform", False):
        raise ValueError("head.transform: family ngram has no head transform")
    head["transform"] = False
    trunk["head"] = head
    train = dict(doc.get("train", {}))
    if train.get("objective", "auto") not in ("auto", "ngram"):
        raise ValueError("train.objective: family ngram trains with objective ngram")
    train.pop("objective", None)
    trunk["train"] = train
    s = tr.resolve_spec(trunk)
    s.train_given = "train" in doc
    ng = doc.get("ngram", {})
    s.n = int(ng.get("n", 3))
    s.wdr = bool(ng.get("wdr", True))
    s.lam = float(ng.get("ensemble_lambda", 0.4))
    s.d_hidden = int(ng.get("d_hidden", s.d_model))
    if s.n < 2:
        raise ValueError("ngram.n must be >= 2")
    return s


def load_spec(path):
    with open(path, "rb") as f:
        return resolve(tomllib.load(f))


def expected_tensors(s):
    out = tr.expected_tensors(s)
    for j in range(2, s.n + 1):
        p = "ngram.heads.%d." % j
        out += [(p + "in.weight", [s.d_hidden, s.d_model]), (p + "in.bias", [s.d_hidden]),
                (p + "out.weight", [s.d_model, s.d_hidden]), (p + "out.bias", [s.d_model])]
    return out


def init_weights(s, seed):
    g = torch.Generator().manual_seed(int(seed) + 1000)
    trunk = tr.init_weights(s, seed)
    out = list(trunk)
    for name, shape in expected_tensors(s)[len(trunk):]:
        std = 0.1 if name.endswith("bias") else 0.8 / math.sqrt(shape[1])
        out.append((name, torch.randn(shape, generator=g, dtype=torch.float32) * std))
    return out


def load_weights(path, s):
    tensors, _ = tr.read_safetensors(path)
    want = dict(expected_tensors(s))
    for name, shape in want.items():
        if name not in tensors or list(tensors[name].shape) != shape:
            raise ValueError("%s: tensor %r missing or of the wrong shape" % (path, name))
    extra = set(tensors) - set(want)
    if extra:
        raise ValueError("%s: unexpected tensors %s" % (path, sorted(extra)))
    return tensors


class NGram:
    def __init__(self, s, weights, dtype=torch.float32, conj_weights=None):
        """conj_weights: the tensors the WDR conjugate reads W from (default: the same, detached)."""
        self.s = s
        self.trunk = tr.Model(s, weights, dtype)
        self.w = self.trunk.w
        W = self.w["embed.token"] if s.tied else self.w["head.output.weight"]
        cw = conj_weights if conj_weights is not None else weights
        Wc = cw["embed.token"] if s.tied else cw["head.output.weight"]
        self.W = W
        self.Wconj = Wc.to(dtype).detach()  # sg(W)
        self.b = self.w["head.bias"] if s.head_bias else None

    def logits(self, u):
        z = u @ self.W.T
        return z + self.b if self.b is not None else z

    def heads(self, ids, lens):
        """[u_1, ..., u_n], each [B, n, D]."""
        s = self.s
        H = self.trunk.hidden(ids, lens)
        us = [H]
        B, n = ids.shape
        for j in range(2, s.n + 1):
            p = "ngram.heads.%d." % j
            u = self.trunk.lin(self.trunk.act(self.trunk.lin(H, p + "in")), p + "out")
            if s.wdr:
                c = torch.zeros_like(u)
                for i in range(1, j):
                    coef = (-1) ** (i + 1) * math.comb(j - 1, i)
                    for b in range(B):
                        L = int(lens[b])
                        for t in range(n):
                            if t + j - i < L:
                                c[b, t] = c[b, t] + coef * self.Wconj[ids[b, t + j - i]]
                u = u + c
            us.append(u)
        return us

    def score(self, sents, lam):
        s = self.s
        ids, lens = self.trunk._pad(sents)
        z = [self.logits(u) for u in self.heads(ids, lens)]
        out = []
        for b, x in enumerate(sents):
            L = len(x)
            lps = [0.0] * L
            total, k = 0.0, 0
            for p in range(1, L):
                mix = (1 - lam) * z[0][b, p - 1]
                for j in range(2, s.n + 1):
                    mix = mix + lam / (s.n - 1) * (z[j - 1][b, p - j] if p >= j else z[0][b, p - 1])
                if s.skip_special and x[p] in (s.bos, s.eos):
                    continue
                lp = float(torch.log_softmax(mix, dim=-1)[x[p]])
                lps[p] = lp
                total += lp
                k += 1
            out.append({"token_logprobs": lps, "score": total, "n_scored": k})
        return out

    def loss(self, sents):
        s = self.s
        ids, lens = self.trunk._pad(sents)
        us = self.heads(ids, lens)
        e = s.train.label_smoothing
        T = sum(len(x) - 1 for x in sents)
        total = 0.0
        for j in range(1, s.n + 1):
            lp = torch.log_softmax(self.logits(us[j - 1]), dim=-1)
            Sj = 0.0
            for b, x in enumerate(sents):
                for t in range(0, len(x) - j):
                    nll = -lp[b, t, x[t + j]]
                    ce = nll if e == 0 else (1 - e) * nll + (e / s.vocab) * (-lp[b, t].sum())
                    Sj = Sj + ce
            total = total + (0.5 if j == 1 else 0.5 / (s.n - 1)) * Sj
        return total / T, T


def batch_sentences(s, batch):
    inputs = batch["inputs"]
    targets = batch.get("targets")
    for b, x in enumerate(inputs):
        if targets is not None:
            want = list(x[1:]) + [-1]
            if list(targets[b]) != want:
                raise ValueError("sentence %d: targets must be the causal shift of the inputs" % b)
    return inputs


def loss_and_grads(s, weights, sents, dtype=torch.float32):
    params = {n: weights[n].detach().to(dtype).clone().requires_grad_(True) for n, _ in expected_tensors(s)}
    loss, T = NGram(s, params, dtype).loss(sents)
    loss.backward()
    grads = []
    for n, _ in expected_tensors(s):
        g = params[n].grad
        grads.append((n, torch.zeros_like(params[n]) if g is None else g.detach().clone()))
    return float(loss), T, grads


def fdcheck(s, weights, sents, picks=6):
    """Central differences in float64 of the loss with the conjugate's copy of W held at the given
    weights, against autograd (which stops the gradient there). Returns the worst relative error."""
    w64 = {n: weights[n].detach().to(torch.float64) for n, _ in expected_tensors(s)}
    _, _, grads = loss_and_grads(s, w64, sents, torch.float64)
    g = dict(grads)
    worst = 0.0
    gen = torch.Generator().manual_seed(7)
    overall = max(float(t.abs().max()) for t in g.values())
    for name, _ in expected_tensors(s):
        flat = w64[name].reshape(-1)
        scale = max(float(g[name].abs().max()), 1e-2 * overall)
        for k in torch.randint(0, flat.numel(), (picks,), generator=gen).tolist():
            h = 1e-6
            vals = []
            for sign in (1, -1):
                pert = {n: t.clone() for n, t in w64.items()}
                pert[name].reshape(-1)[k] += sign * h
                with torch.no_grad():
                    vals.append(float(NGram(s, pert, torch.float64, conj_weights=w64).loss(sents)[0]))
            fd = (vals[0] - vals[1]) / (2 * h)
            worst = max(worst, abs(fd - float(g[name].reshape(-1)[k])) / scale)
    return worst


# --- fixtures ------------------------------------------------------------------------------------

def spec_text(name, n, wdr, lam, tied=True, norm="post", smoothing=0.0, d_hidden=None, act="gelu", bias=True):
    t = ('name = "%s"\nfamily = "ngram"\n\n[dims]\nvocab = 29\nmax_len = 11\nd_model = 14\nheads = 2\n'
         'd_ff = 18\nlayers = 2\n\n[block]\nnorm = "%s"\nactivation = "%s"\neps = 1e-5\n\n[head]\ntied = %s\n'
         'bias = %s\n\n[ngram]\nn = %d\nwdr = %s\nensemble_lambda = %s\n'
         % (name, norm, act, str(tied).lower(), str(bias).lower(), n, str(wdr).lower(), lam))
    if d_hidden:
        t += "d_hidden = %d\n" % d_hidden
    t += "\n[train]\nlabel_smoothing = %s\n" % smoothing
    return t


CASES = [
    ("n2_wdr", dict(n=2, wdr=True, lam=0.4)),
    ("n3_wdr_pre_ls", dict(n=3, wdr=True, lam=0.2, norm="pre", smoothing=0.1, d_hidden=9)),
    ("n3_sim_untied", dict(n=3, wdr=False, lam=0.6, tied=False, act="relu")),
    ("n4_wdr_ls_nobias", dict(n=4, wdr=True, lam=0.4, smoothing=0.2, bias=False, d_hidden=7)),
    ("n4_sim_pre", dict(n=4, wdr=False, lam=0.4, norm="pre", act="gelu_tanh")),
]


def make_sentences(s, seed, count=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        L = [2, s.max_len, 3, 7, 5][i % 5]
        body = torch.randint(5, s.vocab, (L - 2,), generator=g).tolist()
        out.append([s.bos] + body + [s.eos])
    return out


def fmt_lines(results):
    return tr.to_jsonl(results)


def write_fixtures(root):
    torch.set_num_threads(1)
    for k, (name, opts) in enumerate(CASES):
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        text = spec_text(name, **opts)
        with open(os.path.join(d, "spec.toml"), "w") as f:
            f.write(text)
        s = resolve(tomllib.loads(text))
        weights = dict(init_weights(s, 11 + k))
        tr.write_safetensors(os.path.join(d, "weights.safetensors"), list(weights.items()),
                             {"name": name, "generator": "tests/golden/ngram_ref.py"})
        sents = make_sentences(s, 100 + k)
        with open(os.path.join(d, "ids.txt"), "w") as f:
            f.write("".join(" ".join(map(str, x)) + "\n" for x in sents))
        m = NGram(s, weights)
        for lam in (0.0, s.lam):
            with open(os.path.join(d, "score_l%.1f.jsonl" % lam), "w") as f:
                f.write(fmt_lines(m.score(sents, lam)))
        with open(os.path.join(d, "batch.json"), "w") as f:
            json.dump({"inputs": sents, "targets": [x[1:] + [-1] for x in sents]}, f)
        loss, T, grads = loss_and_grads(s, weights, sents)
        tr.write_safetensors(os.path.join(d, "grad.safetensors"), grads,
                             {"name": name, "generator": "tests/golden/ngram_ref.py", "loss": tr.fmt(loss)})
        worst = fdcheck(s, weights, sents)
        if worst > 1e-6:
            raise SystemExit("%s: autograd vs finite differences: worst relative error %.3g" % (name, worst))
        with open(os.path.join(d, "grad.json"), "w") as f:
            json.dump({"loss": loss, "targets": T, "fd_worst_rel_error": worst}, f)
        print("%s: loss %.6f T %d, finite differences (conjugate held fixed) worst %.2g" % (name, loss, T, worst))


def main(argv):
    torch.set_num_threads(1)
    f64 = "--f64" in argv
    dtype = torch.float64 if f64 else torch.float32
    if len(argv) >= 5 and argv[1] == "score":
        s = load_spec(argv[2])
        lam = float(argv[argv.index("--lambda") + 1]) if "--lambda" in argv else s.lam
        m = NGram(s, load_weights(argv[3], s), dtype)
        sys.stdout.write(fmt_lines(m.score(tr.read_ids(argv[4]), lam)))
        return 0
    if len(argv) >= 6 and argv[1] == "grad":
        s = load_spec(argv[2])
        with open(argv[4]) as f:
            sents = batch_sentences(s, json.load(f))
        loss, T, grads = loss_and_grads(s, load_weights(argv[3], s), sents, dtype)
        tr.write_safetensors(argv[5], grads, {"name": s.name, "generator": "tests/golden/ngram_ref.py"})
        sys.stdout.write('{"loss":%s,"targets":%d}\n' % (tr.fmt(loss), T))
        return 0
    if len(argv) >= 5 and argv[1] == "init":
        s = load_spec(argv[2])
        tr.write_safetensors(argv[4], init_weights(s, int(argv[3])), {"name": s.name})
        return 0
    if len(argv) >= 4 and argv[1] == "fdcheck":
        s = load_spec(argv[2])
        w = dict(init_weights(s, int(argv[3])))
        print("worst relative error %.3g" % fdcheck(s, w, make_sentences(s, int(argv[3]))))
        return 0
    if len(argv) >= 3 and argv[1] == "fixtures":
        write_fixtures(argv[2])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
