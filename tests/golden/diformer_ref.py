#!/usr/bin/python3
"""Independent PyTorch implementation of the Diformer contract (issue 19), written from the
issue's text, not from the C++ code: dense [n, n] visibility masks, torch.nn.functional ops,
autograd for gradients, float64 by default.

    diformer_ref.py init  SPEC SEED OUT.safetensors
    diformer_ref.py score SPEC WEIGHTS LINES      # SRC ||| TGT ||| DIRS [||| HIDE], ids
    diformer_ref.py grad  SPEC WEIGHTS BATCH.json OUT.safetensors   # prints {"loss":...,"tokens":...}
"""
import json
import math
import sys
import tomllib

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
from torch_ref import read_safetensors, write_safetensors  # noqa: E402


class Spec:
    pass


def load_spec(path):
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    if doc.get("family") != "diformer":
        raise ValueError("%s: not a diformer spec" % path)
    s = Spec()
    s.name = doc["name"]
    d = doc["dims"]
    s.V, s.L, s.D = d["vocab"], d["max_len"], d["d_model"]
    enc, dec = doc.get("encoder", {}), doc.get("decoder", {})
    s.enc_layers, s.enc_heads, s.enc_ff = enc.get("layers", d["layers"]), enc.get("heads", d["heads"]), enc.get("d_ff", d["d_ff"])
    s.dec_layers, s.dec_heads, s.dec_ff = dec.get("layers", d["layers"]), dec.get("heads", d["heads"]), dec.get("d_ff", d["d_ff"])
    s.norm = doc.get("embedding", {}).get("norm", False)
    s.k = doc.get("attention", {}).get("relative_positions", 16)
    blk = doc.get("block", {})
    s.act = blk.get("activation", "gelu")
    s.eps = blk.get("eps", 1e-12)
    s.pre = blk.get("norm", "post") == "pre"
    s.head_bias = doc.get("head", {}).get("bias", True)
    t = doc.get("tokens", {})
    s.bos, s.eos = t.get("bos", 3), t.get("eos", 1)
    s.length_loss = doc.get("diformer", {}).get("length_loss", 0.1)
    return s


def expected_tensors(s):
    V, L, D = s.V, s.L, s.D
    out = [("embed.token", [V, D]), ("embed.position", [L, D])]
    if s.norm:
        out += [("embed.norm.weight", [D]), ("embed.norm.bias", [D])]

    def attn(p):
        return [(p + "." + x + "." + y, [D, D] if y == "weight" else [D]) for x in "qkvo" for y in ("weight", "bias")]

    def norm(p):
        return [(p + ".weight", [D]), (p + ".bias", [D])]

    def ffn(p, ff):
        return [(p + ".in.weight", [ff, D]), (p + ".in.bias", [ff]), (p + ".out.weight", [D, ff]), (p + ".out.bias", [D])]

    for i in range(s.enc_layers):
        p = "encoder.layers.%d" % i
        out += attn(p + ".attn") + norm(p + ".attn_norm") + ffn(p + ".ffn", s.enc_ff) + norm(p + ".ffn_norm")
    if s.pre:
        out += norm("encoder.final_norm")
    out += [("length.weight", [L, D]), ("decoder.direction", [3, D]), ("decoder.position.l2r", [L, D]),
            ("decoder.position.r2l", [L, D])]
    if s.norm:
        out += norm("decoder.embed_norm")
    dh = D // s.dec_heads
    for i in range(s.dec_layers):
        p = "decoder.layers.%d" % i
        out += attn(p + ".attn")
        if s.k > 0:
            out += [(p + ".attn.rel_k", [2 * s.k + 1, dh]), (p + ".attn.rel_v", [2 * s.k + 1, dh])]
        out += norm(p + ".attn_norm") + attn(p + ".cross") + norm(p + ".cross_norm") + ffn(p + ".ffn", s.dec_ff)
        out += norm(p + ".ffn_norm")
    if s.pre:
        out += norm("decoder.final_norm")
    if s.head_bias:
        out.append(("head.bias", [V]))
    return out


