#!/usr/bin/python3
"""Writes the training golden fixtures tests/golden/train_fixtures/<case>/ with the independent
PyTorch implementation of issue 14's training contract (torch_ref.py: autograd gradients,
torch.optim.AdamW, clip_grad_norm_, Hugging Face schedules through LambdaLR).

Per model case: spec.toml (with a [train] table), weights.safetensors, batch.json, grads.safetensors,
grad.json, batches.jsonl (3 batches), steps.jsonl, after3.safetensors, step_grads.safetensors.
Plus optimizers/: the optimizer alone (AdamW, Adam, SGD; every schedule) on synthetic gradients.

Deterministic: fixed seeds, single-threaded torch. Regenerate with
    /usr/bin/python3 tests/golden/make_golden_train.py [CASE ...]
Outputs are computed from the files as written (spec parsed back, weights and batches read back),
exactly as `torch_ref.py grad|train` would. Before writing, each case is checked: float32 against
float64 (gradients and the 3 steps, so the fixtures carry well under the tolerances' worth of
rounding), autograd against central finite differences in float64, the loss against the scoring
path, clipping active, weights visibly moved, AdamW against a hand-written update.
"""
import json
import math
import os
import random
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import torch  # noqa: E402
import torch_ref  # noqa: E402

FIXTURES = os.path.join(HERE, "train_fixtures")
V, L = 29, 11
MAX_SENT = 9  # sentences stay shorter than max_len, so the last position rows are never reached


def dims(d, heads, ff=20, layers=2):
    return ("[dims]\nvocab = %d\nmax_len = %d\nd_model = %d\nheads = %d\nd_ff = %d\nlayers = %d\n"
            % (V, L, d, heads, ff, layers))


def train_table(lr, schedule, label_smoothing, weight_decay, clip_norm):
    return ('[train]\nlr = %r\nbetas = [0.9, 0.999]\neps = 1e-5\nweight_decay = %r\nwarmup_steps = 2\n'
            'schedule = "%s"\nsteps = 10\nclip_norm = %r\nlabel_smoothing = %r\n'
            % (lr, weight_decay, schedule, clip_norm, label_smoothing))


# name -> (description, family, spec body after name/family, seed)
CASES = [
    ("unilm_post_tied",
     "unilm, post-norm, tied head, learned positions, gelu; causal objective; linear schedule, no smoothing",
     "unilm", dims(12, 2) + train_table(3e-3, "linear", 0.0, 0.1, 0.5), 201),
    ("bilm_pre_untied_ls",
     "bilm, pre-norm (final_norm), untied head, gelu_tanh; masked objective (mask_prob 0.4, max_masks 3); cosine schedule, label smoothing 0.1",
     "bilm", dims(20, 4) + '[block]\nactivation = "gelu_tanh"\nnorm = "pre"\neps = 1e-5\n[head]\ntied = false\n'
     + train_table(3e-3, "cosine", 0.1, 0.3, 0.5) + "mask_prob = 0.4\nmax_masks = 3\n", 202),
    ("tta_relpos_nohead_ls",
     "T-TA, post-norm, relative positions k = 2, no head transform; autoencoding objective; constant schedule, "
     "label smoothing 0.1",
     "tta", dims(12, 3) + "[attention]\nrelative_positions = 2\n[head]\ntransform = false\n"
     + train_table(3e-3, "constant", 0.1, 0.01, 0.5), 203),
    ("tta_pre_untied_relu",
     "T-TA, pre-norm, untied head, relu, no head bias; autoencoding objective; linear schedule, no smoothing",
     "tta", dims(20, 2) + '[block]\nactivation = "relu"\nnorm = "pre"\n[head]\ntied = false\nbias = false\n'
     + train_table(3e-3, "linear", 0.0, 0.3, 0.5), 204),
]


def make_batch(s, rng, n_sent):
    """n_sent ragged sentences (bos .. eos, 1..MAX_SENT tokens), built into inputs/targets by the
    spec's objective. Causal batches get a 1-token sentence (no target at all)."""
    words = [t for t in range(s.vocab) if t not in (s.pad, s.unk, s.mask_id, s.bos, s.eos)]
    inputs, targets = [], []
    for b in range(n_sent):
        if b == 1 and s.train.resolved_objective == "causal":
            x = [rng.choice(words)]
        else:
            n = rng.randint(3, MAX_SENT)
            x = [s.bos] + [rng.choice(words) for _ in range(n - 2)] + [s.eos]
        i, t = torch_ref.objective_example(s, x, rng)
        inputs.append(i)
        targets.append(t)
    return {"inputs": inputs, "targets": targets}


def batch_json(batch):
    return json.dumps(batch, separators=(",", ":"))


