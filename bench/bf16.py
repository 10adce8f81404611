#!/usr/bin/env python3
"""bf16 weights (issue 20): lmcc --weights-dtype bf16 against its own fp32 libraries and PyTorch (fp32, and bf16
autocast on CPU), side by side in one run, and the error of the bf16 scores on every bundled model.

Run through scripts/bench-bf16.sh (the bench environment: PyTorch). Steps:
  1. The machine's FP32 FMA peak and bandwidth (kernel_bench), and which bf16 kernel the CPU gets (AMX, AVX512_BF16 or widening).
  2. model_bench times the fp32 and bf16 libraries of the paper-size models (T-TA, uniLM, biLM PLL, BERT-base
     PLL) on the same ids; PyTorch fp32 and PyTorch with bf16 autocast compute the same entry on the same ids.
  3. Accuracy: `lmcc score` with and without --weights-dtype bf16 on every bundled model (random weights,
     lmcc init --seed 7) over 32 random sentences of 5-64 tokens: the largest and mean per-token difference.
  4. bench/results/<date>-bf16.md (<date>-bf16-b.md, ... when there is one).
"""
import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as suite  # noqa: E402  (bench/run.py: workspace, model_bench driver)

ROOT, LMCC, log = suite.ROOT, suite.LMCC, suite.log

# (model, entry, n, batch): the batch-1 entries are the ones the 1.6x target is about.
POINTS = [("tta", "score", 20, 1), ("tta", "score", 128, 1), ("tta", "score", 20, 32), ("tta", "score", 128, 32),
          ("unilm", "score", 20, 1), ("unilm", "score", 128, 1), ("unilm", "score", 128, 32),
          ("bilm", "score", 20, 1), ("bilm", "score", 40, 1), ("bert", "score", 20, 1)]
PEER_METHOD = {"tta": "tta-score", "unilm": "causal", "bilm": "pll-batched", "bert": "pll-batched"}
ACCURACY_MODELS = ["tta_base", "tta_mask_base", "unilm_base", "bilm_base", "bert_base", "ngram_clm"]


def cpu_flags():
    return set(Path("/proc/cpuinfo").read_text().split())


def bf16_kernel(ws):
    """What lmcc's bf16 GEMM uses on this CPU: read off the bf16 library's kernels (the driver's choice,
    codegen::targetBf16Kernel: AMX, else AVX512_BF16 dot products where they run at the FMA's rate, else widening)."""
    symbols = suite.run(["nm", ws.library("tta", "bf16")])
    if "_bf16amx" in symbols:
        return "AMX tile dot products (tdpbf16ps)"
    if "_bf16dot" in symbols:
        return "vdpbf16ps dot products"
    why = " (this CPU's vdpbf16ps runs below its FMA rate)" if "avx512_bf16" in cpu_flags() else ""
    return "bf16 weights widened to f32 in the kernel" + why


def time_torch(ws, model, n, batch, system, threads, budget=1.0):
    import numpy as np
    import peers
    spec, weights = peers.load(str(ROOT / suite.MODELS[model][0]), str(ws.weights(model)))
    peer = peers.make_peer(system, PEER_METHOD[model], spec, weights, threads, str(ws.work / "peers"))
    ids = suite.read_ids(ws.ids(model, n, batch))
    t0 = time.perf_counter()
    got = np.asarray(peer(ids), dtype=np.float64)
    times = [time.perf_counter() - t0]
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        peer(ids)
        times.append(time.perf_counter() - t0)
        if times[-1] > 5:
            break
    return statistics.median(times[1:] if len(times) > 2 else times), got


