#!/usr/bin/env python3
"""Peer implementations the benchmark suite times lmcc-generated code against.

Every peer runs the model an lmcc spec describes (runtime/SEMANTICS.md) from the same spec,
the same safetensors weights (canonical names) and the same token ids as lmcc:

  torch/<method>  PyTorch written the way a competent user writes a BERT-like model: an
                  nn.Module of nn.Embedding / nn.Linear / nn.LayerNorm (parameters loaded from
                  the weights with load_state_dict(strict=True, assign=True): no copy),
                  F.scaled_dot_product_attention (boolean mask, or is_causal=True for the
                  causal mask), float32, torch.inference_mode(), torch.set_num_threads(threads).
  onnx/<method>   the same nn.Modules exported with torch.onnx.export (the dynamo exporter,
                  dynamic batch/row and sequence axes) and run by ONNX Runtime's
                  CPUExecutionProvider (intra_op_num_threads = threads, inter_op = 1,
                  ORT_ENABLE_ALL).

Methods (methods_for(spec) lists those that apply to the spec's scoring method):
  tta-score     single pass (T-TA: diagonal mask, keys/values = the embedding stream X, first
                query per spec): head on every row, log-softmax, each token's own log-prob, sum.
  tta-embed     the same pass; mean of the last hidden states over positions not holding bos/eos.
  pll-naive     mask-and-predict, one forward per scored position i (all B sentences at once,
                token i replaced by the mask id), head on row i only.
  pll-batched   mask-and-predict as mlm-scoring does it: forwards over all B*n' masked copies (in
                chunks of at most COPY_TOKENS tokens), the masked rows gathered before the head.
  pll-embed     mask-and-predict embedding: position i's state from the copy with i masked.
  causal        one causal pass, head on rows 0..n-2, log p(x_t | row t-1); t = 0 not scored.
  causal-embed  the one pass's hidden states, mean-pooled as above.
Scoring bookkeeping (skip_special, which positions get a pass, causal t = 0) follows SEMANTICS.md;
it is done on the numpy side (index preparation, masking, float64 sums), shared by both systems.
Spec resolution and weight loading come from tests/golden/torch_ref.py (imported, not copied).
Relative positions (Shaw) are not implemented: NotImplementedError.

API (for the benchmark driver):
  load(spec_path, weights_path) -> (spec, {name: float32 tensor})
  methods_for(spec) -> [method]
  make_peer(system, method, spec, weights, threads, workdir) -> Peer
  Peer.name; Peer(ids int32 [B, n]) -> float64 [B] scores | float32 [B, d_model] embeddings

Verification (by hand):
  peers.py verify SPEC WEIGHTS [--n 20] [--batch 3] [--threads 1] [--seed 0] [--workdir DIR]
                              [--lmcc build/bin/lmcc] [--systems torch,onnx] [--methods a,b]
draws B random sentences of length n (bos first, eos last, random non-special ids between), runs
every applicable (system, method) and compares it with torch_ref.Model.score/embed and with
`lmcc score|embed --threads T` on the same ids; prints the max abs difference per peer and a
rough timing (median of 5 calls after a warm-up). Exits 1 if a score differs by more than 2e-3
or an embedding value by more than 1e-4 from either reference.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import weakref

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_REF_PATH = os.path.join(ROOT, "tests", "golden", "torch_ref.py")

SYSTEMS = ("torch", "onnx")
# PyTorch with bf16 autocast on CPU (the linear layers in bf16): the peer of lmcc --weights-dtype bf16
# (scripts/bench-bf16.sh). Not in SYSTEMS: its numbers differ from fp32 by the rounding, so `verify` skips it.
BF16_SYSTEM = "torch-bf16"
SCORE_TOL = 2e-3
EMBED_TOL = 1e-4


def _import_torch_ref():
    spec = importlib.util.spec_from_file_location("lmcc_torch_ref", TORCH_REF_PATH)
    mod = importlib.util.module_from_spec(spec)
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = old
    return mod


torch_ref = _import_torch_ref()


# ----------------------------------------------------------------------------
# Spec / weights
# ----------------------------------------------------------------------------

def load(spec_path, weights_path):
    """(resolved spec, {canonical name: float32 tensor}); via torch_ref's loaders."""
    spec = torch_ref.load_spec(spec_path)
    try:
        weights = torch_ref.load_weights(weights_path, spec)
    except ValueError as e:
        raise ValueError("%s (peers need canonical tensor names; convert a Hugging Face checkpoint "
                         "with `lmcc convert SPEC IN --from hf -o OUT`)" % e) from None
    return spec, weights


