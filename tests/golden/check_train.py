#!/usr/bin/python3
"""Checks `lmcc grad` and `lmcc train` (issue 14's CLI contract) against the training fixtures.

Usage:
  check_train.py LMCC [CASE ...] [--keep DIR]

For each tests/golden/train_fixtures/<case>/ (all by default) it runs
  LMCC grad  spec.toml --weights weights.safetensors --batch batch.json -o OUT/grads.safetensors
  LMCC train spec.toml --weights weights.safetensors --batches batches.jsonl -o OUT/train --steps 3
and compares with the fixtures using issue 14's tolerances:
  * grad: stdout's {"loss":L,"targets":T}: T exactly, L within 1e-5 relative; every canonical tensor
    present (and nothing else) with its shape, each element within
    1e-4 x max(that tensor's max |g|, 1e-2 x the largest |g| over all tensors);
  * train: one {"step":s,"loss":L,"lr":r,"grad_norm":g} line per step, s = 1, 2, 3; lr within 1e-9
    relative, loss within 1e-5 relative, grad_norm within 1e-4 relative; OUT/train/weights.safetensors
    holding every canonical tensor within 1e-5 per weight of after3.safetensors;
    OUT/train/trainer.safetensors present.
LMCC may be the special value `torch_ref`, which runs tests/golden/torch_ref.py behind the same
command lines (a self-test of this script and of the fixtures; trainer.safetensors is not checked then).
Exit status 0 when every case passes, 1 otherwise. OUT is a temporary directory (kept with --keep DIR).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import torch_ref  # noqa: E402

FIXTURES = os.path.join(HERE, "train_fixtures")
GRAD_TOL = 1e-4        # relative to each tensor's largest gradient ...
GRAD_FLOOR = 1e-2      # ... or to this fraction of the largest gradient overall, whichever is larger
WEIGHT_TOL = 1e-5      # per weight after 3 steps
LOSS_REL = 1e-5
LR_REL = 1e-9
NORM_REL = 1e-4
STEPS = 3


def model_cases():
    return sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "spec.toml")))


def command(lmcc, args):
    """The command line for `lmcc ARGS` (args as issue 14 spells them)."""
    if lmcc != "torch_ref":
        return [lmcc] + args
    # torch_ref's positional form of the same request
    sub, spec = args[0], args[1]
    opts = {args[i]: args[i + 1] for i in range(2, len(args), 2)}
    ref = [sys.executable, os.path.join(HERE, "torch_ref.py")]
    if sub == "grad":
        return ref + ["grad", spec, opts["--weights"], opts["--batch"], opts["-o"]]
    return ref + ["train", spec, opts["--weights"], opts["--batches"], opts["-o"], "--steps", opts["--steps"]]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s exited with %d:\n%s" % (" ".join(cmd), p.returncode, p.stderr.strip()[-2000:]))
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip().startswith("{")]


def close(a, b, rel, absolute=0.0):
    return abs(a - b) <= rel * abs(b) + absolute


def compare_tensors(errors, what, got_path, expected, s, tol_of):
    """Every canonical tensor of `s` in got_path, nothing else, shapes equal; |got - expected| <= tol_of(name)."""
    got, _ = torch_ref.read_safetensors(got_path)
    names = [n for n, _ in torch_ref.expected_tensors(s)]
    missing = [n for n in names if n not in got]
    extra = sorted(set(got) - set(names))
    if missing or extra:
        errors.append("%s: missing %s, unexpected %s" % (what, missing, extra))
    worst = (0.0, None)
    for name in names:
        if name not in got:
            continue
        g, e = got[name].double(), expected[name].double()
        if list(g.shape) != list(e.shape):
            errors.append("%s: tensor %r: shape %s, expected %s" % (what, name, list(g.shape), list(e.shape)))
            continue
        tol = tol_of(name)
        err = float((g - e).abs().max()) if g.numel() else 0.0
        if not err <= tol:  # NaN fails too
            k = int((g - e).abs().view(-1).argmax())
            errors.append("%s: tensor %r: max error %.3g > %.3g (element %d: got %.9g, expected %.9g)"
                          % (what, name, err, tol, k, float(g.view(-1)[k]), float(e.view(-1)[k])))
        if tol > 0 and err / tol > worst[0]:
            worst = (err / tol, name)
    return worst


def check_case(lmcc, case, out):
    d = os.path.join(FIXTURES, case)
    spec_path = os.path.join(d, "spec.toml")
    weights = os.path.join(d, "weights.safetensors")
    s = torch_ref.load_spec(spec_path)
    errors = []

    # lmcc grad
    grads_path = os.path.join(out, "grads.safetensors")
    lines = run(command(lmcc, ["grad", spec_path, "--weights", weights, "--batch", os.path.join(d, "batch.json"),
                               "-o", grads_path]))
    with open(os.path.join(d, "grad.json")) as f:
        want = json.load(f)
    if len(lines) != 1 or set(lines[0]) != {"loss", "targets"}:
        errors.append("grad: expected one {\"loss\",\"targets\"} line, got %r" % lines)
    else:
        if lines[0]["targets"] != want["targets"]:
            errors.append("grad: targets %r, expected %r" % (lines[0]["targets"], want["targets"]))
        if not close(lines[0]["loss"], want["loss"], LOSS_REL):
            errors.append("grad: loss %r, expected %r" % (lines[0]["loss"], want["loss"]))
    ref, _ = torch_ref.read_safetensors(os.path.join(d, "grads.safetensors"))
    overall = max(float(t.abs().max()) for t in ref.values())
    g_worst = compare_tensors(errors, "grad", grads_path, ref, s,
                              lambda n: GRAD_TOL * max(float(ref[n].abs().max()), GRAD_FLOOR * overall))

    # lmcc train --steps 3
    train_dir = os.path.join(out, "train")
    lines = run(command(lmcc, ["train", spec_path, "--weights", weights, "--batches",
                               os.path.join(d, "batches.jsonl"), "-o", train_dir, "--steps", str(STEPS)]))
    want = torch_ref.read_batches(os.path.join(d, "steps.jsonl"))
    if len(lines) != STEPS:
        errors.append("train: %d step lines, expected %d" % (len(lines), STEPS))
    for got, exp in zip(lines, want):
        if set(got) != {"step", "loss", "lr", "grad_norm"} or got["step"] != exp["step"]:
            errors.append("train: line %r, expected the keys step, loss, lr, grad_norm and step %d" % (got, exp["step"]))
            continue
        for key, rel in (("loss", LOSS_REL), ("lr", LR_REL), ("grad_norm", NORM_REL)):
            if not close(got[key], exp[key], rel, 1e-15):
                errors.append("train: step %d: %s %r, expected %r" % (exp["step"], key, got[key], exp[key]))
    after3, _ = torch_ref.read_safetensors(os.path.join(d, "after3.safetensors"))
    w_worst = (0.0, None)
    w_path = os.path.join(train_dir, "weights.safetensors")
    if not os.path.isfile(w_path):
        errors.append("train: %s not written" % w_path)
    else:
        w_worst = compare_tensors(errors, "train", w_path, after3, s, lambda n: WEIGHT_TOL)
    if lmcc != "torch_ref" and not os.path.isfile(os.path.join(train_dir, "trainer.safetensors")):
        errors.append("train: %s not written" % os.path.join(train_dir, "trainer.safetensors"))
    return errors, g_worst, w_worst


def main(argv):
    args = argv[1:]
    keep = None
    if "--keep" in args:
        i = args.index("--keep")
        keep = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.stderr.write(__doc__)
        return 2
    lmcc, cases = args[0], args[1:] or model_cases()
    failed = 0
    for case in cases:
        out = os.path.join(keep, case) if keep else tempfile.mkdtemp(prefix="check_train-")
        os.makedirs(out, exist_ok=True)
        try:
            errors, g_worst, w_worst = check_case(lmcc, case, out)
        except Exception as e:  # a crash or bad output is a failure of that case
            errors, g_worst, w_worst = ["%s: %s" % (type(e).__name__, e)], (0, None), (0, None)
        finally:
            if not keep:
                shutil.rmtree(out, ignore_errors=True)
        status = "ok" if not errors else "FAIL"
        print("%-24s %s  (grads: worst %.2g of tolerance at %s; weights: worst %.2g of tolerance at %s)"
              % (case, status, g_worst[0], g_worst[1], w_worst[0], w_worst[1]))
        for e in errors[:20]:
            print("    " + e)
        failed += bool(errors)
    print("%d of %d cases passed" % (len(cases) - failed, len(cases)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