def rel_err(a, b):
    """max |a - b| / max |b| over one tensor (b the reference)."""
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def grad_errors(test, ref):
    """The issue's gradient criterion: per tensor, max error / max(tensor's max |g|, 1e-2 * overall max |g|)."""
    overall = max(float(g.abs().max()) for _, g in ref)
    test = dict(test)
    worst = 0.0
    for name, g in ref:
        scale = max(float(g.abs().max()), 1e-2 * overall)
        worst = max(worst, float((test[name].to(torch.float64) - g.to(torch.float64)).abs().max()) / scale)
    return worst


def finite_difference_check(s, weights, batch, grads64, rng):
    """Central differences in float64 on a few elements of every tensor against autograd (float64)."""
    inputs, targets = torch_ref.check_batch(s, batch)
    w64 = {k: v.to(torch.float64) for k, v in weights.items()}

    def loss_at(w):
        with torch.no_grad():
            return float(torch_ref.batch_loss(torch_ref.Model(s, w, torch.float64), inputs, targets)[0])

    worst = 0.0
    g = dict(grads64)
    overall = max(float(t.abs().max()) for t in g.values())
    for name, _ in torch_ref.expected_tensors(s):
        flat = w64[name].view(-1)
        for _ in range(3):
            k = rng.randrange(flat.numel())
            old = float(flat[k])
            h = 1e-6 * max(1.0, abs(old))
            flat[k] = old + h
            up = loss_at(w64)
            flat[k] = old - h
            down = loss_at(w64)
            flat[k] = old
            fd = (up - down) / (2 * h)
            worst = max(worst, abs(fd - float(g[name].view(-1)[k])) / overall)
    if worst > 1e-6:
        raise AssertionError("%s: autograd vs finite differences: %.3g of the largest gradient" % (s.name, worst))
    return worst


def loss_vs_score_check(s, weights, batch):
    """The loss must equal torch's F.cross_entropy(label_smoothing=e, mean over targets); without
    smoothing, loss * T must equal -(sum of the log-probs of the targets) read off the scoring
    path's per-position log-probs (single pass over each sentence's inputs, one at a time)."""
    m = torch_ref.Model(s, weights)
    total, T = 0.0, 0
    for x, t in zip(batch["inputs"], batch["targets"]):
        H = m.run_hidden([x])[0]
        LP = m.head_logprobs(H)
        for i, ti in enumerate(t):
            if ti >= 0:
                total -= float(LP[i, ti])
                T += 1
    # With smoothing: the contract's CE_i equals torch's own cross_entropy(label_smoothing=e).
    ids, lens = m._pad(batch["inputs"])
    tgt = torch.full(ids.shape, -1, dtype=torch.long)
    for b, t in enumerate(batch["targets"]):
        tgt[b, : len(t)] = torch.tensor(t)
    LPall = m.head_logprobs(m.hidden(ids, lens))
    ce = torch.nn.functional.cross_entropy(LPall.reshape(-1, s.vocab), tgt.reshape(-1), ignore_index=-1,
                                           label_smoothing=s.train.label_smoothing)
    ours = torch_ref.loss_and_grads(s, weights, batch)[0]
    if abs(float(ce) - ours) > 1e-5 * abs(ours):
        raise AssertionError("%s: loss %r != torch cross_entropy %r" % (s.name, ours, float(ce)))
    tr = s.train
    saved = tr.label_smoothing
    tr.label_smoothing = 0.0
    loss, T2, _ = torch_ref.loss_and_grads(s, weights, batch)
    tr.label_smoothing = saved
    if T != T2 or abs(loss * T - total) > 1e-5 * max(1.0, abs(total)):
        raise AssertionError("%s: batch loss %r x %d != scored sum %r over %d" % (s.name, loss, T2, total, T))


