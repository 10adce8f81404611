#!/usr/bin/python3
"""Independent PyTorch implementation of the lmcc model semantics (runtime/SEMANTICS.md).

Used to write the golden fixtures the C++ reference executor is tested against
(tests/golden/make_golden.py). Written from SEMANTICS.md, not from the C++ code.

Usage:
  torch_ref.py score SPEC WEIGHTS IDS   one JSON object per input line:
                                        {"token_logprobs":[...],"score":S,"n_scored":K}
  torch_ref.py embed SPEC WEIGHTS IDS   {"embedding":[...]}
  torch_ref.py init  SPEC SEED OUT.safetensors [--dtype F32|F16|BF16]
                                        random canonical weights (non-trivial scales)
  torch_ref.py grad  SPEC WEIGHTS BATCH.json OUT.safetensors
                                        {"loss":L,"targets":T}; OUT = d loss / d tensor, canonical names
  torch_ref.py train SPEC WEIGHTS BATCHES.jsonl OUT_DIR [--steps K]
                                        {"step":s,"loss":L,"lr":r,"grad_norm":g} per step;
                                        writes OUT_DIR/weights.safetensors

Training follows issue 14's contract (the [train] table; see train_loss / train below).
BATCH.json: {"inputs":[[...],...],"targets":[[...],...]} (ragged, one list per sentence,
target -1 = no prediction); BATCHES.jsonl: one such object per line, cycled when K is larger.

IDS: one sentence per line, space-separated token ids (bos/eos included as given).
Numbers are printed with 9 significant digits ("%.9g"). Compute is float32
(pass --f64 to score/embed to compute in float64, for conditioning checks).
"""
import json
import math
import os
import struct
import sys
import tomllib

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------
# Spec
# ----------------------------------------------------------------------------

FAMILY_DEFAULTS = {
    "unilm": dict(mask="causal", keys_values="hidden", first_query="embedding", method="causal"),
    "bilm": dict(mask="none", keys_values="hidden", first_query="embedding", method="mask-and-predict"),
    "tta": dict(mask="diagonal", keys_values="embedding", first_query="position", method="single-pass"),
}

_CHOICES = {
    "position": ("learned", "sinusoidal", "none"),
    "mask": ("none", "causal", "anticausal", "diagonal", "directional"),
    "keys_values": ("hidden", "embedding"),
    "first_query": ("embedding", "position", "mask+position"),
    "activation": ("gelu", "gelu_tanh", "relu"),
    "norm": ("post", "pre"),
    "method": ("causal", "mask-and-predict", "single-pass"),
}


class Spec:
    """The resolved spec: flat attributes, every default filled in."""

    def __repr__(self):
        return "Spec(%r)" % self.__dict__


def resolve_spec(doc):
    family = doc.get("family", "tta")
    if family not in FAMILY_DEFAULTS:
        raise ValueError("torch_ref supports families unilm, bilm, tta (got %r)" % family)
    fd = FAMILY_DEFAULTS[family]
    dims = doc.get("dims", {})
    emb = doc.get("embedding", {})
    att = doc.get("attention", {})
    blk = doc.get("block", {})
    head = doc.get("head", {})
    tok = doc.get("tokens", {})
    sc = doc.get("score", {})
    s = Spec()
    s.name = doc.get("name", "model")
    s.family = family
    s.vocab = int(dims["vocab"])
    s.max_len = int(dims["max_len"])
    s.d_model = int(dims["d_model"])
    s.heads = int(dims["heads"])
    s.d_ff = int(dims["d_ff"])
    s.layers = int(dims["layers"])
    if s.d_model % s.heads:
        raise ValueError("d_model must be a multiple of heads")
    s.position = emb.get("position", "learned")
    s.embedding_norm = bool(emb.get("norm", True))
    s.mask = att.get("mask", fd["mask"])
    s.keys_values = att.get("keys_values", fd["keys_values"])
    s.first_query = att.get("first_query", fd["first_query"])
    s.relative_positions = int(att.get("relative_positions", 0))
    s.activation = blk.get("activation", "gelu")
    s.norm = blk.get("norm", "post")
    s.eps = float(blk.get("eps", 1e-12))
    s.head_transform = bool(head.get("transform", True))
    s.tied = bool(head.get("tied", True))
    s.head_bias = bool(head.get("bias", True))
    s.pad = int(tok.get("pad", 0))
    s.eos = int(tok.get("eos", 1))
    s.unk = int(tok.get("unk", 2))
    s.bos = int(tok.get("bos", 3))
    s.mask_id = int(tok.get("mask", 4))
    s.method = sc.get("method", fd["method"])
    s.skip_special = bool(sc.get("skip_special", True))
    for key in _CHOICES:
        val = getattr(s, key)
        if val not in _CHOICES[key]:
            raise ValueError("bad value %r for %s" % (val, key))
    if s.mask == "directional":
        raise ValueError("mask 'directional' is not part of the unilm/bilm/tta semantics")
    s.train_given = "train" in doc
    s.train = resolve_train(doc.get("train", {}), s)
    return s