def init_weights(s, seed):
    """Non-trivial random weights: peaked attention, log-probs far from uniform."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in expected_tensors(s):
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias") or name == "head.bias":
            t = 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 2 and name.split(".")[-2] in "qkvo" or ".ffn." in name:
            scale = (1.0 if name.split(".")[-2] in "qk" else 0.8) / math.sqrt(shape[1])
            t = scale * torch.randn(shape, generator=g)
        else:  # embeddings, position/direction tables, relative tables, length head
            t = 0.5 * torch.randn(shape, generator=g)
        out.append((name, t.to(torch.float32)))
    return out


def act(s, x):
    if s.act == "relu":
        return F.relu(x)
    return F.gelu(x, approximate="tanh" if s.act == "gelu_tanh" else "none")


def ln(W, p, x, s):
    return F.layer_norm(x, (x.shape[-1],), W[p + ".weight"], W[p + ".bias"], s.eps)


def lin(W, p, x):
    return F.linear(x, W[p + ".weight"], W[p + ".bias"])


def mha(W, p, heads, q_in, kv_in, visible=None, rel=None):
    """visible: bool [r, m] or None (all); rel: (rel_k, rel_v, idx [r, m]) or None."""
    D = q_in.shape[-1]
    dh = D // heads
    Q = lin(W, p + ".q", q_in).view(-1, heads, dh).transpose(0, 1)   # [H, r, dh]
    K = lin(W, p + ".k", kv_in).view(-1, heads, dh).transpose(0, 1)  # [H, m, dh]
    Vv = lin(W, p + ".v", kv_in).view(-1, heads, dh).transpose(0, 1)
    e = Q @ K.transpose(1, 2)                                         # [H, r, m]
    if rel is not None:
        rk, rv, idx = rel
        e = e + torch.einsum("hid,ijd->hij", Q, rk[idx])
    e = e / math.sqrt(dh)
    if visible is not None:
        e = e.masked_fill(~visible, float("-inf"))
    a = torch.softmax(e, dim=-1)
    a = torch.nan_to_num(a, nan=0.0)  # a row with no visible key
    out = a @ Vv
    if rel is not None:
        out = out + torch.einsum("hij,ijd->hid", a, rv[idx])
    return lin(W, p + ".o", out.transpose(0, 1).reshape(-1, D))


def block(s, W, norm, x, sublayer):
    """Post-norm: norm(x + f(x)); pre-norm: x + f(norm(x))."""
    if s.pre:
        return x + sublayer(ln(W, norm, x, s))
    return ln(W, norm, x + sublayer(x), s)


def encoder(s, W, src):
    x = W["embed.token"][src] + W["embed.position"][: len(src)]
    if s.norm:
        x = ln(W, "embed.norm", x, s)
    for i in range(s.enc_layers):
        p = "encoder.layers.%d" % i
        x = block(s, W, p + ".attn_norm", x, lambda h: mha(W, p + ".attn", s.enc_heads, h, h))
        x = block(s, W, p + ".ffn_norm", x, lambda h: lin(W, p + ".ffn.out", act(s, lin(W, p + ".ffn.in", h))))
    if s.pre:
        x = ln(W, "encoder.final_norm", x, s)
    return x


def forward(s, W, src, tgt, dirs, hide):
    """Returns (token log-probs [n] (0 for '-'), target-row mask, length log-prob)."""
    src = torch.tensor(src)
    tgt_t = torch.tensor(tgt)
    n = len(tgt)
    mem = encoder(s, W, src)
    length_lp = torch.log_softmax(W["length.weight"] @ mem.mean(0), dim=0)[n]
    rows = [i for i in range(n) if dirs[i] != "-"]
    if not rows:  # nothing to score
        return torch.zeros(n, dtype=mem.dtype), length_lp
    dir_index = {"R": 0, "L": 1, "S": 2}
    q = torch.stack([W["decoder.direction"][dir_index[dirs[i]]] +
                     (W["decoder.position.r2l"][n - 1 - i] if dirs[i] == "L" else W["decoder.position.l2r"][i])
                     for i in rows])
    if s.norm:
        q = ln(W, "decoder.embed_norm", q, s)
    vis = torch.zeros(len(rows), n, dtype=torch.bool)
    for r, i in enumerate(rows):
        for j in range(n):
            if dirs[i] == "R":
                vis[r, j] = j <= i
            elif dirs[i] == "L":
                vis[r, j] = j >= i
            else:
                vis[r, j] = j != i and j not in hide[i]
    idx = torch.tensor([[max(-s.k, min(s.k, j - i)) + s.k for j in range(n)] for i in rows])
    words = W["embed.token"][tgt_t]
    for l in range(s.dec_layers):
        p = "decoder.layers.%d" % l
        rel = (W[p + ".attn.rel_k"], W[p + ".attn.rel_v"], idx) if s.k > 0 else None
        q = block(s, W, p + ".attn_norm", q, lambda h: mha(W, p + ".attn", s.dec_heads, h, words, vis, rel))
        q = block(s, W, p + ".cross_norm", q, lambda h: mha(W, p + ".cross", s.dec_heads, h, mem))
        q = block(s, W, p + ".ffn_norm", q, lambda h: lin(W, p + ".ffn.out", act(s, lin(W, p + ".ffn.in", h))))
    if s.pre:
        q = ln(W, "decoder.final_norm", q, s)
    logits = q @ W["embed.token"].T
    if s.head_bias:
        logits = logits + W["head.bias"]
    lp = torch.log_softmax(logits, dim=-1)
    tau = [tgt[i + 1] if dirs[i] == "R" else tgt[i - 1] if dirs[i] == "L" else tgt[i] for i in rows]
    picked = lp[torch.arange(len(rows)), torch.tensor(tau)]
    token_lp = torch.zeros(n, dtype=lp.dtype)
    token_lp = token_lp.index_put((torch.tensor(rows, dtype=torch.long),), picked)
    return token_lp, length_lp


def expand_dirs(text, n):
    if text == "l2r":
        return "R" * (n - 1) + "-"
    if text == "r2l":
        return "-" + "L" * (n - 1)
    if text == "pll":
        return "-" + "S" * (n - 2) + "-"
    return text


def parse_line(line, n_line):
    parts = [p.strip() for p in line.split("|||")]
    src = [int(x) for x in parts[0].split()]
    tgt = [int(x) for x in parts[1].split()]
    dirs = expand_dirs(parts[2], len(tgt))
    h = set(int(x) for x in parts[3].split()) if len(parts) > 3 else set()
    hide = [sorted(h - {i}) if dirs[i] == "S" else [] for i in range(len(tgt))]
    return src, tgt, dirs, hide


def weights_as(W, dtype, grad=False):
    return {k: v.to(dtype).clone().requires_grad_(grad) for k, v in W.items()}


def score_lines(s, W, lines, dtype=torch.float64):
    Wd = weights_as(W, dtype)
    out = []
    with torch.no_grad():
        for no, line in enumerate(lines):
            src, tgt, dirs, hide = parse_line(line, no + 1)
            tok, length_lp = forward(s, Wd, src, tgt, dirs, hide)
            out.append({"token_logprobs": [float(x) for x in tok], "score": float(tok.sum()),
                        "n_scored": sum(d != "-" for d in dirs), "length_logprob": float(length_lp)})
    return out


def loss_and_grads(s, W, batch, dtype=torch.float64):
    """batch: {"src","tgt","dirs","hide"}; loss = sum NLL / sum n + length_loss * mean length NLL."""
    Wd = weights_as(W, dtype, grad=True)
    tok_nll, len_nll, tokens = 0, 0, 0
    for src, tgt, dirs, hide in zip(batch["src"], batch["tgt"], batch["dirs"], batch["hide"]):
        tok, length_lp = forward(s, Wd, src, tgt, dirs, hide)
        tok_nll = tok_nll - tok.sum()
        len_nll = len_nll - length_lp
        tokens += len(tgt)
    B = len(batch["src"])
    loss = tok_nll / tokens + s.length_loss * len_nll / B
    loss.backward()
    grads = [(n, Wd[n].grad if Wd[n].grad is not None else torch.zeros_like(Wd[n])) for n, _ in expected_tensors(s)]
    return float(loss), tokens, grads


def fmt(v):
    return "%.9g" % v


def main(argv):
    cmd = argv[1]
    s = load_spec(argv[2])
    if cmd == "init":
        write_safetensors(argv[4], init_weights(s, int(argv[3])), {"name": s.name})
        return 0
    W, _ = read_safetensors(argv[3])
    if cmd == "score":
        with open(argv[4]) as f:
            lines = [l for l in f.read().split("\n") if l.strip()]
        for r in score_lines(s, W, lines):
            print(json.dumps(r))
        return 0
    if cmd == "grad":
        with open(argv[4]) as f:
            batch = json.load(f)
        loss, tokens, grads = loss_and_grads(s, W, batch)
        write_safetensors(argv[5], grads, {"name": s.name})
        print('{"loss":%s,"tokens":%d}' % (fmt(loss), tokens))
        return 0
    raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
