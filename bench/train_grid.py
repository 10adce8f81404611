#!/usr/bin/env python3
"""The training benchmark grid (issue 14, deliverable 6): lmcc's compiled train step vs PyTorch eager.

Run by scripts/bench-train.sh (which picks the virtual environment with torch); by hand:
  python bench/train_grid.py [--models tta_base,bilm_base,unilm_base] [--shapes 32x64,8x128]
                             [--threads 1,2] [--steps 5] [--work DIR] [--out FILE.md]

For every model (models/<name>.toml; each family's own objective: tta autoencoding, bilm masked,
unilm causal), batch shape B x n and thread count, in this order and each in its own process:
  1. build/bench/train_bench: lmcc's `lm_rt_train_step_ex` (library from `lmcc compile --train`,
     weights from `lmcc init --seed 1`), which also writes the batch it built (--dump-batch);
  2. bench/train_peers.py on the same weights and batch, after checking that its loss and
     tests/golden/torch_ref.py's equal lmcc's first-step loss within 1e-4 (an entry that fails the
     check is reported, not timed).
--rounds R (default 3) repeats the pair R times, the order reversed every other round (lmcc, torch; torch,
lmcc; ...): on a shared host the same entry moves 10-20% between processes minutes apart, so the speedup is
the median over rounds of that round's torch ms / lmcc ms, with the rounds lmcc won, and each system's ms/step
the median of its rounds' medians.
Train FLOPs per step: `lmcc compile SPEC --stats --n n --train` (the `train:` line, per sentence at
batch 1) times B. Peak: train_bench --peak-only at each thread count (FP32 FMA chains), measured
once at the start. Raw JSON lines go to <out>.jsonl next to the report; the report is rewritten
after every entry, so an interrupted run keeps what finished.
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def run(cmd, check=True):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(map(str, cmd)), p.stdout,
                                                             p.stderr))
    return p


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return None


def machine():
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512vl", "avx512_bf16", "amx_tile") if f in flags]
    return "%s, %d logical CPUs, flags %s; kernel %s" % (model, os.cpu_count(), " ".join(simd), platform.release())


def measure_peaks(a, threads, header):
    """The FP32 FMA peak per thread count: the best of kernel_bench's machine/peak and train_bench
    --peak-only, over every measurement of this run (a busy machine only lowers a measurement)."""
    got = header.setdefault("peak_measurements", [])
    kb = BUILD / "bench" / "kernel_bench"
    if kb.exists():
        p = run([kb, "--benchmark_filter=machine/peak", "--benchmark_format=json"], check=False)
        if p.returncode == 0:
            for b in json.loads(p.stdout[p.stdout.index("{"):])["benchmarks"]:
                m = re.match(r"machine/peak/threads:(\d+)", b["name"])
                if m and int(m.group(1)) in threads:
                    got.append(("kernel_bench", int(m.group(1)), b["GFLOPs"] / 1e9 if b["GFLOPs"] > 1e6 else b["GFLOPs"]))
    for t in threads:
        got.append(("train_bench", t, last_json(run([a.train_bench, "--peak-only", "--threads", t]).stdout)["peak_gflops"]))
    for t in threads:
        header["peak"][t] = max(g for _, tt, g in got if tt == t)


def useful_flops(stats_flops_per_sentence, B, n, targets, d_model, vocab):
    """--stats counts the loss head (8 D V per row: forward, recomputed logits, dh, dW) on every row;
    both systems run it on the target rows only, so the rows without a target are taken out."""
    return stats_flops_per_sentence * B - (B * n - targets) * 8 * d_model * vocab


def median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def fmt(v, spec="%.0f"):
    return "-" if v is None else spec % v


def gaps_section(rows):
    """Every entry where lmcc is not ahead (median ratio under 1, or lmcc won at most half of the rounds), with where
    the step's difference is by the breakdown columns (forward + backward against clipping + optimizer) and both
    systems' roofline fractions (the same fraction on a GEMM-bound step: level on the GEMMs)."""
    md = ["", "## Gaps", "",
          "Entries where lmcc is not ahead of PyTorch (median ratio under 1.00x, or lmcc won at most half of the "
          "rounds), with the breakdown of the difference (first round's `--breakdown`; positive: lmcc slower). "
          "A step where both systems sit at the same roofline fraction is GEMM-bound in both: its time is the "
          "GEMMs' (bench/results/2026-12-06-train-probes.md profiles the biLM step call by call).", ""]
    gaps = 0
    for r in rows:
        L, T, ratios = r.get("lmcc"), r.get("torch"), r.get("ratios", [])
        if not ratios or not L or not T or "ms_per_step" not in T:
            continue
        won = sum(x > 1 for x in ratios)
        if median(ratios) >= 1 and 2 * won > len(ratios):
            continue
        gaps += 1
        parts = []
        if L.get("grad_ms", -1) > 0 and "fwd_ms" in T:
            grad = L["grad_ms"] - (T["fwd_ms"] + T["bwd_ms"])
            opt = (L["ms_per_step"] - L["grad_ms"]) - T.get("opt_ms", 0.0)
            parts.append("forward + backward %+.0f ms, clipping + optimizer %+.0f ms" % (grad, opt))
        parts.append("roofline %.1f%% (lmcc) / %.1f%% (torch)" % (100 * L["roofline_fraction"],
                                                                 100 * T["roofline_fraction"]))
        parts.append("%d of %d rows with a target" % (L["targets"], r["B"] * r["n"]))
        md.append("- %s %s B %d n %d, %d thread%s: %.2fx (lmcc won %d of %d rounds); %s." % (
            r["model"], r["objective"], r["B"], r["n"], r["threads"], "s" if r["threads"] > 1 else "",
            median(ratios), won, len(ratios), "; ".join(parts)))
    if not gaps:
        md.append("None: lmcc is ahead on every timed entry.")
    return md