def adamw_by_hand(s, weights, step_grads, lines):
    """The contract's AdamW in float64 from the recorded pre-clip gradients (clip and lr by hand too)."""
    tr = s.train
    p = {k: v.to(torch.float64).clone() for k, v in weights.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    for k, grads in enumerate(step_grads):
        g = {n: t.to(torch.float64) for n, t in grads}
        norm = math.sqrt(sum(float((t * t).sum()) for t in g.values()))
        if abs(norm - lines[k]["grad_norm"]) > 1e-5 * norm:
            raise AssertionError("%s: step %d grad_norm %r vs %r" % (s.name, k + 1, lines[k]["grad_norm"], norm))
        coef = tr.clip_norm / (norm + 1e-6)
        if tr.clip_norm > 0 and coef < 1:
            g = {n: t * coef for n, t in g.items()}
        lr = tr.lr * torch_ref.schedule_factor(tr, k)
        if abs(lr - lines[k]["lr"]) > 1e-12:
            raise AssertionError("%s: step %d lr %r vs %r" % (s.name, k + 1, lines[k]["lr"], lr))
        t = k + 1
        for n in p:
            if p[n].dim() >= 2:
                p[n] *= 1 - lr * tr.weight_decay
            m[n] = tr.beta1 * m[n] + (1 - tr.beta1) * g[n]
            v2[n] = tr.beta2 * v2[n] + (1 - tr.beta2) * g[n] * g[n]
            bc1, bc2 = 1 - tr.beta1 ** t, 1 - tr.beta2 ** t
            p[n] -= (lr / bc1) * m[n] / (v2[n].sqrt() / math.sqrt(bc2) + tr.eps)
    return p


def write_case(name, desc, family, body, seed):
    d = os.path.join(FIXTURES, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    spec_path = os.path.join(d, "spec.toml")
    with open(spec_path, "w") as f:
        f.write("# %s\n# Generated by tests/golden/make_golden_train.py; do not edit.\n" % desc)
        f.write('name = "%s"\nfamily = "%s"\n' % (name, family))
        f.write(body)
    s = torch_ref.load_spec(spec_path)
    w_path = os.path.join(d, "weights.safetensors")
    torch_ref.write_safetensors(w_path, torch_ref.init_weights(s, seed),
                                {"name": s.name, "generator": "tests/golden/make_golden_train.py", "seed": str(seed)})
    rng = random.Random(seed * 7919 + 29)
    with open(os.path.join(d, "batch.json"), "w") as f:
        f.write(batch_json(make_batch(s, rng, 4)) + "\n")
    with open(os.path.join(d, "batches.jsonl"), "w") as f:
        for n_sent in (3, 5, 4):
            f.write(batch_json(make_batch(s, rng, n_sent)) + "\n")

    # Everything below from the files as written.
    weights = torch_ref.load_weights(w_path, s)
    with open(os.path.join(d, "batch.json")) as f:
        batch = json.load(f)
    batches = torch_ref.read_batches(os.path.join(d, "batches.jsonl"))

    loss, T, grads = torch_ref.loss_and_grads(s, weights, batch)
    loss64, _, grads64 = torch_ref.loss_and_grads(s, weights, batch, torch.float64)
    g_err = grad_errors(grads, grads64)
    if g_err > 1e-5 or abs(loss - loss64) > 1e-5 * abs(loss64):
        raise AssertionError("%s: float32 vs float64 gradients differ by %.3g (criterion units)" % (name, g_err))
    fd_err = finite_difference_check(s, weights, batch, grads64, random.Random(seed))
    loss_vs_score_check(s, weights, batch)
    torch_ref.write_safetensors(os.path.join(d, "grads.safetensors"), grads,
                                {"name": s.name, "generator": "tests/golden/make_golden_train.py"})
    with open(os.path.join(d, "grad.json"), "w") as f:
        f.write('{"loss":%s,"targets":%d}\n' % (torch_ref.fmt(loss), T))

    lines, final, step_grads = torch_ref.train(s, weights, batches, 3)
    lines64, final64, _ = torch_ref.train(s, weights, batches, 3, torch.float64)
    w_err = max(float((a.to(torch.float64) - b).abs().max()) for (_, a), (_, b) in zip(final, final64))
    if w_err > 2e-6:
        raise AssertionError("%s: after 3 steps float32 vs float64 differ by %.3g" % (name, w_err))
    hand = adamw_by_hand(s, weights, step_grads, lines)
    h_err = max(float((a.to(torch.float64) - hand[n]).abs().max()) for n, a in final)
    if h_err > 1e-6:
        raise AssertionError("%s: torch.optim.AdamW vs the update by hand differ by %.3g" % (name, h_err))
    clipped = sum(r["grad_norm"] > s.train.clip_norm for r in lines)
    if clipped < 2:
        raise AssertionError("%s: clip_norm %g clips only %d of 3 steps" % (name, s.train.clip_norm, clipped))
    moved = max(float((a - weights[n]).abs().max()) for n, a in final)
    if moved < 1e-3:
        raise AssertionError("%s: 3 steps move weights by only %.3g" % (name, moved))
    with open(os.path.join(d, "steps.jsonl"), "w") as f:
        f.write("".join(torch_ref.step_line(r) + "\n" for r in lines))
    torch_ref.write_safetensors(os.path.join(d, "after3.safetensors"), final,
                                {"name": s.name, "generator": "tests/golden/make_golden_train.py", "steps": "3"})
    torch_ref.write_safetensors(os.path.join(d, "step_grads.safetensors"),
                                [("step%d.%s" % (k + 1, n), g) for k, gs in enumerate(step_grads) for n, g in gs],
                                {"name": s.name, "generator": "tests/golden/make_golden_train.py",
                                 "note": "pre-clip gradient of each step (1-based)"})
    print("  %s: loss %.4f over %d targets; f32-f64: grads %.2g (criterion units), after3 %.2g; "
          "fd %.2g; by hand %.2g; max move %.3g; norms %s"
          % (name, loss, T, g_err, w_err, fd_err, h_err, moved, ", ".join("%.3g" % r["grad_norm"] for r in lines)))
    return d


# The optimizer alone: synthetic tensors and gradients, every optimizer and schedule.
OPT_TENSORS = [("a.weight", [5, 3]), ("a.bias", [5]), ("emb", [7, 4]), ("norm.weight", [4]), ("unused.weight", [2, 3])]
OPT_CASES = [
    ("adamw_linear_clip", dict(optimizer="adamw", lr=0.05, weight_decay=0.2, warmup_steps=2, schedule="linear",
                               steps=6, clip_norm=1.0)),
    ("adam_cosine_clip", dict(optimizer="adam", lr=0.02, weight_decay=0.1, warmup_steps=1, schedule="cosine",
                              steps=5, clip_norm=2.0, betas=[0.8, 0.95], eps=1e-4)),
    ("sgd_constant_noclip", dict(optimizer="sgd", lr=0.1, weight_decay=0.05, warmup_steps=3, schedule="constant",
                                 steps=100, clip_norm=0.0)),
    ("adamw_cosine_past_total", dict(optimizer="adamw", lr=0.03, weight_decay=0.01, warmup_steps=0,
                                     schedule="cosine", steps=2, clip_norm=0.0)),
    ("sgd_linear_past_total", dict(optimizer="sgd", lr=0.1, weight_decay=0.0, warmup_steps=1, schedule="linear",
                                   steps=3, clip_norm=0.5)),
]
OPT_STEPS = 5


def write_optimizers():
    d = os.path.join(FIXTURES, "optimizers")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    g = torch.Generator().manual_seed(301)
    init = [(n, torch.randn(shape, generator=g) * 0.7 + (1.0 if n == "norm.weight" else 0.0))
            for n, shape in OPT_TENSORS]
    grads = []
    for k in range(OPT_STEPS):
        gs = []
        for n, shape in OPT_TENSORS:
            t = torch.randn(shape, generator=g) * (0.3 + 0.2 * k)
            if n == "unused.weight" or (n == "a.bias" and k == 2):
                t = torch.zeros(shape)  # not reached: zero gradient (still decayed)
            gs.append((n, t))
        grads.append(gs)
    meta = {"generator": "tests/golden/make_golden_train.py"}
    torch_ref.write_safetensors(os.path.join(d, "params.safetensors"), init, meta)
    torch_ref.write_safetensors(os.path.join(d, "grads.safetensors"),
                                [("step%d.%s" % (k + 1, n), t) for k, gs in enumerate(grads) for n, t in gs], meta)
    cases, after = [], []
    for cname, cfg in OPT_CASES:
        s = torch_ref.Spec()
        s.family = "tta"
        s.mask, s.method = "diagonal", "single-pass"
        tr = torch_ref.resolve_train(cfg, s)
        params = [(n, t.clone().requires_grad_(True)) for n, t in torch_ref.read_safetensors(
            os.path.join(d, "params.safetensors"))[0].items()]
        order = {n: i for i, (n, _) in enumerate(OPT_TENSORS)}
        params.sort(key=lambda nt: order[nt[0]])
        opt = torch_ref.Optimizer(tr, params)
        lines = []
        for k in range(OPT_STEPS):
            for (n, p), (n2, t) in zip(params, grads[k]):
                assert n == n2
                p.grad = t.clone()
            lr, norm = opt.step()
            lines.append({"step": k + 1, "lr": lr, "grad_norm": norm})
            after += [("%s.step%d.%s" % (cname, k + 1, n), p.detach().clone()) for n, p in params]
        full = dict(TRAIN_KEYS_OF(tr))
        cases.append({"name": cname, "train": full, "lines": lines})
    torch_ref.write_safetensors(os.path.join(d, "after.safetensors"), after, meta)
    with open(os.path.join(d, "cases.json"), "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases) + "\n]\n")
    print("  optimizers: %d configurations x %d steps" % (len(cases), OPT_STEPS))
    return d


def TRAIN_KEYS_OF(tr):
    keys = ("optimizer", "lr", "betas", "eps", "weight_decay", "warmup_steps", "schedule", "steps", "clip_norm")
    return [(k, getattr(tr, k)) for k in keys]


def main(argv):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    wanted = set(argv[1:])
    os.makedirs(FIXTURES, exist_ok=True)
    for case in CASES:
        if wanted and case[0] not in wanted:
            continue
        d = write_case(*case)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-24s %8d bytes" % (case[0], size))
    if not wanted or "optimizers" in wanted:
        d = write_optimizers()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-24s %8d bytes" % ("optimizers", size))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