# [train] (issue 14): every key, its default, and its kind.
TRAIN_DEFAULTS = {
    "objective": "auto", "optimizer": "adamw", "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6,
    "weight_decay": 0.01, "warmup_steps": 0, "schedule": "linear", "steps": 1000, "clip_norm": 1.0,
    "dropout": 0.0, "attention_dropout": 0.0, "label_smoothing": 0.0, "mask_prob": 0.15, "max_masks": 20,
    "mask_replace": "mask", "seed": 1,
}
_TRAIN_CHOICES = {
    "objective": ("auto", "causal", "masked", "autoencoding"),
    "optimizer": ("adamw", "adam", "sgd"),
    "schedule": ("linear", "constant", "cosine"),
    "mask_replace": ("mask", "bert"),
}
_FAMILY_OBJECTIVE = {"unilm": "causal", "bilm": "masked", "tta": "autoencoding"}


def resolve_train(t, s):
    """The [train] table with the contract's defaults; raises ValueError on unknown keys or bad values."""
    unknown = sorted(set(t) - set(TRAIN_DEFAULTS))
    if unknown:
        raise ValueError("train: unknown key(s) %s" % unknown)
    tr = Spec()
    for key, default in TRAIN_DEFAULTS.items():
        val = t.get(key, default)
        if isinstance(default, str):
            if val not in _TRAIN_CHOICES[key]:
                raise ValueError("train.%s: bad value %r (one of %s)" % (key, val, _TRAIN_CHOICES[key]))
        elif isinstance(default, list):
            if (not isinstance(val, list) or len(val) != 2
                    or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in val)):
                raise ValueError("train.%s: expected an array of two numbers" % key)
            val = [float(b) for b in val]
        elif isinstance(default, int):
            if not isinstance(val, int) or isinstance(val, bool):
                raise ValueError("train.%s: expected an integer" % key)
        else:
            if not isinstance(val, (int, float)) or isinstance(val, bool) or not math.isfinite(val):
                raise ValueError("train.%s: expected a finite number" % key)
            val = float(val)
        setattr(tr, key, val)
    tr.beta1, tr.beta2 = tr.betas
    checks = [
        ("lr", tr.lr >= 0), ("betas", 0 <= tr.beta1 < 1 and 0 <= tr.beta2 < 1), ("eps", tr.eps > 0),
        ("weight_decay", tr.weight_decay >= 0), ("warmup_steps", tr.warmup_steps >= 0), ("steps", tr.steps >= 1),
        ("clip_norm", tr.clip_norm >= 0), ("dropout", 0 <= tr.dropout < 1),
        ("attention_dropout", 0 <= tr.attention_dropout < 1), ("label_smoothing", 0 <= tr.label_smoothing <= 1),
        ("mask_prob", 0 < tr.mask_prob <= 1), ("max_masks", tr.max_masks >= 1), ("seed", 0 <= tr.seed < 2 ** 32),
    ]
    for key, ok in checks:
        if not ok:
            raise ValueError("train.%s: value out of range" % key)
    tr.resolved_objective = _FAMILY_OBJECTIVE[s.family] if tr.objective == "auto" else tr.objective
    if tr.resolved_objective == "causal" and s.mask != "causal":
        raise ValueError("train.objective: causal needs mask = causal")
    if tr.resolved_objective == "autoencoding" and s.method != "single-pass":
        raise ValueError("train.objective: autoencoding needs a single-pass model (T-TA)")
    return tr