def write_report(path, args, header, rows, missing):
    md = ["# Training benchmark: lmcc compiled train step vs PyTorch eager (%s)" % header["date"], "",
          "Command: `%s`" % header["command"], "",
          "Machine: %s. FP32 FMA peak used: %s (the best of %s; a busy machine only lowers a "
          "measurement)." % (
              header["machine"], ", ".join("%.1f GFLOP/s at %d thread%s" % (g, t, "s" if t > 1 else "")
                                           for t, g in sorted(header["peak"].items())),
              ", ".join("%s %dt %.1f" % m for m in header.get("peak_measurements", []))),
          "",
          "lmcc %s; %s, AdamW `%s`. Each entry: one warm-up step, then %d timed steps "
          "(median ms/step; the same batch every step); every system in its own process, lmcc and torch of an "
          "entry back to back, %d round(s) in alternating order (speedup: the median of the rounds' torch / lmcc "
          "ratios and the rounds lmcc won; ms/step: the median of each system's round medians). Batches: B random sentences of exactly n tokens (bos, uniform non-special ids, eos), "
          "the family's objective (tta autoencoding, bilm masked, unilm causal) by lmcc's makeExamples; torch "
          "trains on the identical batch (dumped by train_bench) and its loss on it was checked against lmcc's "
          "first-step loss (and tests/golden/torch_ref.py's) within 1e-4 before timing. Optimizer from the specs' "
          "default [train] (AdamW lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01 on rank >= 2, clip 1.0, "
          "linear schedule)." % (header["lmcc"], header["torch"], args.adamw, args.steps, args.rounds),
          "",
          "**Noise**: the machine was shared with other engineers' builds (load average %s at the start, %s at "
          "the end), so timings are noisy; compare lmcc and torch within a row (run back to back) rather than "
          "across rows." % (header["load_start"], header.get("load_end", "?")),
          "",
          "Roofline fraction = (train FLOPs per step / median step time) / FP32 FMA peak at that thread count; "
          "train FLOPs per step = `lmcc compile SPEC --stats --n n --train` (`train:` line, per sentence) x B, "
          "less the loss head's 8 x d_model x vocab FLOPs (forward, recomputed logits, dh, dW) of every row "
          "without a target (--stats counts the head on every row; both systems run it on target rows only: "
          "this matters for the masked objective). The same count is used for torch (which does not recompute "
          "the logits, so its own count is ~2 x d_model x vocab per target row lower). Since 2026-12-07 lmcc also "
          "runs the masked objective's last layer (query side, output projection, FFN, norms) on the target rows "
          "only (lm-prune-loss-rows), which this count, the work PyTorch does, does not take out: lmcc's fraction "
          "of the masked entries is an effective one, above the share of the peak its own FLOPs use.",
          "",
          "Breakdown columns: lmcc `grad` = `lm_rt_loss_and_grad` alone (forward + backward, best of two, "
          "timed after the steps), `opt` = step - grad (clipping, AdamW, schedule, gradient bookkeeping); "
          "torch `fwd+bwd` and `opt` (clip_grad_norm_ + AdamW + LambdaLR) are the medians of the timed "
          "steps' phases.",
          "",
          "| model | objective | B | n | threads | lmcc ms/step | torch ms/step | speedup | lmcc tokens/s | "
          "torch tokens/s | lmcc peak MB | torch peak MB | lmcc roofline | torch roofline | lmcc spread | "
          "torch spread | grad ms lmcc / torch | opt ms lmcc / torch | loss (lmcc / torch) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L, T = r.get("lmcc"), r.get("torch")
        ratios = r.get("ratios", [])
        speed = ("%.2fx, %d/%d" % (median(ratios), sum(x > 1 for x in ratios), len(ratios))) if ratios else None
        tt = T if (T and "ms_per_step" in T) else None
        lg = L and L.get("grad_ms", -1) > 0 and L["grad_ms"]
        md.append("| %s | %s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["objective"], r["B"], r["n"], r["threads"],
            fmt(L and L["ms_per_step"]), fmt(tt and tt["ms_per_step"]) if tt else (T.get("note", "-") if T else "-"),
            fmt(speed, "%s"), fmt(L and L["tokens_per_s"]), fmt(tt and tt["tokens_per_s"]),
            fmt(L and L["peak_rss_mb"]), fmt(tt and tt["peak_rss_mb"]),
            fmt(L and 100 * L["roofline_fraction"], "%.1f%%"), fmt(tt and 100 * tt["roofline_fraction"], "%.1f%%"),
            fmt(L and L["spread_pct"], "%.1f%%"), fmt(tt and tt["spread_pct"], "%.1f%%"),
            "%s / %s" % (fmt(lg or None), fmt(tt and "fwd_ms" in tt and tt["fwd_ms"] + tt["bwd_ms"])),
            "%s / %s" % (fmt(lg and L["ms_per_step"] - lg), fmt(tt and tt.get("opt_ms"))),
            "%s / %s" % (fmt(L and L["first_loss"], "%.5f"), fmt(tt and tt.get("check_torch"), "%.5f"))))
    if missing:
        md += ["", "Missing entries: " + "; ".join(missing)]
    md += gaps_section(rows)
    md += ["", "Train FLOPs per step (GFLOP) and targets per batch:", ""]
    seen = set()
    for r in rows:
        L = r.get("lmcc")
        key = (r["model"], r["B"], r["n"])
        if L and key not in seen:
            seen.add(key)
            md.append("- %s B %d n %d: %.1f GFLOP (--stats x B: %.1f), %d target rows of %d, %d parameters" % (
                r["model"], r["B"], r["n"], L["train_flops_per_step"] / 1e9, r["stats_flops"] / 1e9, L["targets"],
                r["B"] * r["n"], L["params"]))
    md += ["", "Raw JSON lines (both systems, every field): `%s`." % Path(args.out).with_suffix(".jsonl").name, ""]
    Path(path).write_text("\n".join(md))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tta_base,bilm_base,unilm_base")
    ap.add_argument("--shapes", default="32x64,8x128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="lmcc / torch pairs per entry, alternating order")
    ap.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True,
                    help="lmcc: also time loss_and_grad alone (train_bench --breakdown)")
    ap.add_argument("--adamw", default="fused", choices=("fused", "foreach", "for-loop"))
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "lmcc-bench" / "train-work"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / ("%s-train.md" % datetime.date.today())))
    ap.add_argument("--lmcc", default=str(BUILD / "bin" / "lmcc"))
    ap.add_argument("--train-bench", default=str(BUILD / "bench" / "train_bench"))
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    # A second run on one day keeps the first's report: <date>-train-b.md and so on.
    from run import free_stem  # bench/run.py, beside this script
    out = Path(a.out)
    a.out = str(out.with_name(free_stem(out.parent, out.stem) + out.suffix))
    raw_path = Path(a.out).with_suffix(".jsonl")
    raw_path.write_text("")
    import torch  # the peer's version, for the report

    threads = [int(t) for t in a.threads.split(",")]
    header = {
        "date": str(datetime.date.today()),
        "command": "scripts/bench-train.sh " + " ".join(argv) if argv else "scripts/bench-train.sh",
        "machine": machine(),
        "torch": "PyTorch %s (PyPI wheel, CPU, eager fp32)" % torch.__version__,
        "lmcc": run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).stdout.strip(),
        "load_start": "%.1f" % os.getloadavg()[0],
        "peak": {},
    }
    measure_peaks(a, threads, header)
    log("machine: %s; peak %s" % (header["machine"], header["peak"]))
    rows, missing = [], []
    peers = [sys.executable, ROOT / "bench" / "train_peers.py"]
    for model in a.models.split(","):
        spec = ROOT / "models" / ("%s.toml" % model)
        lib = work / model
        log("%s: lmcc check / compile --train / init" % model)
        run([a.lmcc, "check", spec])
        t0 = time.time()
        run([a.lmcc, "compile", spec, "--train", "-o", lib])
        log("%s: compiled in %.0f s" % (model, time.time() - t0))
        weights = lib / "init.safetensors"
        if not weights.exists():
            run([a.lmcc, "init", spec, "--seed", "1", "-o", weights])
        for shape in a.shapes.split(","):
            B, n = map(int, shape.split("x"))
            stats = run([a.lmcc, "compile", spec, "--stats", "--n", n, "--train"]).stdout
            m = re.search(r"train: flops=(\d+)", stats)
            stats_flops = float(m.group(1))
            batch = work / ("%s-%dx%d.json" % (model, B, n))
            for t in threads:
                row = {"model": model, "B": B, "n": n, "threads": t, "objective": "?", "stats_flops": stats_flops * B,
                       "ratios": []}
                rows.append(row)
                entry = "%s %dx%d t%d" % (model, B, n, t)

                def lmcc_round(rnd):
                    log("%s B %d n %d threads %d: lmcc (round %d)" % (model, B, n, t, rnd + 1))
                    p = run([a.train_bench, "--spec", spec, "--lib", lib, "--weights", weights, "--batch", B,
                             "--n", n, "--threads", t, "--steps", a.steps, "--flops", "%.0f" % (stats_flops * B),
                             "--peak-gflops", header["peak"][t], "--dump-batch", batch, "--lmcc", a.lmcc]
                            + (["--breakdown"] if a.breakdown and rnd == 0 else []), check=False)
                    L = last_json(p.stdout) if p.returncode == 0 else None
                    if L is None:
                        missing.append("%s lmcc failed: %s" % (entry, p.stderr.strip()[-300:]))
                        log(missing[-1])
                        return None
                    log("  lmcc %.0f ms/step, loss %.6f, %.0f MB" % (L["ms_per_step"], L["first_loss"],
                                                                     L["peak_rss_mb"]))
                    return L

                def torch_round(rnd, first_loss):
                    log("%s B %d n %d threads %d: torch (round %d)" % (model, B, n, t, rnd + 1))
                    p = run(peers + ["--spec", spec, "--weights", weights, "--batch-file", batch, "--threads", t,
                                     "--steps", a.steps, "--expect-loss", "%.9g" % first_loss, "--flops", "0",
                                     "--peak-gflops", header["peak"][t], "--adamw", a.adamw], check=False)
                    T = last_json(p.stdout)
                    if T is None or p.returncode != 0:
                        note = "check failed" if (T and T.get("check") == "fail") else "failed"
                        missing.append("%s torch %s: %s" % (entry, note, json.dumps(T) if T else
                                                            p.stderr.strip()[-300:]))
                        log(missing[-1])
                        return {"note": note}
                    log("  torch %.0f ms/step, loss %.6f (torch_ref %.6f), %.0f MB" % (
                        T["ms_per_step"], T["check_torch"], T["check_torch_ref"], T["peak_rss_mb"]))
                    return T

                # Round 0 runs lmcc first (torch checks its loss against lmcc's and trains on the batch it wrote).
                Ls, Ts = [], []
                for rnd in range(a.rounds):
                    if rnd % 2 == 0:
                        L = lmcc_round(rnd)
                        T = torch_round(rnd, L["first_loss"]) if L else None
                    else:
                        T = torch_round(rnd, Ls[0]["first_loss"])
                        L = lmcc_round(rnd)
                    if not L or not T or "ms_per_step" not in T:
                        row["torch"] = T if T and "ms_per_step" not in T else row.get("torch")
                        break
                    Ls.append(L), Ts.append(T)
                    row["ratios"].append(T["ms_per_step"] / L["ms_per_step"])
                if Ls:
                    # The first round's fields (losses, breakdown, targets), the median of the rounds' step times.
                    L = dict(Ls[0], ms_per_step=median([x["ms_per_step"] for x in Ls]),
                             rounds_ms=[x["ms_per_step"] for x in Ls],
                             peak_rss_mb=max(x["peak_rss_mb"] for x in Ls))
                    L["tokens_per_s"] = B * n / (L["ms_per_step"] / 1e3)
                    flops = useful_flops(stats_flops, B, n, L["targets"], L["d_model"], L["vocab"])
                    L["train_flops_per_step"] = flops
                    L["gflops"] = flops / (L["ms_per_step"] / 1e3) / 1e9
                    L["roofline_fraction"] = L["gflops"] / header["peak"][t]
                    row["lmcc"], row["objective"] = L, L["objective"]
                if Ts:
                    T = dict(Ts[0], ms_per_step=median([x["ms_per_step"] for x in Ts]),
                             rounds_ms=[x["ms_per_step"] for x in Ts],
                             peak_rss_mb=max(x["peak_rss_mb"] for x in Ts))
                    T["tokens_per_s"] = B * n / (T["ms_per_step"] / 1e3)
                    T["train_flops_per_step"] = row["lmcc"]["train_flops_per_step"]
                    T["gflops"] = T["train_flops_per_step"] / (T["ms_per_step"] / 1e3) / 1e9
                    T["roofline_fraction"] = T["gflops"] / header["peak"][t]
                    row["torch"] = T
                for sysname in ("lmcc", "torch"):
                    if row.get(sysname) and "ms_per_step" in row[sysname]:
                        with raw_path.open("a") as f:
                            f.write(json.dumps(row[sysname]) + "\n")
                header["load_end"] = "%.1f" % os.getloadavg()[0]
                write_report(a.out, a, header, rows, missing)
    header["load_end"] = "%.1f" % os.getloadavg()[0]
    measure_peaks(a, threads, header)
    for r in rows:
        for sysname in ("lmcc", "torch"):
            e = r.get(sysname)
            if e and "gflops" in e and e["gflops"]:
                e["peak_gflops"] = header["peak"][r["threads"]]
                e["roofline_fraction"] = e["gflops"] / e["peak_gflops"]
    raw_path.write_text("".join(json.dumps(r[s]) + "\n" for r in rows for s in ("lmcc", "torch")
                                if r.get(s) and "ms_per_step" in r[s]))
    write_report(a.out, a, header, rows, missing)
    log("wrote %s and %s" % (a.out, raw_path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