_METHODS = {
    "single-pass": ["tta-score", "tta-embed"],
    "mask-and-predict": ["pll-naive", "pll-batched", "pll-embed"],
    "causal": ["causal", "causal-embed"],
}
EMBED_METHODS = ("tta-embed", "pll-embed", "causal-embed")


def methods_for(spec):
    return list(_METHODS[spec.method])


def _check_supported(spec):
    if spec.relative_positions > 0:
        raise NotImplementedError(
            "spec %r: relative_positions = %d (Shaw relative positions) is not implemented by the "
            "torch/onnx peers (F.scaled_dot_product_attention has no relative-position term)"
            % (spec.name, spec.relative_positions))


# ----------------------------------------------------------------------------
# The model, as a PyTorch user writes it
# ----------------------------------------------------------------------------

def _activation(name):
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    return nn.ReLU()


class SelfAttention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, q_in, kv_in, mask, is_causal, no_key):
        B, n, D = q_in.shape
        H = self.heads
        q = self.q(q_in).view(B, n, H, D // H).transpose(1, 2)
        k = self.k(kv_in).view(B, n, H, D // H).transpose(1, 2)
        v = self.v(kv_in).view(B, n, H, D // H).transpose(1, 2)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        if no_key is not None:  # a query with no visible key gets a zero context (SEMANTICS.md)
            ctx = ctx.masked_fill(no_key, 0.0)
        return self.o(ctx.transpose(1, 2).reshape(B, n, D))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, activation):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.act = _activation(activation)
        self.fc_out = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x)))


