#!/usr/bin/env python3
"""PyTorch eager training of an lmcc spec: the peer of bench/train_bench.cpp.

  train_peers.py --spec SPEC --weights W --batch-file FILE [--threads T] [--steps S]
                 [--expect-loss L] [--tol 1e-4] [--flops F] [--peak-gflops G] [--adamw fused|foreach|for-loop]

The model is bench/peers.py's LM (an nn.Module of nn.Embedding / nn.Linear / nn.LayerNorm and
F.scaled_dot_product_attention: no Python loop over tokens or heads), float32, with every canonical
tensor a trainable parameter (the learned position table included, as in lmcc's training). The
batch is FILE, {"inputs":[[...]],"targets":[[...]]} as `train_bench --dump-batch` writes it (all
sentences of the same length, so no padding); the loss is the contract's (issue 14): the last
hidden state of every row with a target through the head, F.cross_entropy (mean over the T target
rows, label_smoothing from the spec). One step = zero_grad, forward, backward,
torch.nn.utils.clip_grad_norm_ (spec clip_norm), torch.optim.AdamW (the spec's lr, betas, eps,
weight decay on tensors of rank >= 2 only; `fused=True` by default, the fastest CPU variant of
torch 2.x) and the Hugging Face schedule through LambdaLR (tests/golden/torch_ref.py's).

--expect-loss L: before timing, the loss of FILE on the initial weights is computed twice, by this
module and by tests/golden/torch_ref.py's independent Model/batch_loss, and both must be within
--tol of L (lmcc's first-step loss, train_bench's first_loss); otherwise exits 1 untimed.

Timing as train_bench: one warm-up step, then S timed steps (time.perf_counter around each whole
step, loss.item() included; also the median forward, backward and clip+optimizer parts: fwd_ms,
bwd_ms, opt_ms). Prints one JSON line with the same keys as train_bench (system
"torch"); peak_rss_mb is this process's ru_maxrss (the torch import included).
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import peers  # noqa: E402  (imports tests/golden/torch_ref.py as peers.torch_ref)

torch_ref = peers.torch_ref


def trainable_lm(spec, weights):
    """peers.LM over copies of the weights, every canonical tensor an nn.Parameter with grad."""
    weights = {k: v.detach().clone().contiguous() for k, v in weights.items()}
    lm = peers.LM(spec, weights)
    if spec.position == "learned":  # peers.LM keeps the table as a buffer (inference); here it trains
        del lm.embed._buffers["position"]
        lm.embed.position = nn.Parameter(weights["embed.position"])
    lm.requires_grad_(True)
    lm.train()  # no dropout anywhere (the spec's dropout is 0), so train() changes nothing numerically
    return lm


def batch_tensors(path):
    with open(path) as f:
        batch = json.load(f)
    inputs = torch.tensor(batch["inputs"], dtype=torch.long)
    targets = torch.tensor(batch["targets"], dtype=torch.long)
    return batch, inputs, targets


def loss_fn(lm, spec, inputs, targets):
    sel = targets >= 0
    h = lm.hidden(inputs)  # [B, n, D]
    logits = lm.logits(h[sel])  # [T, V]: the head on the target rows only
    return F.cross_entropy(logits, targets[sel], label_smoothing=spec.train.label_smoothing)


def make_optimizer(spec, lm, impl):
    tr = spec.train
    if tr.optimizer != "adamw":
        raise SystemExit("train_peers.py: the benchmark covers adamw only (spec has %s)" % tr.optimizer)
    params = list(lm.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tr.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    opt = torch.optim.AdamW(groups, lr=tr.lr, betas=(tr.beta1, tr.beta2), eps=tr.eps, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: torch_ref.schedule_factor(tr, k))
    return params, opt, sched


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch-file", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--expect-loss", type=float)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--flops", type=float, default=0.0, help="train FLOPs of one step (for gflops)")
    ap.add_argument("--peak-gflops", type=float, default=0.0)
    ap.add_argument("--adamw", choices=("fused", "foreach", "for-loop"), default="fused")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    spec, weights = peers.load(a.spec, a.weights)
    batch, inputs, targets = batch_tensors(a.batch_file)
    B, n = inputs.shape
    lm = trainable_lm(spec, weights)
    params, opt, sched = make_optimizer(spec, lm, a.adamw)
    clip = spec.train.clip_norm

    check = None
    if a.expect_loss is not None:
        with torch.no_grad():
            mine = float(loss_fn(lm, spec, inputs, targets))
            ref, _ = torch_ref.batch_loss(torch_ref.Model(spec, weights), batch["inputs"], batch["targets"])
            ref = float(ref)
        check = {"lmcc": a.expect_loss, "torch": mine, "torch_ref": ref,
                 "max_abs_diff": max(abs(mine - a.expect_loss), abs(ref - a.expect_loss))}
        if check["max_abs_diff"] > a.tol:
            print(json.dumps({"system": "torch", "model": spec.name, "check": "fail", **check}))
            return 1

    phases = {"fwd_ms": [], "bwd_ms": [], "opt_ms": []}

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(lm, spec, inputs, targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        for p in params:  # a tensor the batch does not reach: zero gradient, still decayed (the contract)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        sched.step()
        value = loss.item()
        t3 = time.perf_counter()
        for k, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
            phases[k].append(dt * 1e3)
        return value

    t0 = time.perf_counter()
    first_loss = step()
    warmup_ms = (time.perf_counter() - t0) * 1e3
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        last_loss = step()
        ms.append((time.perf_counter() - t0) * 1e3)
    median = statistics.median(ms)
    spread = statistics.pstdev(ms) / median * 100 if len(ms) > 1 else 0.0
    gflops = a.flops / (median / 1e3) / 1e9 if a.flops else 0.0
    out = {
        "system": "torch", "torch_version": torch.__version__, "adamw": a.adamw,
        "model": spec.name, "objective": spec.train.resolved_objective, "batch": B, "n": n,
        "threads": a.threads, "steps": a.steps, "targets": int((targets >= 0).sum()),
        "params": sum(p.numel() for p in params), "first_loss": first_loss, "last_loss": last_loss,
        "warmup_ms": round(warmup_ms, 3), "ms_per_step": round(median, 3), "spread_pct": round(spread, 2),
        "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3), "steps_per_s": 1e3 / median,
        "tokens_per_s": B * n * 1e3 / median,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "train_flops_per_step": a.flops, "gflops": gflops, "peak_gflops": a.peak_gflops,
        "roofline_fraction": gflops / a.peak_gflops if a.peak_gflops else 0.0,
    }
    for k, v in phases.items():  # the timed steps' phases: forward, backward, clip + optimizer + schedule
        out[k] = round(statistics.median(v[1:]), 3)
    if check is not None:
        out["check"] = "ok"
        out.update({"check_" + k: v for k, v in check.items()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