def accuracy(work, models, sentences=32, seed=11):
    rows = []
    for m in models:
        spec = ROOT / "models" / (m + ".toml")
        weights = work / (m + "-acc.safetensors")
        if not weights.exists():
            suite.run([LMCC, "init", spec, "--seed", "7", "-o", weights])
        info = json.loads(suite.run([LMCC, "check", spec, "--json"]))
        tok, vocab, max_len = info["tokens"], info["dims"]["vocab"], info["dims"]["max_len"]
        special = {v for v in tok.values() if v is not None and v >= 0}
        rng = random.Random(seed)
        lines = []
        for _ in range(sentences):
            n = rng.randint(5, min(64, max_len))
            row = [rng.randrange(999, vocab) for _ in range(n)]
            row = [x if x not in special else 1000 for x in row]
            if tok.get("bos", -1) >= 0:
                row[0] = tok["bos"]
            if tok.get("eos", -1) >= 0:
                row[-1] = tok["eos"]
            lines.append(" ".join(map(str, row)))
        ids = work / (m + "-acc-ids.txt")
        ids.write_text("\n".join(lines) + "\n")
        outs = {}
        try:
            for dtype in ("f32", "bf16"):
                text = suite.run([LMCC, "score", spec, "--weights", weights, "--ids", ids, "--weights-dtype", dtype])
                outs[dtype] = [json.loads(line) for line in text.splitlines() if line.strip()]
        except subprocess.CalledProcessError as e:
            rows.append((m, "failed: %s" % (e.stderr or "").strip().splitlines()[-1:]))
            continue
        diffs, sdiffs = [], []
        for a, b in zip(outs["f32"], outs["bf16"]):
            diffs += [abs(x - y) for x, y in zip(a["token_logprobs"], b["token_logprobs"])]
            sdiffs.append(abs(a["score"] - b["score"]))
        rows.append((m, {"tokens": len(diffs), "max": max(diffs), "mean": statistics.mean(diffs),
                         "max_score": max(sdiffs)}))
        log("accuracy %s: max |bf16 - fp32| per token %.3g" % (m, max(diffs)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "lmcc-bench" / "work"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    start_wall = time.time()
    ws = suite.Workspace(args.work)
    limits = suite.machine_limits(suite.run_kernel_bench(False, ws.work / "kernel_bench-bf16.json", machine_only=True))
    points = [suite.Point(m, v, e, n, b, args.threads) for (m, e, n, b) in POINTS for v in ("opt", "bf16")]
    lmcc = suite.run_model_bench(ws, points, limits, False, est_limit=60)
    import numpy as np
    torch_rows = {}
    for (m, e, n, b) in POINTS:
        ref = suite.load_output(lmcc[suite.Point(m, "opt", e, n, b, args.threads).name]["output"], e)
        for system in ("torch", "torch-bf16"):
            try:
                t, got = time_torch(ws, m, n, b, system, args.threads)
                torch_rows[(m, n, b, system)] = (t, float(np.max(np.abs(got.reshape(ref.shape) - ref))))
                log("%s %s n %d batch %d: %.2f ms" % (system, m, n, b, t * 1e3))
            except Exception as ex:  # reported, the run goes on
                torch_rows[(m, n, b, system)] = ("%s: %s" % (type(ex).__name__, ex), None)
    acc = accuracy(ws.work, ACCURACY_MODELS)

    import torch
    date = datetime.date.today().isoformat()
    version = suite.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
    md = ["# bf16 weights, %s" % date, "",
          "Command: `scripts/bench-bf16.sh` (%.0f s wall). lmcc %s, PyTorch %s (PyPI wheel, CPU). %s threads. "
          "AVX512_BF16 on this CPU: %s, AMX-BF16: %s (lmcc uses %s)." % (
              time.time() - start_wall, version, torch.__version__, args.threads,
              "yes" if "avx512_bf16" in cpu_flags() else "no", "yes" if "amx_bf16" in cpu_flags() else "no",
              bf16_kernel(ws)), "",
          "Machine: " + suite.machine_text(limits), "",
          "## Speed (same weights and ids; medians in ms per call)", "",
          "`lmcc bf16` = `lmcc compile --weights-dtype bf16`: the GEMM weights (linear layers, vocabulary "
          "projection) packed as bf16 pairs at load time. `torch bf16` = the same PyTorch module under "
          "`torch.autocast('cpu', dtype=torch.bfloat16)`. Score diff = max |score - lmcc fp32 score| over the batch "
          "(sentence sums of n log-probs).", "",
          "| model | n | batch | lmcc fp32 | lmcc bf16 | bf16 speedup | torch fp32 | torch bf16 | lmcc bf16 vs torch bf16 | "
          "lmcc bf16 score diff | torch bf16 score diff |", "|" + "---|" * 11]
    for (m, e, n, b) in POINTS:
        f = lmcc.get(suite.Point(m, "opt", e, n, b, args.threads).name, {})
        h = lmcc.get(suite.Point(m, "bf16", e, n, b, args.threads).name, {})
        tf, tb = torch_rows.get((m, n, b, "torch")), torch_rows.get((m, n, b, "torch-bf16"))

        def ms(r):
            return "%.2f" % (r["median"] * 1e3) if r and "median" in r else (r or {}).get("skipped", "-")

        def tms(r):
            return "%.2f" % (r[0] * 1e3) if r and isinstance(r[0], float) else (r[0] if r else "-")
        sp = "%.2fx" % (f["median"] / h["median"]) if "median" in f and "median" in h else "-"
        vs = "%.2fx" % (tb[0] / h["median"]) if tb and isinstance(tb[0], float) and "median" in h else "-"
        own = "-"
        if "output" in f and "output" in h:
            own = "%.2g" % float(np.max(np.abs(suite.load_output(h["output"], e) - suite.load_output(f["output"], e))))
        md.append("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            m, n, b, ms(f), ms(h), sp, tms(tf), tms(tb), vs, own, "%.2g" % tb[1] if tb and tb[1] is not None else "-"))
    md += ["", "## Accuracy on the bundled models", "",
           "`lmcc score` fp32 vs `--weights-dtype bf16`, random weights (`lmcc init --seed 7`), 32 random sentences "
           "of 5-64 tokens. The contract: within 2e-2 per token.", "",
           "| model | tokens | max per-token diff | mean per-token diff | max sentence-score diff |", "|---|---|---|---|---|"]
    for m, r in acc:
        if isinstance(r, dict):
            md.append("| %s | %d | %.2g | %.2g | %.2g |" % (m, r["tokens"], r["max"], r["mean"], r["max_score"]))
        else:
            md.append("| %s | %s | - | - | - |" % (m, r))
    # A second run on one day gets <date>-bf16-b.md, ... (it overwrote the first's report on 2026-12-06).
    out = Path(args.out) / (suite.free_stem(Path(args.out), "%s-bf16" % date) + ".md")
    out.write_text("\n".join(md) + "\n")
    log("wrote %s" % out)


if __name__ == "__main__":
    main()