def load_spec(path):
    with open(path, "rb") as f:
        return resolve_spec(tomllib.load(f))


# ----------------------------------------------------------------------------
# Canonical tensors
# ----------------------------------------------------------------------------

def expected_tensors(s):
    """[(name, shape)] of the canonical tensors the spec needs, in a stable order."""
    V, L, D, Fd, dh = s.vocab, s.max_len, s.d_model, s.d_ff, s.d_model // s.heads
    out = [("embed.token", [V, D])]
    if s.position == "learned":
        out.append(("embed.position", [L, D]))
    if s.embedding_norm:
        out += [("embed.norm.weight", [D]), ("embed.norm.bias", [D])]
    for i in range(s.layers):
        p = "layers.%d." % i
        for m in "qkvo":
            out += [(p + "attn.%s.weight" % m, [D, D]), (p + "attn.%s.bias" % m, [D])]
        if s.relative_positions > 0:
            k = s.relative_positions
            out += [(p + "attn.rel_k", [2 * k + 1, dh]), (p + "attn.rel_v", [2 * k + 1, dh])]
        out += [(p + "attn_norm.weight", [D]), (p + "attn_norm.bias", [D])]
        out += [(p + "ffn.in.weight", [Fd, D]), (p + "ffn.in.bias", [Fd])]
        out += [(p + "ffn.out.weight", [D, Fd]), (p + "ffn.out.bias", [D])]
        out += [(p + "ffn_norm.weight", [D]), (p + "ffn_norm.bias", [D])]
    if s.norm == "pre":
        out += [("final_norm.weight", [D]), ("final_norm.bias", [D])]
    if s.head_transform:
        out += [("head.transform.weight", [D, D]), ("head.transform.bias", [D])]
        out += [("head.norm.weight", [D]), ("head.norm.bias", [D])]
    if not s.tied:
        out.append(("head.output.weight", [V, D]))
    if s.head_bias:
        out.append(("head.bias", [V]))
    return out


# ----------------------------------------------------------------------------
# Safetensors (own small reader / writer)
# ----------------------------------------------------------------------------

_DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def read_safetensors(path):
    """Returns ({name: float32 torch tensor}, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    data = raw[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dt, shape, (b, e) = info["dtype"], list(info["shape"]), info["data_offsets"]
        if dt not in _DTYPE_SIZE:
            raise ValueError("%s: tensor %r: unsupported dtype %s" % (path, name, dt))
        n = int(np.prod(shape)) if shape else 1
        if e - b != n * _DTYPE_SIZE[dt] or e > len(data):
            raise ValueError("%s: tensor %r: bad data_offsets" % (path, name))
        buf = data[b:e]
        if dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        else:  # BF16: the upper 16 bits of a float32
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        tensors[name] = torch.from_numpy(arr.reshape(shape).copy())
    return tensors, meta


def _to_bytes(t, dtype):
    a = t.detach().cpu().to(torch.float32).contiguous().numpy()
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":  # round to nearest even
        u = a.astype("<f4").view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype("<u2").tobytes()
    raise ValueError("unsupported dtype %s" % dtype)


def write_safetensors(path, tensors, metadata=None, dtype="F32"):
    """tensors: list of (name, tensor) (order kept)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, off = [], 0
    for name, t in tensors:
        b = _to_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # align the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def load_weights(path, s):
    tensors, _ = read_safetensors(path)
    for name, shape in expected_tensors(s):
        if name not in tensors:
            raise ValueError("%s: tensor %r: missing" % (path, name))
        if list(tensors[name].shape) != shape:
            raise ValueError("%s: tensor %r: shape %s, expected %s" % (path, name, list(tensors[name].shape), shape))
    extra = set(tensors) - {n for n, _ in expected_tensors(s)}
    if extra:
        raise ValueError("%s: unexpected tensors %s" % (path, sorted(extra)))
    return tensors