class Block(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.pre_norm = s.norm == "pre"
        self.attn = SelfAttention(s.d_model, s.heads)
        self.attn_norm = nn.LayerNorm(s.d_model, eps=s.eps)
        self.ffn = FeedForward(s.d_model, s.d_ff, s.activation)
        self.ffn_norm = nn.LayerNorm(s.d_model, eps=s.eps)

    def forward(self, h, x_kv, mask):
        """x_kv: the embedding stream when keys/values come from it, else None (= hidden);
        mask: LM.attention_mask's triple."""
        if self.pre_norm:
            q_in = self.attn_norm(h)
            a = h + self.attn(q_in, q_in if x_kv is None else x_kv, *mask)
            return a + self.ffn(self.ffn_norm(a))
        a = self.attn_norm(h + self.attn(h, h if x_kv is None else x_kv, *mask))
        return self.ffn_norm(a + self.ffn(a))


class Embeddings(nn.Module):
    def __init__(self, s, position_table):
        super().__init__()
        self.token = nn.Embedding(s.vocab, s.d_model)
        self.norm = nn.LayerNorm(s.d_model, eps=s.eps) if s.embedding_norm else nn.Identity()
        self.register_buffer("position", position_table.clone(), persistent=False)  # [L, D]


class Head(nn.Module):
    def __init__(self, s):
        super().__init__()
        D, V = s.d_model, s.vocab
        self.transform = nn.Linear(D, D) if s.head_transform else None
        self.act = _activation(s.activation)
        self.norm = nn.LayerNorm(D, eps=s.eps) if s.head_transform else None
        self.output = None if s.tied else nn.Linear(D, V, bias=False)
        self.bias = nn.Parameter(torch.zeros(V)) if s.head_bias else None

    def forward(self, h, token_embedding):
        t = h
        if self.transform is not None:
            t = self.norm(self.act(self.transform(t)))
        w = token_embedding if self.output is None else self.output.weight
        return F.linear(t, w, self.bias)


def _module_key(name):
    """Canonical tensor name -> this module's state_dict key."""
    if name == "embed.token":
        return "embed.token.weight"
    return name.replace(".ffn.in.", ".ffn.fc_in.").replace(".ffn.out.", ".ffn.fc_out.")


class LM(nn.Module):
    """Embeddings, the layer stack and the vocabulary head of one spec."""

    def __init__(self, s, weights):
        super().__init__()
        _check_supported(s)
        self.s = s
        # the position table (learned, sinusoidal or zero) exactly as torch_ref builds it
        P = torch_ref.Model(s, weights).P.to(torch.float32)
        self.embed = Embeddings(s, P)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.final_norm = nn.LayerNorm(s.d_model, eps=s.eps) if s.norm == "pre" else None
        self.head = Head(s)
        sd = {_module_key(k): v for k, v in weights.items() if k != "embed.position"}
        self.load_state_dict(sd, strict=True, assign=True)  # the parameters are the weights' tensors
        self.eval()
        self.requires_grad_(False)
        self.weights = weights  # keeps id(weights) taken by _lm_for unique while this LM lives
        self.onnx_exports = {}  # (entry, workdir) -> exported file (_export_onnx)

    def attention_mask(self, n, device):
        """(attn_mask, is_causal) for F.scaled_dot_product_attention (bool [n, n]: key j visible
        to query i), and the [n, 1] rows with no visible key (or None where none can occur).
        Only the diagonal mask has such a row, at n = 1: torch's SDPA returns zeros there, but
        the ONNX export masks with -FLT_MAX (a uniform softmax), so the zeroing is explicit."""
        m = self.s.mask
        if m == "none":
            return None, False, None
        if m == "causal":
            return None, True, None
        i = torch.arange(n, device=device)
        if m == "anticausal":
            return i[None, :] >= i[:, None], False, None
        visible = i[None, :] != i[:, None]  # diagonal
        return visible, False, ~visible.any(dim=-1, keepdim=True)

    def hidden(self, ids):
        """ids [B, n] -> last hidden states [B, n, D] (after final_norm under pre-norm)."""
        s = self.s
        B, n = ids.shape
        P = self.embed.position[:n]
        X = self.embed.norm(self.embed.token(ids) + P)
        if s.first_query == "embedding":
            h = X
        elif s.first_query == "position":
            h = self.embed.norm(P).expand(B, n, s.d_model)
        else:  # mask+position
            h = self.embed.norm(self.embed.token.weight[s.mask_id] + P).expand(B, n, s.d_model)
        x_kv = X if s.keys_values == "embedding" else None
        mask = self.attention_mask(n, ids.device)
        for block in self.layers:
            h = block(h, x_kv, mask)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return h

    def logits(self, h):
        return self.head(h, self.embed.token.weight)


# The entry points a peer runs (torch: called; onnx: exported one per graph). Inputs are int64.

class OwnTokenLogprobs(nn.Module):
    """ids [B, n] -> [B, n]: log p(x_i | row i) of one pass (single-pass scoring)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        lp = torch.log_softmax(self.lm.logits(self.lm.hidden(ids)), dim=-1)
        return lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


class NextTokenLogprobs(nn.Module):
    """ids [B, n] -> [B, n-1]: log p(x_t | row t-1), t = 1..n-1 (causal scoring)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        h = self.lm.hidden(ids)[:, :-1]
        lp = torch.log_softmax(self.lm.logits(h), dim=-1)
        return lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


class MaskedRowLogprobs(nn.Module):
    """copies [R, n] (each with one position masked), pos [R], target [R] -> [R]:
    log p(target | row pos of its copy); the head sees the R gathered rows only."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, copies, pos, target):
        h = self.lm.hidden(copies)  # [R, n, D]
        rows = h.gather(1, pos.view(-1, 1, 1).expand(-1, 1, h.shape[-1])).squeeze(1)  # [R, D]
        lp = torch.log_softmax(self.lm.logits(rows), dim=-1)
        return lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)


class MaskedRowStates(nn.Module):
    """copies [R, n], pos [R] -> [R, D]: hidden state at row pos of each copy."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, copies, pos):
        h = self.lm.hidden(copies)
        return h.gather(1, pos.view(-1, 1, 1).expand(-1, 1, h.shape[-1])).squeeze(1)


class MeanEmbedding(nn.Module):
    """ids [B, n] -> [B, D]: one pass, mean of the last hidden states over positions not holding
    bos/eos (all positions when none remain)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        h = self.lm.hidden(ids)
        keep = (ids != self.lm.s.bos) & (ids != self.lm.s.eos)
        keep = keep | ~keep.any(dim=1, keepdim=True)
        w = keep.to(h.dtype).unsqueeze(-1)
        return (h * w).sum(dim=1) / w.sum(dim=1)


_ENTRY = {
    "own-lp": (OwnTokenLogprobs, ("ids",), ("out_logprobs",)),
    "next-lp": (NextTokenLogprobs, ("ids",), ("out_logprobs",)),
    "masked-row-lp": (MaskedRowLogprobs, ("copies", "pos", "target"), ("out_logprobs",)),
    "masked-row-states": (MaskedRowStates, ("copies", "pos"), ("out_states",)),
    "mean-embed": (MeanEmbedding, ("ids",), ("out_embedding",)),
}

_METHOD_ENTRY = {
    "tta-score": "own-lp", "tta-embed": "mean-embed",
    "pll-naive": "masked-row-lp", "pll-batched": "masked-row-lp", "pll-embed": "masked-row-states",
    "causal": "next-lp", "causal-embed": "mean-embed",
}

# One LM per (spec, weights) pair while some peer holds it (an LM references both, so the ids
# stay unique while the entry exists); nothing outlives the caller's spec, weights and peers.
_LM_CACHE = weakref.WeakValueDictionary()


def _lm_for(spec, weights):
    key = (id(spec), id(weights))
    lm = _LM_CACHE.get(key)
    if lm is None:
        lm = _LM_CACHE[key] = LM(spec, weights)
    return lm


# ----------------------------------------------------------------------------
# Backends: run one entry point on int64 numpy arrays, return a numpy array
# ----------------------------------------------------------------------------

class _TorchRunner:
    def __init__(self, module, threads, bf16=False):
        self.module = module
        self.threads = threads
        self.bf16 = bf16

    def __call__(self, *arrays):
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            return self.module(*[torch.from_numpy(a) for a in arrays]).float().numpy()


def _export_onnx(lm, entry, workdir):
    """Exports entry point `entry` of lm into workdir once per LM; returns the .onnx path."""
    spec, weights = lm.s, lm.weights
    key = (entry, os.path.abspath(workdir))
    if key in lm.onnx_exports:
        return lm.onnx_exports[key]
    cls, in_names, out_names = _ENTRY[entry]
    module = cls(lm).eval()
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "%s.%s.onnx" % (spec.name, entry))
    # Example inputs of size >= 2 on every dynamic axis (torch.export specializes sizes 0 and 1).
    B, n = 2, max(2, min(4, spec.max_len))
    ids = torch.full((B, n), 5 % spec.vocab, dtype=torch.long)
    rows = torch.export.Dim("rows", min=1)
    seq = torch.export.Dim("seq", min=1, max=spec.max_len)
    if entry in ("masked-row-lp", "masked-row-states"):
        args = (ids, torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long))[:len(in_names)]
        dyn = ({0: rows, 1: seq}, {0: rows}, {0: rows})[:len(in_names)]
    else:
        args, dyn = (ids,), ({0: rows, 1: seq},)
    big = sum(t.numel() for t in weights.values()) * 4 > (1 << 30)
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            torch.onnx.export(module, args, path, dynamo=True, opset_version=18,
                              input_names=list(in_names), output_names=list(out_names),
                              dynamic_shapes=dyn, optimize=True,
                              external_data=big)  # protobuf's 2 GB limit
        except Exception:
            sys.stderr.write(log.getvalue())
            raise
    lm.onnx_exports[key] = path
    return path


class _OnnxRunner:
    def __init__(self, lm, path, threads):
        import onnxruntime as ort
        self.lm = lm  # shares the weights' tensors; keeps lm.onnx_exports for the next peer
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.inputs = [(i.name, np.int32 if i.type == "tensor(int32)" else np.int64)
                       for i in self.session.get_inputs()]

    def __call__(self, *arrays):
        feed = {name: np.ascontiguousarray(a, dtype=dt) for (name, dt), a in zip(self.inputs, arrays)}
        return self.session.run(None, feed)[0]


# ----------------------------------------------------------------------------
# Peers
# ----------------------------------------------------------------------------

# Tokens per forward of mask-and-predict copies (pll-batched, pll-embed): 2^17 keeps every grid entry up to
# n 40 batch 32 (48,640 tokens) and n 128 batch 1 in one forward as before, n 80 batch 32 in two and n 128 batch 32 in
# four. In two (2,048 copies a forward) the one-thread peers peaked at 15 GB and the two-thread ones ran out of 24 GB.
COPY_TOKENS = 1 << 17


class Peer:
    """Callable: ids int32 [B, n] (no padding) -> float64 [B] scores or float32 [B, D] embeddings."""

    def __init__(self, system, method, spec, run):
        self.name = "%s/%s" % (system, method)
        self.system, self.method, self.spec = system, method, spec
        self._run = run  # entry point of _METHOD_ENTRY[method], on int64 numpy arrays

    def _special(self, ids):
        return (ids == self.spec.bos) | (ids == self.spec.eos)

    def _scored(self, ids):
        """[B, n] bool: positions that get a log-prob (and, under PLL, a pass)."""
        scored = ~self._special(ids) if self.spec.skip_special else np.ones(ids.shape, bool)
        if self.method == "causal":
            scored[:, 0] = False
        return scored

    def _masked_copies(self, ids, sel):
        """The copies of mask-and-predict: one per True in sel [B, n], that position masked."""
        b, pos = np.nonzero(sel)
        copies = ids[b]
        copies[np.arange(len(b)), pos] = self.spec.mask_id
        return b, pos, copies

    def _run_copies(self, copies, *rows):
        """The forward over mask-and-predict copies (and their per-copy rows: positions, targets) in chunks of at
        most COPY_TOKENS tokens, as mlm-scoring splits its copies into batches: BERT-base's PLL of 32 sentences of
        128 tokens is 4,032 copies, whose single forward needs more than this machine's 24 GB."""
        step = max(1, COPY_TOKENS // copies.shape[1])
        if len(copies) <= step:
            return self._run(copies, *rows)
        return np.concatenate([self._run(copies[i:i + step], *[r[i:i + step] for r in rows])
                               for i in range(0, len(copies), step)])

    def __call__(self, ids):
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[1] < 1 or ids.shape[1] > self.spec.max_len:
            raise ValueError("ids must be [B, n] with 1 <= n <= %d, got %s" % (self.spec.max_len, ids.shape))
        if ids.size and (ids.min() < 0 or ids.max() >= self.spec.vocab):
            raise ValueError("token ids must lie in [0, %d)" % self.spec.vocab)
        B, n = ids.shape
        m = self.method
        if m in EMBED_METHODS:
            if m != "pll-embed":
                return self._run(ids).astype(np.float32)
            keep = ~self._special(ids)
            keep |= ~keep.any(axis=1, keepdims=True)
            b, pos, copies = self._masked_copies(ids, keep)
            states = self._run_copies(copies, pos).astype(np.float64)
            out = np.zeros((B, self.spec.d_model))
            np.add.at(out, b, states)
            return (out / keep.sum(axis=1, keepdims=True)).astype(np.float32)
        scored = self._scored(ids)
        score = np.zeros(B, dtype=np.float64)
        if m == "tta-score":
            lp = self._run(ids)
            score = np.where(scored, lp, 0.0).sum(axis=1, dtype=np.float64)
        elif m == "causal":
            if n > 1:
                lp = self._run(ids)
                score = np.where(scored[:, 1:], lp, 0.0).sum(axis=1, dtype=np.float64)
        elif m == "pll-batched":
            b, pos, copies = self._masked_copies(ids, scored)
            if len(b):
                lp = self._run_copies(copies, pos, ids[b, pos]).astype(np.float64)
                np.add.at(score, b, lp)
        elif m == "pll-naive":
            for i in np.nonzero(scored.any(axis=0))[0]:  # one pass per scored position
                copies = ids.copy()
                copies[:, i] = self.spec.mask_id
                lp = self._run(copies, np.full(B, i, dtype=np.int64), ids[:, i])
                score += np.where(scored[:, i], lp.astype(np.float64), 0.0)
        else:
            raise ValueError(m)
        return score


def make_peer(system, method, spec, weights, threads, workdir):
    if system not in SYSTEMS + (BF16_SYSTEM,):
        raise ValueError("unknown system %r (expected one of %s)" % (system, ", ".join(SYSTEMS + (BF16_SYSTEM,))))
    if method not in methods_for(spec):
        raise ValueError("method %r does not apply to spec %r (method %s): expected one of %s"
                         % (method, spec.name, spec.method, ", ".join(methods_for(spec))))
    _check_supported(spec)
    entry = _METHOD_ENTRY[method]
    lm = _lm_for(spec, weights)
    if system in ("torch", BF16_SYSTEM):
        torch.set_num_threads(threads)
        run = _TorchRunner(_ENTRY[entry][0](lm).eval(), threads, bf16=system == BF16_SYSTEM)
    else:
        run = _OnnxRunner(lm, _export_onnx(lm, entry, workdir), threads)
    return Peer(system, method, spec, run)


# ----------------------------------------------------------------------------
# verify CLI
# ----------------------------------------------------------------------------

def _random_sentences(spec, n, batch, seed):
    rng = np.random.default_rng(seed)
    special = {spec.pad, spec.eos, spec.unk, spec.bos, spec.mask_id}
    allowed = np.array([t for t in range(spec.vocab) if t not in special])
    ids = rng.choice(allowed, size=(batch, n)).astype(np.int32)
    if n >= 1:
        ids[:, 0] = spec.bos
    if n >= 2:
        ids[:, -1] = spec.eos
    return ids


def _lmcc(lmcc, cmd, spec_path, weights_path, ids, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write("".join(" ".join(str(int(t)) for t in row) + "\n" for row in ids))
        path = f.name
    try:
        out = subprocess.run([lmcc, cmd, spec_path, "--weights", weights_path, "--ids", path,
                              "--threads", str(threads)], check=True, capture_output=True, text=True)
    finally:
        os.unlink(path)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def verify(argv):
    ap = argparse.ArgumentParser(prog="peers.py verify")
    ap.add_argument("spec")
    ap.add_argument("weights")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="where ONNX files go (default: a temp dir)")
    ap.add_argument("--lmcc", default=os.path.join(ROOT, "build", "bin", "lmcc"))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--methods", default=None, help="comma-separated subset of methods_for(spec)")
    a = ap.parse_args(argv)

    spec, weights = load(a.spec, a.weights)
    ids = _random_sentences(spec, a.n, a.batch, a.seed)
    sents = [[int(t) for t in row] for row in ids]
    methods = methods_for(spec) if a.methods is None else a.methods.split(",")
    torch.set_num_threads(a.threads)

    ref = torch_ref.Model(spec, weights)
    ref_score = np.array([r["score"] for r in ref.score(sents)])
    ref_embed = np.array([r["embedding"] for r in ref.embed(sents)])
    lm_score = np.array([r["score"] for r in _lmcc(a.lmcc, "score", a.spec, a.weights, ids, a.threads)])
    lm_embed = np.array([r["embedding"] for r in _lmcc(a.lmcc, "embed", a.spec, a.weights, ids, a.threads)])
    print("%s: %s, B=%d n=%d threads=%d; lmcc vs torch_ref: score %.2e, embedding %.2e"
          % (spec.name, spec.method, a.batch, a.n, a.threads,
             np.abs(lm_score - ref_score).max(), np.abs(lm_embed - ref_embed).max()))

    workdir = a.workdir or tempfile.mkdtemp(prefix="lmcc-peers-")
    failed = False
    for system in a.systems.split(","):
        for method in methods:
            t0 = time.perf_counter()
            peer = make_peer(system, method, spec, weights, a.threads, workdir)
            setup = time.perf_counter() - t0
            out = peer(ids)
            embed = method in EMBED_METHODS
            want_ref, want_lm = (ref_embed, lm_embed) if embed else (ref_score, lm_score)
            tol = EMBED_TOL if embed else SCORE_TOL
            d_ref = float(np.abs(out - want_ref).max())
            d_lm = float(np.abs(out - want_lm).max())
            times = []
            for _ in range(5):
                t = time.perf_counter()
                peer(ids)
                times.append(time.perf_counter() - t)
            ok = d_ref <= tol and d_lm <= tol and np.all(np.isfinite(out))
            failed |= not ok
            print("  %-20s max|diff| vs torch_ref %.2e  vs lmcc %.2e  (tol %.0e) %s   %8.2f ms/call  (setup %.1f s)"
                  % (peer.name, d_ref, d_lm, tol, "ok" if ok else "FAIL",
                     1e3 * float(np.median(times)), setup))
    return 1 if failed else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "verify":
        return verify(argv[2:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