def init_weights(s, seed):
    """Random canonical weights with scales chosen so outputs are far from flat."""
    g = torch.Generator().manual_seed(int(seed))

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    out = []
    for name, shape in expected_tensors(s):
        last = name.rsplit(".", 1)[-1]
        is_norm = ".norm." in name or "_norm." in name or name.startswith("final_norm.")
        if is_norm and last == "weight":
            t = normal(shape, 0.1, 1.0)
        elif last == "bias":
            t = normal(shape, 0.1)
        elif name in ("embed.token", "embed.position", "head.output.weight"):
            t = normal(shape, 0.5)
        elif name.endswith("rel_k") or name.endswith("rel_v"):
            t = normal(shape, 0.5)
        elif name.endswith("attn.q.weight") or name.endswith("attn.k.weight"):
            t = normal(shape, 1.0 / math.sqrt(shape[1]))  # peaky enough attention
        else:  # other linear weights [out, in]
            t = normal(shape, 0.8 / math.sqrt(shape[1]))
        out.append((name, t))
    return out


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

class Model:
    def __init__(self, s, weights, dtype=torch.float32):
        self.s = s
        self.dtype = dtype
        self.w = {k: v.to(dtype) for k, v in weights.items()}
        D, L = s.d_model, s.max_len
        if s.position == "learned":
            self.P = self.w["embed.position"]
        elif s.position == "sinusoidal":
            t = torch.arange(L, dtype=torch.float64)[:, None]
            i2 = torch.arange(0, D, 2, dtype=torch.float64)[None, :]  # 2i
            ang = t / torch.pow(torch.tensor(10000.0, dtype=torch.float64), i2 / D)
            P = torch.zeros(L, D, dtype=torch.float64)
            P[:, 0::2] = torch.sin(ang)
            P[:, 1::2] = torch.cos(ang[:, : D // 2])
            self.P = P.to(torch.float32).to(dtype)  # the table is float32 data
        else:
            self.P = torch.zeros(L, D, dtype=dtype)

    # -- pieces -------------------------------------------------------------
    def ln(self, x, prefix):
        return F.layer_norm(x, (x.shape[-1],), self.w[prefix + ".weight"], self.w[prefix + ".bias"], self.s.eps)

    def norm_e(self, x):
        return self.ln(x, "embed.norm") if self.s.embedding_norm else x

    def lin(self, x, prefix):
        return F.linear(x, self.w[prefix + ".weight"], self.w[prefix + ".bias"])

    def act(self, x):
        a = self.s.activation
        if a == "gelu":
            return F.gelu(x)  # exact erf form
        if a == "gelu_tanh":
            return F.gelu(x, approximate="tanh")
        return F.relu(x)

    def visible(self, n, lens):
        """[B, n, n] bool: key j visible to query i."""
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        m = self.s.mask
        if m == "none":
            allow = torch.ones(n, n, dtype=torch.bool)
        elif m == "causal":
            allow = j <= i
        elif m == "anticausal":
            allow = j >= i
        elif m == "diagonal":
            allow = j != i
        else:
            raise ValueError(m)
        inlen = torch.arange(n)[None, None, :] < lens[:, None, None]  # j < n_b
        return allow[None, :, :] & inlen

    def attention(self, li, q_in, kv_in, vis):
        s = self.s
        B, n, D = q_in.shape
        H, dh = s.heads, D // s.heads
        p = "layers.%d.attn." % li
        Q = self.lin(q_in, p + "q").view(B, n, H, dh).transpose(1, 2)  # [B,H,n,dh]
        K = self.lin(kv_in, p + "k").view(B, n, H, dh).transpose(1, 2)
        Vv = self.lin(kv_in, p + "v").view(B, n, H, dh).transpose(1, 2)
        S = Q @ K.transpose(-1, -2)  # [B,H,n,n]
        k = s.relative_positions
        if k > 0:
            idx = torch.arange(n)
            r = (idx[None, :] - idx[:, None]).clamp(-k, k) + k  # r[i, j]
            relk = self.w[p + "rel_k"][r]  # [n,n,dh]
            relv = self.w[p + "rel_v"][r]
            S = S + torch.einsum("bhid,ijd->bhij", Q, relk)
        S = S / math.sqrt(dh)
        v4 = vis[:, None, :, :].expand(B, H, n, n)
        rowany = v4.any(dim=-1, keepdim=True)
        S = S.masked_fill(~v4, float("-inf"))
        S = S.masked_fill(~rowany, 0.0)  # rows with no visible key: finite, zeroed below
        Pm = torch.softmax(S, dim=-1) * v4.to(S.dtype)  # no visible key -> all-zero row
        ctx = Pm @ Vv
        if k > 0:
            ctx = ctx + torch.einsum("bhij,ijd->bhid", Pm, relv)
        ctx = ctx.transpose(1, 2).reshape(B, n, D)
        return self.lin(ctx, p + "o")

    def ffn(self, li, x):
        p = "layers.%d.ffn." % li
        return self.lin(self.act(self.lin(x, p + "in")), p + "out")

    # -- whole model --------------------------------------------------------
    def hidden(self, ids, lens):
        """ids [B, n] long (padded), lens [B] -> last hidden states [B, n, D]
        (after final_norm for pre-norm). Rows at or past a sentence's length are junk."""
        s = self.s
        B, n = ids.shape
        E = self.w["embed.token"]
        P = self.P[:n][None, :, :]
        X = self.norm_e(E[ids] + P)
        if s.first_query == "embedding":
            h = X
        elif s.first_query == "position":
            h = self.norm_e(P).expand(B, n, s.d_model)
        else:  # mask+position
            h = self.norm_e(E[s.mask_id][None, None, :] + P).expand(B, n, s.d_model)
        vis = self.visible(n, lens)
        for li in range(s.layers):
            p = "layers.%d." % li
            if s.norm == "post":
                q_in = h
                kv_in = h if s.keys_values == "hidden" else X
                a = self.ln(h + self.attention(li, q_in, kv_in, vis), p + "attn_norm")
                h = self.ln(a + self.ffn(li, a), p + "ffn_norm")
            else:
                q_in = self.ln(h, p + "attn_norm")
                kv_in = q_in if s.keys_values == "hidden" else X
                a = h + self.attention(li, q_in, kv_in, vis)
                h = a + self.ffn(li, self.ln(a, p + "ffn_norm"))
        if s.norm == "pre":
            h = self.ln(h, "final_norm")
        return h

    def head_logprobs(self, h):
        s = self.s
        t = h
        if s.head_transform:
            t = self.ln(self.act(self.lin(h, "head.transform")), "head.norm")
        Wout = self.w["embed.token"] if s.tied else self.w["head.output.weight"]
        logits = t @ Wout.T
        if s.head_bias:
            logits = logits + self.w["head.bias"]
        return torch.log_softmax(logits, dim=-1)

    # -- batching helpers ---------------------------------------------------
    def _check(self, sents):
        for x in sents:
            if not (1 <= len(x) <= self.s.max_len):
                raise ValueError("sentence length %d outside [1, %d]" % (len(x), self.s.max_len))
            for t in x:
                if not (0 <= t < self.s.vocab):
                    raise ValueError("token id %d outside [0, %d)" % (t, self.s.vocab))

    def _pad(self, sents):
        n = max(len(x) for x in sents)
        ids = torch.full((len(sents), n), self.s.pad, dtype=torch.long)
        for b, x in enumerate(sents):
            ids[b, : len(x)] = torch.tensor(x, dtype=torch.long)
        lens = torch.tensor([len(x) for x in sents], dtype=torch.long)
        return ids, lens

    def run_hidden(self, sents):
        """Last hidden states per sentence, [n_b, D] each (one padded batch)."""
        ids, lens = self._pad(sents)
        h = self.hidden(ids, lens)
        return [h[b, : len(x)] for b, x in enumerate(sents)]

    def per_position_states(self, x):
        """[n, D] states, and [n, V] log-probs, that score/embed use for each position of x:
        one pass, or under mask-and-predict row i of the copy with x_i masked."""
        n = len(x)
        if self.s.method == "mask-and-predict":
            copies = []
            for i in range(n):
                c = list(x)
                c[i] = self.s.mask_id
                copies.append(c)
            hs = self.run_hidden(copies)
            H = torch.stack([hs[i][i] for i in range(n)])
        else:
            H = self.run_hidden([x])[0]
        return H, self.head_logprobs(H)

    # -- entry points -------------------------------------------------------
    def score(self, sents):
        self._check(sents)
        s = self.s
        out = []
        for x in sents:
            n = len(x)
            _, LP = self.per_position_states(x)
            lp = [0.0] * n
            counted = [False] * n
            for t in range(n):
                if s.method == "causal":
                    if t == 0:
                        continue
                    val = LP[t - 1, x[t]]
                else:
                    val = LP[t, x[t]]
                if s.skip_special and x[t] in (s.bos, s.eos):
                    continue
                lp[t] = float(val)  # exact: a float32 (or float64 with --f64) value
                counted[t] = True
            out.append({"token_logprobs": lp, "score": float(sum(lp)), "n_scored": int(sum(counted))})
        return out

    def embed(self, sents):
        self._check(sents)
        s = self.s
        out = []
        for x in sents:
            H, _ = self.per_position_states(x)
            keep = [t for t in range(len(x)) if x[t] not in (s.bos, s.eos)]
            if not keep:
                keep = list(range(len(x)))
            v = H[keep].mean(dim=0)
            out.append({"embedding": [float(a) for a in v]})
        return out


# ----------------------------------------------------------------------------
# Training (issue 14's contract)
# ----------------------------------------------------------------------------

def objective_example(s, x, rng):
    """(inputs, targets) for sentence x under the spec's resolved objective; rng is a random.Random.
    Special positions are those holding bos or eos."""
    tr = s.train
    special = {s.bos, s.eos}
    n = len(x)
    obj = tr.resolved_objective
    if obj == "causal":
        return list(x), [x[i + 1] if i + 1 < n else -1 for i in range(n)]
    if obj == "autoencoding":
        return list(x), [-1 if x[i] in special else x[i] for i in range(n)]
    cand = [i for i in range(n) if x[i] not in special]
    chosen = [i for i in cand if rng.random() < tr.mask_prob]
    if not chosen and cand:
        chosen = [rng.choice(cand)]
    if len(chosen) > tr.max_masks:
        chosen = sorted(rng.sample(chosen, tr.max_masks))
    inputs, targets = list(x), [-1] * n
    for i in chosen:
        targets[i] = x[i]
        if tr.mask_replace == "mask":
            inputs[i] = s.mask_id
        else:  # bert: 80% [MASK], 10% a random token, 10% unchanged
            r = rng.random()
            if r < 0.8:
                inputs[i] = s.mask_id
            elif r < 0.9:
                inputs[i] = rng.randrange(s.vocab)
    return inputs, targets


def check_batch(s, batch):
    """Validates {"inputs":[[...]],"targets":[[...]]}; returns (inputs, targets) as lists of lists."""
    if not isinstance(batch, dict) or set(batch) != {"inputs", "targets"}:
        raise ValueError("a batch is an object with exactly the keys \"inputs\" and \"targets\"")
    inputs, targets = batch["inputs"], batch["targets"]
    if not inputs or len(inputs) != len(targets):
        raise ValueError("inputs and targets must be non-empty lists of the same length")
    n_targets = 0
    for b, (x, t) in enumerate(zip(inputs, targets)):
        if len(x) != len(t):
            raise ValueError("sentence %d: %d inputs but %d targets" % (b, len(x), len(t)))
        if not (1 <= len(x) <= s.max_len):
            raise ValueError("sentence %d: length %d outside [1, %d]" % (b, len(x), s.max_len))
        for v in x:
            if not (isinstance(v, int) and 0 <= v < s.vocab):
                raise ValueError("sentence %d: input id %r outside [0, %d)" % (b, v, s.vocab))
        for v in t:
            if not (isinstance(v, int) and -1 <= v < s.vocab):
                raise ValueError("sentence %d: target %r outside [-1, %d)" % (b, v, s.vocab))
            n_targets += v >= 0
    if n_targets == 0:
        raise ValueError("the batch has no target")
    return inputs, targets


def batch_loss(model, inputs, targets):
    """(loss, T): row i of the last layer, through the head as in scoring's single forward pass
    (one padded batch), predicts targets[i]; loss = (1/T) sum_i CE_i over the T rows with a target,
    CE_i = -(1-e) log p(target) - (e/V) sum_v log p(v), e = label_smoothing."""
    s = model.s
    ids, lens = model._pad(inputs)
    B, n = ids.shape
    tgt = torch.full((B, n), -1, dtype=torch.long)
    for b, t in enumerate(targets):
        tgt[b, : len(t)] = torch.tensor(t, dtype=torch.long)
    sel = tgt >= 0
    T = int(sel.sum())
    h = model.hidden(ids, lens)  # [B, n, D]
    LP = model.head_logprobs(h[sel])  # [T, V], rows in (sentence, position) order
    t = tgt[sel]
    nll = -LP.gather(1, t[:, None]).squeeze(1)
    e = s.train.label_smoothing
    ce = nll if e == 0 else (1 - e) * nll + (e / s.vocab) * (-LP.sum(dim=1))
    return ce.sum() / T, T


def _leaves(s, weights, dtype):
    return {name: weights[name].detach().to(dtype).clone().requires_grad_(True) for name, _ in expected_tensors(s)}


def _grads_or_zeros(s, params):
    """Every canonical tensor's gradient; a tensor the batch does not reach gets zeros."""
    out = []
    for name, _ in expected_tensors(s):
        p = params[name]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        out.append((name, p.grad))
    return out


def loss_and_grads(s, weights, batch, dtype=torch.float32):
    """(loss, T, [(name, gradient)]) for one batch, by autograd."""
    inputs, targets = check_batch(s, batch)
    params = _leaves(s, weights, dtype)
    loss, T = batch_loss(Model(s, params, dtype), inputs, targets)
    loss.backward()
    return float(loss), T, [(n, g.detach().clone()) for n, g in _grads_or_zeros(s, params)]


def schedule_factor(tr, step):
    """Hugging Face's get_{linear,constant,cosine}_schedule_with_warmup lambdas (cosine: num_cycles 0.5)."""
    w, total = tr.warmup_steps, tr.steps
    if step < w:
        return float(step) / float(max(1, w))
    if tr.schedule == "constant":
        return 1.0
    if tr.schedule == "linear":
        return max(0.0, float(total - step) / float(max(1, total - w)))
    progress = float(step - w) / float(max(1, total - w))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


class Optimizer:
    """torch.optim.{AdamW,Adam,SGD} over named tensors (leaves) in two groups, weight decay on
    rank >= 2 tensors only; torch.nn.utils.clip_grad_norm_ (clip_norm 0 = off); the Hugging Face
    schedule through LambdaLR, so update s (0-based) uses lr * schedule_factor(s)."""

    def __init__(self, tr, named):
        self.tr = tr
        self.params = [p for _, p in named]
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        groups = [g for g in ({"params": decay, "weight_decay": tr.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
        if tr.optimizer == "adamw":
            self.opt = torch.optim.AdamW(groups, lr=tr.lr, betas=(tr.beta1, tr.beta2), eps=tr.eps)
        elif tr.optimizer == "adam":
            self.opt = torch.optim.Adam(groups, lr=tr.lr, betas=(tr.beta1, tr.beta2), eps=tr.eps)
        else:
            self.opt = torch.optim.SGD(groups, lr=tr.lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda k: schedule_factor(tr, k))

    def step(self):
        """Clips the gradients in .grad, updates the tensors, advances the schedule.
        Returns (lr used, pre-clip global norm)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # not reached: zero gradient, still decayed
        # clip_grad_norm_ returns the pre-clip norm; an infinite max_norm only measures it
        norm = torch.nn.utils.clip_grad_norm_(self.params,
                                              self.tr.clip_norm if self.tr.clip_norm > 0 else float("inf"))
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        return float(lr), float(norm)


def train(s, weights, batches, steps, dtype=torch.float32):
    """Runs `steps` optimizer steps over `batches` (cycled). Returns (step lines as dicts,
    final [(name, tensor)], per-step pre-clip gradients [[(name, tensor)], ...])."""
    tr = s.train
    if tr.dropout != 0 or tr.attention_dropout != 0:
        raise ValueError("torch_ref: dropout > 0 draws lmcc's own generator; not reproduced here")
    checked = [check_batch(s, b) for b in batches]
    if not checked:
        raise ValueError("no batches")
    params = _leaves(s, weights, dtype)
    opt = Optimizer(tr, [(n, params[n]) for n, _ in expected_tensors(s)])
    lines, step_grads = [], []
    for k in range(steps):
        inputs, targets = checked[k % len(checked)]
        for p in params.values():
            p.grad = None
        loss, _ = batch_loss(Model(s, params, dtype), inputs, targets)
        loss.backward()
        grads = _grads_or_zeros(s, params)
        if not all(bool(torch.isfinite(g).all()) for _, g in grads) or not math.isfinite(float(loss)):
            raise ValueError("step %d: non-finite loss or gradient" % (k + 1))
        step_grads.append([(n, g.detach().clone()) for n, g in grads])
        lr, norm = opt.step()
        lines.append({"step": k + 1, "loss": float(loss), "lr": lr, "grad_norm": norm})
    final = [(n, params[n].detach().clone()) for n, _ in expected_tensors(s)]
    return lines, final, step_grads


def read_batches(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


def step_line(r):
    return '{"step":%d,"loss":%s,"lr":%s,"grad_norm":%s}' % (r["step"], fmt(r["loss"]), fmt(r["lr"]),
                                                          fmt(r["grad_norm"]))


# ----------------------------------------------------------------------------
# I/O
# ----------------------------------------------------------------------------

def read_ids(path):
    sents = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                sents.append([int(t) for t in line.split()])
    return sents


def fmt(v):
    v = float(v) + 0.0  # no "-0"
    if not math.isfinite(v):
        raise ValueError("non-finite output %r" % v)
    return "%.9g" % v


def to_jsonl(results):
    lines = []
    for r in results:
        if "embedding" in r:
            lines.append('{"embedding":[%s]}' % ",".join(fmt(v) for v in r["embedding"]))
        else:
            lines.append('{"token_logprobs":[%s],"score":%s,"n_scored":%d}'
                         % (",".join(fmt(v) for v in r["token_logprobs"]), fmt(r["score"]), r["n_scored"]))
    return "".join(l + "\n" for l in lines)


def run(cmd, spec_path, weights_path, ids_path, f64=False):
    s = load_spec(spec_path)
    m = Model(s, load_weights(weights_path, s), torch.float64 if f64 else torch.float32)
    sents = read_ids(ids_path)
    res = m.score(sents) if cmd == "score" else m.embed(sents)
    return to_jsonl(res)


def main(argv):
    torch.set_num_threads(1)
    if len(argv) >= 5 and argv[1] in ("score", "embed"):
        f64 = "--f64" in argv[5:]
        sys.stdout.write(run(argv[1], argv[2], argv[3], argv[4], f64))
        return 0
    if len(argv) >= 5 and argv[1] == "init":
        dtype = "F32"
        if "--dtype" in argv:
            dtype = argv[argv.index("--dtype") + 1]
        s = load_spec(argv[2])
        write_safetensors(argv[4], init_weights(s, int(argv[3])),
                          {"name": s.name, "generator": "tests/golden/torch_ref.py", "seed": argv[3]}, dtype)
        return 0
    if len(argv) >= 6 and argv[1] == "grad":
        f64 = "--f64" in argv[6:]
        s = load_spec(argv[2])
        with open(argv[4]) as f:
            batch = json.load(f)
        loss, T, grads = loss_and_grads(s, load_weights(argv[3], s), batch, torch.float64 if f64 else torch.float32)
        write_safetensors(argv[5], grads, {"name": s.name, "generator": "tests/golden/torch_ref.py", "loss": fmt(loss)})
        sys.stdout.write('{"loss":%s,"targets":%d}\n' % (fmt(loss), T))
        return 0
    if len(argv) >= 6 and argv[1] == "train":
        rest = argv[6:]
        steps = None
        if "--steps" in rest:
            steps = int(rest[rest.index("--steps") + 1])
        f64 = "--f64" in rest
        s = load_spec(argv[2])
        batches = read_batches(argv[4])
        lines, final, _ = train(s, load_weights(argv[3], s), batches, len(batches) if steps is None else steps,
                                torch.float64 if f64 else torch.float32)
        os.makedirs(argv[5], exist_ok=True)
        write_safetensors(os.path.join(argv[5], "weights.safetensors"), final,
                          {"name": s.name, "generator": "tests/golden/torch_ref.py", "steps": str(len(lines))})
        sys.stdout.write("".join(step_line(r) + "\n" for r in lines))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
