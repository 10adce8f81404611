#!/usr/bin/env python3
"""The lmcc benchmark suite: generated libraries vs PyTorch and ONNX Runtime, against the machine's limits.

Run through scripts/bench.sh [--quick] (it builds the programs and the Python environment). Steps:
  1. kernel_bench: the machine's FP32 FMA peak and read bandwidth (1 and 2 threads), GEMM kernels
     (generated, Eigen, OpenBLAS) and the generated attention per mask kind.
  2. `lmcc init` random weights and `lmcc compile` libraries for every variant (optimized, --naive,
     --no-<pass>) of the bundled paper-size models; `lmcc compile --stats` gives each pipeline's FLOPs.
  3. model_bench times the entry points without peers (dropped passes) on the same token ids (one file
     per n and batch) and writes the first call's results.
  4. Every entry with peers (bench/peers.py: PyTorch and ONNX Runtime on the same weights and ids) in
     alternating rounds: lmcc's library and its naive one in a model_bench process per round, each peer
     checked against lmcc's results before it is timed (a peer that disagrees is reported, not timed).
  5. Two threads side by side: every 2-thread entry the issue's scaling line covers (batch >= 8 or n >= 40)
     against its 1-thread twin in one model_bench process (--ab, the same library at 1 and 2 threads, calls
     alternating): the ratio the report and its gaps use, where the grid's two medians were timed minutes apart.
  6. `perf record` of every gap entry (behind a peer, far from its bound, or not scaling to 2 threads)
     alone: where its time goes, for the report's gaps section.
  7. bench/results/<date>.md (medians, spread, roofline bounds, speedups, gaps) and PNG plots.

Roofline bound of a call: max(FLOPs / peak, weight bytes / read bandwidth), with the FLOPs of that
call's own pipeline (`lmcc compile --stats`, times the batch), the peak and bandwidth measured in
this run for the same thread count, and the weight bytes the model reads at least once per call.
"""
import argparse
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
LMCC = BUILD / "bin" / "lmcc"
PASSES = ["fuse-attention", "fuse-logprob", "batch-mask-predict", "share-first-layer", "prune-rows",
          "hoist-isolated-kv", "fold-constants", "fuse-activation"]
MODELS = {  # key: (spec, what it is)
    "tta": ("models/tta_base.toml", "T-TA (3 layers, d 512, 8 heads, FFN 2048, vocab 30522)"),
    "bilm": ("models/bilm_base.toml", "biLM of the same size, PLL by mask-and-predict"),
    "unilm": ("models/unilm_base.toml", "uniLM of the same size, causal scoring"),
    "bert": ("models/bert_base.toml", "BERT-base (12 layers, d 768), PLL"),
}
# lmcc entry point -> the peer methods that compute the same thing (bench/peers.py)
PEER_METHODS = {("tta", "score"): ["tta-score"], ("tta", "embed"): ["tta-embed"],
                ("bilm", "score"): ["pll-naive", "pll-batched"], ("bert", "score"): ["pll-naive", "pll-batched"],
                ("unilm", "score"): ["causal"]}
# Alternating rounds of an entry with peers, by its longest call in round 1: (up to seconds, rounds); 1 with --quick.
# On a shared host the same call moves by 2x within seconds: 8 rounds of short calls, each pairing lmcc with its
# peers a few seconds apart, are what make a 10-20% verdict repeatable.
ROUNDS = ((0.5, 8), (2.0, 4), (None, 2))
ROUND_SECONDS = 0.25  # each contender's calls per round
KERNEL_BENCH_D = 512  # kernel_bench's attention operands: [batch, n, 512] fp32, 8 heads (its kModel)
# Side-by-side thread scaling (model_bench --ab at 1 and 2 threads), by the 1-thread median: (up to seconds, rounds);
# entries with longer calls keep the ratio of the grid's medians.
SCALING_ROUNDS = ((0.5, 8), (2.0, 4), (10.0, 2))


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


# The build a run measures: the tools it calls, stamped when it starts. Libraries are compiled lazily with
# build/bin/lmcc and build/bench/* run entry by entry, so a rebuild during a run would mix two builds in one report
# (or stop it half way with an obscure error): a changed stamp stops the run saying so.
BUILD_TOOLS = (LMCC, BUILD / "bench" / "model_bench", BUILD / "bench" / "kernel_bench", BUILD / "lib" / "liblmrt.so")
_build_stamp = None


def check_build():
    global _build_stamp
    stamp = tuple(p.stat().st_mtime_ns if p.exists() else None for p in BUILD_TOOLS)
    if _build_stamp is None:
        _build_stamp = stamp
    elif stamp != _build_stamp:
        changed = [os.path.relpath(p, ROOT) for p, a, b in zip(BUILD_TOOLS, _build_stamp, stamp) if a != b]
        raise SystemExit("bench: %s changed since the run started: its results would mix two builds; run a grid "
                         "meant to last from a clone of its own (git clone . DIR && DIR/scripts/bench.sh)"
                         % ", ".join(changed))


def bench_binary(name):
    """build/bench/<name>, the build unchanged since the run started."""
    check_build()
    return str(BUILD / "bench" / name)


def run(cmd, **kw):
    check_build()
    return subprocess.run([str(c) for c in cmd], check=True, text=True, capture_output=True, **kw).stdout


# ----------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------

class Point:
    """One lmcc measurement: model variant, entry, n, batch, threads."""

    def __init__(self, model, variant, entry, n, batch, threads):
        self.model, self.variant, self.entry, self.n, self.batch, self.threads = model, variant, entry, n, batch, threads

    @property
    def name(self):
        return "%s/%s/%s/n:%d/batch:%d/threads:%d" % (self.model, self.variant, self.entry, self.n, self.batch,
                                                      self.threads)


def variant_flags(variant):
    if variant == "opt":
        return []
    if variant == "naive":
        return ["--naive"]
    if variant == "bf16":
        return ["--weights-dtype", "bf16"]
    return ["--" + variant]  # no-<pass>


def make_plan(quick, only=None):
    """The grid's points; with `only`, those whose name matches that regular expression."""
    pts = []
    if quick:
        ns, batches, threads = [20], [1], [1]
    else:
        ns, batches, threads = [10, 20, 40, 80, 128], [1, 32], [1, 2]
    for n in ns:
        for b in batches:
            for t in threads:
                pts += [Point("tta", "opt", "score", n, b, t), Point("tta", "opt", "embed", n, b, t),
                        Point("tta", "naive", "score", n, b, t), Point("bilm", "opt", "score", n, b, t),
                        Point("bilm", "naive", "score", n, b, t), Point("unilm", "opt", "score", n, b, t)]
    if not quick:
        pts += [Point("bilm", "no-" + p, "score", 20, 1, 1) for p in PASSES]
        for n in (10, 20, 40):
            for t in (1, 2):
                pts += [Point("bert", "opt", "score", n, 1, t), Point("bert", "naive", "score", n, 1, t)]
    return [p for p in pts if not only or re.search(only, p.name)]


# ----------------------------------------------------------------------------
# Inputs: weights, libraries, ids, FLOPs
# ----------------------------------------------------------------------------

class Workspace:
    def __init__(self, work):
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.specs = {}
        self.flop_cache = {}

    def spec(self, model):
        if model not in self.specs:
            self.specs[model] = json.loads(run([LMCC, "check", ROOT / MODELS[model][0], "--json"]))
        return self.specs[model]

    def weights(self, model):
        path = self.work / ("%s.safetensors" % model)
        if not path.exists():
            log("lmcc init %s" % model)
            run([LMCC, "init", ROOT / MODELS[model][0], "--seed", "7", "-o", path])
        return path

    def library(self, model, variant):
        """lib<name>.so of a variant, rebuilt when lmcc or the spec is newer."""
        out = self.work / "lib" / ("%s-%s" % (model, variant))
        spec = ROOT / MODELS[model][0]
        lib = out / ("lib%s.so" % self.spec(model)["name"])
        if not lib.exists() or lib.stat().st_mtime < max(LMCC.stat().st_mtime, spec.stat().st_mtime):
            log("lmcc compile %s %s" % (model, " ".join(variant_flags(variant))))
            out.parent.mkdir(parents=True, exist_ok=True)  # -o creates only the last level
            run([LMCC, "compile", spec, "-o", out] + variant_flags(variant))
        return lib

    def flops(self, model, variant, entry, n):
        key = (model, variant, entry, n)
        if key not in self.flop_cache:
            text = run([LMCC, "compile", ROOT / MODELS[model][0], "--stats", "--n", n] + variant_flags(variant))
            for line in text.splitlines():
                name, _, rest = line.partition(":")
                fields = dict(kv.split("=") for kv in rest.split())
                if "flops" in fields:
                    self.flop_cache[(model, variant, name.strip(), n)] = int(fields["flops"])
        return self.flop_cache[key]

    def ids(self, model, n, batch):
        """batch sentences of n ids: bos ... eos (when the spec has them), random non-special ids between."""
        tok = self.spec(model)["tokens"]
        vocab = self.spec(model)["dims"]["vocab"]
        path = self.work / "ids" / ("%s-n%d-b%d.txt" % (model, n, batch))
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            rng = random.Random(1000 * n + batch)
            special = {v for v in tok.values() if v is not None and v >= 0}
            lines = []
            for _ in range(batch):
                row = [rng.randrange(999, vocab) for _ in range(n)]
                row = [x if x not in special else 1000 for x in row]
                if tok.get("bos", -1) >= 0 and n >= 2:
                    row[0] = tok["bos"]
                if tok.get("eos", -1) >= 0 and n >= 3:
                    row[-1] = tok["eos"]
                lines.append(" ".join(map(str, row)))
            path.write_text("\n".join(lines) + "\n")
        return path


def read_ids(path):
    import numpy as np
    return np.array([[int(x) for x in line.split()] for line in Path(path).read_text().splitlines() if line.strip()],
                    dtype=np.int32)


# ----------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------

def gbench_results(data):
    """Google Benchmark JSON -> {name: {"median": s, "cv": fraction, "samples": k, ...counters}}."""
    out = {}
    for b in data["benchmarks"]:
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            out[name] = {"error": b.get("error_message", "error")}
            continue
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
        entry = out.setdefault(name, {"times": []})
        if b.get("run_type") == "aggregate":
            continue
        entry["times"].append(b["real_time"] * scale)
        for k, v in b.items():
            if k in ("GFLOPs", "GBs", "peak_frac"):
                entry.setdefault(k, []).append(v)
    for name, e in out.items():
        if "times" in e and e["times"]:
            e["median"] = statistics.median(e["times"])
            e["cv"] = statistics.pstdev(e["times"]) / e["median"] if len(e["times"]) > 1 else 0.0
            e["samples"] = len(e["times"])
            for k in ("GFLOPs", "GBs", "peak_frac"):
                if k in e:
                    e[k] = statistics.median(e[k])
    return out


def run_kernel_bench(quick, out_json, machine_only=False):
    args = [bench_binary("kernel_bench"), "--benchmark_format=json", "--benchmark_out=%s" % out_json,
            "--benchmark_out_format=json"]
    if machine_only:
        args += ["--benchmark_min_time=0.3", "--benchmark_repetitions=3", "--benchmark_filter=machine"]
    elif quick:
        args += ["--benchmark_min_time=0.1", "--benchmark_filter=machine|gemm/generated|attention(_grad)?/.*/n:128/batch:1"]
    else:
        args += ["--benchmark_min_time=0.3", "--benchmark_repetitions=3"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    subprocess.run([str(a) for a in args], check=True, env=env, stdout=subprocess.DEVNULL)
    return gbench_results(json.loads(Path(out_json).read_text()))


def machine_limits(kernels):
    lim = {}
    for t in (1, 2):
        lim[("peak", t)] = kernels["machine/peak/threads:%d/real_time" % t]["GFLOPs"] * 1e9
        lim[("bw", t)] = kernels["machine/read_bw/threads:%d/real_time" % t]["GBs"] * 1e9
    return lim


def combine_limits(start, end):
    """The machine's limits are what it can reach: the larger of the measurements at the start and the end
    of a run (a machine busy with something else at one of them measures low)."""
    return {k: max(start[k], end[k]) for k in start}


def plan_line(ws, p, out):
    """model_bench's plan line for point p, its first call's results going to `out` ('-': nowhere)."""
    return " ".join(map(str, [p.name, ws.library(p.model, p.variant), ws.spec(p.model)["name"], ws.weights(p.model),
                              p.entry, ws.ids(p.model, p.n, p.batch), p.threads, out]))


def has_peers(p):
    return p.variant == "opt" and (p.model, p.entry) in PEER_METHODS


def estimate(ws, p, limits):
    """(a call's estimated seconds at half the measured peak, its FLOPs)."""
    flops = ws.flops(p.model, p.variant, p.entry, p.n) * p.batch
    return flops / (0.5 * limits[("peak", p.threads)]), flops


def output_path(ws, p):
    out = ws.work / "out" / (p.name.replace("/", "_") + ".txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def run_model_bench(ws, points, limits, quick, est_limit):
    """Times every point without peers in one model_bench process (skipping those whose estimated call
    exceeds est_limit seconds); returns {point name: result} with result["output"] = the first call's results."""
    results = {}
    fast, slow = [], []
    for p in points:
        est, flops = estimate(ws, p, limits)
        if est > est_limit:
            results[p.name] = {"skipped": "estimated %.0f s per call (%.1f TFLOP)" % (est, flops / 1e12)}
            continue
        (slow if est > 2.0 else fast).append(p)
    for group, reps in ((fast, 1 if quick else 5), (slow, 1 if quick else 2)):
        if not group:
            continue
        plan = ws.work / "plan.txt"
        plan.write_text("".join(plan_line(ws, p, output_path(ws, p)) + "\n" for p in group))
        log("model_bench: %d entry points, %d repetitions" % (len(group), reps))
        out_json = ws.work / "model_bench.json"
        subprocess.run([bench_binary("model_bench"), "--plan", str(plan), "--benchmark_format=console",
                        "--benchmark_out=%s" % out_json, "--benchmark_out_format=json",
                        "--benchmark_min_time=%s" % ("0.2" if quick else "0.5"),
                        "--benchmark_repetitions=%d" % reps], check=True)
        got = gbench_results(json.loads(out_json.read_text()))
        for p in group:
            r = got.get(p.name + "/real_time", got.get(p.name, {"error": "no result"}))
            r["output"] = output_path(ws, p)
            results[p.name] = r
    return results


def lmcc_round(ws, p, out, seconds):
    """One model_bench process on point p alone: load, a warm-up call (its results to `out`, '-': nowhere),
    then calls for `seconds` (at least one). Returns the mean seconds per call, or {"error": ...}."""
    plan = ws.work / "plan-round.txt"
    plan.write_text(plan_line(ws, p, out) + "\n")
    out_json = ws.work / "model_bench-round.json"
    proc = subprocess.run([bench_binary("model_bench"), "--plan", str(plan), "--benchmark_out=%s" % out_json,
                           "--benchmark_out_format=json", "--benchmark_min_time=%s" % seconds],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:  # the context header goes to stderr on every run: shown only with a failure
        raise RuntimeError("model_bench on %s exited with %d: %s" % (p.name, proc.returncode, proc.stderr[-2000:]))
    r = gbench_results(json.loads(out_json.read_text())).get(p.name + "/real_time", {"error": "no result"})
    return r["median"] if "median" in r else r


def peer_round(peer, ids, seconds):
    """A peer's calls on ids for `seconds` (at least one): the mean seconds per call."""
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < seconds:
        peer(ids)
        calls += 1
    return (time.perf_counter() - start) / calls


def summary(times):
    """A contender's samples: one per round, in round order (speedup() pairs them by round)."""
    med = statistics.median(times)
    return dict(median=med, cv=statistics.pstdev(times) / med if len(times) > 1 else 0.0,
                samples=len(times), times=times, paired=True)


def round_pairs(mine, other):
    """lmcc's and another contender's samples paired by round, or None where they were not timed in the same
    rounds (a peer with only its first call, a run from before the rounds)."""
    a, b = mine.get("times", []), other.get("times", [])
    return list(zip(a, b)) if mine.get("paired") and other.get("paired") and len(a) == len(b) > 1 else None


def speedup(mine, other):
    """How many times faster lmcc's result `mine` is than `other`: the median over rounds of the two samples taken
    in the same round (a slow spell of the machine slows both of a round), or the ratio of the medians where the
    samples do not pair."""
    pairs = round_pairs(mine, other)
    return statistics.median(y / x for x, y in pairs) if pairs else other["median"] / mine["median"]


def fmt_speedup(mine, other):
    """speedup() as the report prints it, with the rounds lmcc won where the samples pair ("0.96x, 3/8": faster in
    3 of 8 rounds; a verdict near 1.00x that is not 0/8 or 8/8 is within this machine's noise)."""
    pairs = round_pairs(mine, other)
    return "%.2fx" % speedup(mine, other) + (", %d/%d" % (sum(x < y for x, y in pairs), len(pairs)) if pairs else "")


def run_rounds(ws, points, lmcc, limits, quick, est_limit, checkpoint=lambda peer: None):
    """The points with peers: lmcc's optimized library, its naive one (when the plan has that point) and each
    peer, timed in alternating rounds on the same ids. A slow spell of the machine (common on shared hosts)
    then falls on every contender of an entry alike, instead of on whichever was timed in that minute.
    Each peer is checked against lmcc's results before it is timed (one that disagrees is reported, not
    timed). Fills lmcc's results of these points and returns the peers'. The peers of one (model, entry,
    threads) are built once and serve every n and batch of it. checkpoint(peers so far) runs after each entry."""
    sys.path.insert(0, str(ROOT / "bench"))
    import peers
    out, groups = {}, {}
    naive = {p.name: p for p in points if p.variant == "naive"}
    for p in points:
        est, flops = estimate(ws, p, limits)
        if est > est_limit:
            lmcc[p.name] = {"skipped": "estimated %.0f s per call (%.1f TFLOP)" % (est, flops / 1e12)}
        elif has_peers(p):
            groups.setdefault((p.model, p.entry, p.threads), []).append(p)
    for (model, entry, threads), group in groups.items():
        spec, weights = peers.load(str(ROOT / MODELS[model][0]), str(ws.weights(model)))
        made = {}
        for method in PEER_METHODS[(model, entry)]:
            for system in ("torch", "onnx"):
                key = "%s/%s" % (system, method)
                workdir = ws.work / "peers" / ("%s-%s-%s" % (system, method, model))
                workdir.mkdir(parents=True, exist_ok=True)
                try:
                    made[key] = peers.make_peer(system, method, spec, weights, threads, str(workdir))
                except Exception as e:  # a peer that cannot be built is reported, the suite goes on
                    for p in group:
                        out["%s/%s" % (key, p.name)] = {"error": "%s: %s" % (type(e).__name__, e)}
                    log("peer %s (%s) failed: %s" % (key, model, e))
        slow = set()  # peers that took over est_limit / 4 per call at a smaller n of this batch
        for p in sorted(group, key=lambda p: (p.batch, p.n)):
            q = naive.get(p.name.replace("/opt/", "/naive/"))
            if q is not None and q.name in lmcc:
                q = None  # skipped above
            time_point(ws, p, q, made, slow, lmcc, out, quick, est_limit)
            checkpoint(out)
            if p.n == max(r.n for r in group if r.batch == p.batch):
                slow.clear()
        del made
    return out


def time_point(ws, p, naive, made, slow, lmcc, out, quick, est_limit):
    """Point p in rounds: round 1 runs lmcc first (its results are what the peers are checked against: each
    peer's first call is its check), later rounds alternate the order. A round gives every contender one
    sample: its mean time per call over ROUND_SECONDS (at least one call). The number of rounds follows
    ROUNDS by round 1's longest call (1 with --quick); a peer call over est_limit / 4 gets no more than its
    checking call."""
    import numpy as np
    result = lmcc_round(ws, p, output_path(ws, p), ROUND_SECONDS)
    if isinstance(result, dict):
        lmcc[p.name] = result
        return
    ref = load_output(output_path(ws, p), p.entry)
    ids = read_ids(ws.ids(p.model, p.n, p.batch))
    samples = {p.name: [result]}
    contenders = {p.name: lambda: lmcc_round(ws, p, "-", ROUND_SECONDS)}
    if naive is not None:
        samples[naive.name] = []
        contenders[naive.name] = lambda: lmcc_round(ws, naive, "-", ROUND_SECONDS)
    checked = {}
    longest = result
    for key, peer in made.items():
        name = "%s/%s" % (key, p.name)
        if key in slow:
            out[name] = {"skipped": "a smaller n took over %.0f s per call" % (est_limit / 4)}
            continue
        try:
            t0 = time.perf_counter()
            got = np.asarray(peer(ids), dtype=np.float64)
            first = time.perf_counter() - t0
        except Exception as e:
            out[name] = {"error": "%s: %s" % (type(e).__name__, e)}
            continue
        diff = float(np.max(np.abs(got.reshape(ref.shape) - ref)))
        tol = 2e-3 + 1e-5 * float(np.max(np.abs(ref)))
        if not np.isfinite(diff) or diff > tol:
            out[name] = {"error": "results differ from lmcc by %.3g (tolerance %.3g): not timed" % (diff, tol),
                         "max_diff": diff}
            continue
        checked[name] = diff
        longest = max(longest, first)
        if first > est_limit / 4:  # calls grow at least linearly in n: larger ones would exceed the limit
            slow.add(key)
            samples[name] = [first]
            continue
        # A long first call counts as round 1's sample (a warm-up is noise next to it); short ones get a round.
        samples[name] = [first] if first > 2.0 else [peer_round(peer, ids, ROUND_SECONDS)]
        contenders[name] = (lambda peer=peer: peer_round(peer, ids, ROUND_SECONDS))
    if naive is not None:  # round 1's naive sample, writing its results
        t = lmcc_round(ws, naive, output_path(ws, naive), ROUND_SECONDS)
        if isinstance(t, dict):
            lmcc[naive.name] = t
            del samples[naive.name], contenders[naive.name]
        else:
            samples[naive.name].append(t)
            longest = max(longest, t)
    rounds = 1 if quick else next(k for limit, k in ROUNDS if limit is None or longest <= limit)
    order = list(contenders)
    for r in range(1, rounds):
        for name in (reversed(order) if r % 2 else order):
            t = contenders[name]()
            if isinstance(t, dict):  # it ran in round 1: a failure now is not the benchmark's to hide
                raise RuntimeError("%s failed in round %d: %s" % (name, r + 1, t["error"]))
            samples[name].append(t)
    for name, times in samples.items():
        r = summary(times)
        if name == p.name or (naive is not None and name == naive.name):
            r["output"] = output_path(ws, p if name == p.name else naive)
            lmcc[name] = r
        else:
            r["max_diff"] = checked[name]
            out[name] = r
            log("peer %s: %.2f ms (diff %.2g)" % (name, r["median"] * 1e3, r["max_diff"]))
    log("%s: %.2f ms" % (p.name, lmcc[p.name]["median"] * 1e3))


def scaling_covered(p):
    """Whether issue 20's scaling line covers point p: an optimized 2-thread entry with batch >= 8 or n >= 40."""
    return p.variant == "opt" and p.threads == 2 and (p.batch >= 8 or p.n >= 40)


def thread_scaling(ws, points, lmcc):
    """The 2-thread speedup of every entry scaling_covered() names, measured side by side: its library at 1 and 2
    threads in one model_bench --ab process, calls alternating (a slow spell of the host slows both sides), where
    the grid timed the two entries minutes apart in separate processes. {point name: {"scaling", "won",
    "rounds", "one_ms", "two_ms", "identical"}} (identical: the two thread counts gave the same bits), or
    {"skipped": why} for 1-thread calls over SCALING_ROUNDS' last limit."""
    out = {}
    names = {p.name for p in points}
    for p in points:
        one = Point(p.model, p.variant, p.entry, p.n, p.batch, 1)
        if not scaling_covered(p) or one.name not in names or "median" not in lmcc.get(one.name, {}):
            continue
        seconds = lmcc[one.name]["median"]
        rounds = next((k for limit, k in SCALING_ROUNDS if seconds <= limit), None)
        if rounds is None:
            out[p.name] = {"skipped": "1-thread call %.1f s" % seconds}
            continue
        log("thread scaling side by side: %s (%d rounds)" % (p.name, rounds))
        lib = ws.library(p.model, p.variant)
        text = run([bench_binary("model_bench"), "--ab", lib, lib, ws.spec(p.model)["name"], ws.weights(p.model),
                    p.entry, ws.ids(p.model, p.n, p.batch), 1, 2, rounds])
        out[p.name] = parse_ab(text, p.name)
    return out


def parse_ab(text, what):
    """model_bench --ab's result line as thread_scaling's record (A the 1-thread side, B the 2-thread one)."""
    m = re.search(r"^(bit-identical|max \|A - B\| \S+)\s+speedup ([\d.]+)x\s+B won (\d+)/(\d+)\s+"
                  r"A median ([\d.]+) ms\s+B median ([\d.]+) ms", text, re.M)
    if not m:
        raise RuntimeError("model_bench --ab gave no result line for %s: %s" % (what, text[-300:]))
    rounds = [{"ratio": float(r.group(1)), "trips": [float(r.group(2)), float(r.group(3))]}
              for r in re.finditer(r"^round \d+: .*speedup ([\d.]+)x\s+cpu round trip (-?[\d.]+) / (-?[\d.]+) ns",
                                   text, re.M)]
    return {"scaling": float(m.group(2)), "won": int(m.group(3)), "rounds": int(m.group(4)),
            "one_ms": float(m.group(5)), "two_ms": float(m.group(6)), "identical": m.group(1) == "bit-identical",
            "per_round": rounds}


def nearest_trip(scaling):
    """The fastest CPU round trip any side-by-side round of the run measured (model_bench --ab, CoreLatency.h),
    or None: the two CPUs sharing a last-level cache, as near as this run saw them."""
    trips = [t for s in (scaling or {}).values() for r in s.get("per_round", []) for t in r["trips"] if t > 0]
    return min(trips) if trips else None


def placement(s, nearest):
    """Where a side-by-side measurement's rounds ran: {"far": rounds whose round trip before or after exceeded
    twice the run's nearest, "rounds", "trip": the median round trip in ns, "near_scaling": the median speedup of
    the other rounds (None if none)}, or None without round trips (an older model_bench, or one CPU)."""
    rounds = [r for r in (s or {}).get("per_round", []) if min(r["trips"]) > 0]
    if not rounds or nearest is None:
        return None
    near = [r["ratio"] for r in rounds if max(r["trips"]) <= 2 * nearest]
    trip = statistics.median(max(r["trips"]) for r in rounds)
    return {"far": len(rounds) - len(near), "rounds": len(rounds), "trip": trip,
            "near_scaling": statistics.median(near) if near else None}


def placement_text(pl):
    """A placement as the reports write it."""
    if pl is None:
        return "-"
    text = "%.0f ns; far in %d/%d" % (pl["trip"], pl["far"], pl["rounds"])
    if pl["far"] and pl["near_scaling"] is not None:
        text += "; near rounds %.2fx" % pl["near_scaling"]
    return text


def load_output(path, entry):
    import numpy as np
    rows = [[float(x) for x in line.split()] for line in Path(path).read_text().splitlines() if line.strip()]
    a = np.array(rows, dtype=np.float64)
    return a[:, 0] if entry == "score" else a



# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------

def fmt_ms(r):
    if r is None:
        return "-"
    if "skipped" in r:
        return "skipped"
    if "median" not in r:
        return "error"
    return "%.2f" % (r["median"] * 1e3) + (" ±%.0f%%" % (100 * r["cv"]) if r.get("samples", 1) > 1 else " (1)")


def limits_text(limits):
    return ("FP32 FMA peak %.1f GFLOP/s (1 thread), %.1f GFLOP/s (2 threads); read bandwidth %.1f GB/s (1 thread), "
            "%.1f GB/s (2 threads)" % (limits[("peak", 1)] / 1e9, limits[("peak", 2)] / 1e9, limits[("bw", 1)] / 1e9,
                                        limits[("bw", 2)] / 1e9))


def machine_text(limits, start=None, end=None, end_note="at its end"):
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = "%s, %d cores visible, Linux %s. " % (cpu, os.cpu_count(), platform.release())
    if start is None or end is None:
        return text + "Measured in this run: %s." % limits_text(limits)
    text += ("Measured at the start of this run: %s; %s: %s. Bounds use the larger of the two: %s."
             % (limits_text(start), end_note, limits_text(end), limits_text(limits)))
    low = max(1 - start[k] / limits[k] for k in limits)
    if low > 0.1:
        text += (" One measurement came out %.0f%% below the other: the machine was busy with something else for part "
                 "of the run, which slows any timing taken then." % (100 * low))
    return text


def l3_cache_bytes():
    """The L3 cache size of cpu0 (the instance its core shares, from sysfs; getconf's LEVEL3_CACHE_SIZE where sysfs
    has none: on an EPYC VM it gave the whole package's 384 MiB against sysfs's 32 MiB per instance), None if
    neither says."""
    try:
        m = re.fullmatch(r"(\d+)([KMG]?)", Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip())
        if m:
            return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
    except OSError:
        pass
    try:
        return int(subprocess.run(["getconf", "LEVEL3_CACHE_SIZE"], capture_output=True, text=True).stdout) or None
    except (OSError, ValueError):
        return None


def below_bound_note(ws, limits, points, lmcc, l3):
    """The sentence under the entry table where some entry ran faster than its roofline bound (x bound < 1): the
    bound reads every weight byte from DRAM once per call, while part of a call's weights can stay in the L3 from
    one call to the next. [] when none did."""
    below = []
    for p in points:
        r = lmcc.get(p.name, {})
        if p.variant != "opt" or "median" not in r:
            continue
        xb = r["median"] / roofline(ws, limits, p)[0]
        if xb < 1:
            below.append("%s %s n %d batch %d threads %d (%.2f, %.1f MB of weights)" % (
                p.model, p.entry, p.n, p.batch, p.threads, xb, weight_bytes(ws, p.model, p.entry) / 1e6))
    if not below:
        return []
    size = "of unknown size" if not l3 else "%d %s (cpu0's)" % ((l3 >> 20, "MiB") if l3 % (1 << 20) == 0 else
                                                               (l3 >> 10, "KiB"))
    return ["x bound below 1 on %s: the bound counts every weight byte as read from memory once per call, but the "
            "L3 cache here is %s, so part of those weights stays in it from one call to the next and is read at cache "
            "speed." % ("; ".join(below), size), ""]


def weight_bytes(ws, model, entry):
    """Bytes of the weights one call reads at least once: every tensor for score (the tied or untied
    vocabulary head reads the whole token table), all but the token table and the head for embed
    (which gathers only its n rows of the table)."""
    import struct
    with open(ws.weights(model), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    total = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if entry == "embed" and (name == "embed.token" or name.startswith("head.")):
            continue
        total += t["data_offsets"][1] - t["data_offsets"][0]
    return total


def roofline(ws, limits, p):
    """(the roofline bound of point p's call in seconds, its FLOPs): max(FLOPs / peak, weight bytes / bandwidth)."""
    flops = ws.flops(p.model, p.variant, p.entry, p.n) * p.batch
    return max(flops / limits[("peak", p.threads)], weight_bytes(ws, p.model, p.entry) / limits[("bw", p.threads)]), flops


def kernel_of_bound(limits, flops, nbytes, seconds):
    """A kernel_bench kernel's roofline bound on one thread, max(FLOPs / peak, bytes / read bandwidth), over its
    measured seconds per call: 1.0 at the bound, below it the share of the bound's speed the kernel reaches."""
    return max(flops / limits[("peak", 1)], nbytes / limits[("bw", 1)]) / seconds


def best_peer(p, peer):
    """(every peer result of point p by peer name, the fastest timed one as (name, result) or None)."""
    peer_rs = {k.split("/" + p.name)[0]: v for k, v in peer.items() if k.endswith("/" + p.name)}
    timed = {k: v for k, v in peer_rs.items() if "median" in v}
    return peer_rs, (min(timed.items(), key=lambda kv: kv[1]["median"]) if timed else None)


def medians_ratio(p, lmcc):
    """2-thread point p's 1-thread twin's median / its own (timed minutes apart), or None (a twin not timed)."""
    one = lmcc.get(Point(p.model, p.variant, p.entry, p.n, p.batch, 1).name, {})
    if p.threads == 2 and "median" in one and "median" in lmcc.get(p.name, {}):
        return one["median"] / lmcc[p.name]["median"]
    return None


def two_thread_ratio(p, lmcc, scaling):
    """(point p's 2-thread speedup over its 1-thread twin, how it was measured): side by side (thread_scaling)
    where it was, else the ratio of the grid's two medians; (None, None) for a 1-thread entry or a missing twin."""
    s = (scaling or {}).get(p.name, {})
    if "scaling" in s:
        return s["scaling"], "side by side"
    ratio = medians_ratio(p, lmcc)
    return ratio, "medians" if ratio is not None else None


def find_gaps(ws, limits, points, lmcc, peer, scaling=None):
    """Every entry where lmcc is not ahead of the best peer, or (batch >= 8) more than 1.3x its roofline bound,
    or whose two-thread time misses 1.15x half its one-thread time (batch >= 8 or n >= 40): one dict per entry
    with the numbers that locate the cause (the distance to the bound and, for 2-thread entries, the speedup over
    the same entry at 1 thread, 2.00x ideal: side by side where thread_scaling measured it)."""
    gaps = []
    nearest = nearest_trip(scaling)
    for p in points:
        r = lmcc.get(p.name)
        if p.variant != "opt" or r is None or "median" not in r:
            continue
        b, flops = roofline(ws, limits, p)
        xb = r["median"] / b
        _, best = best_peer(p, peer)
        sp = speedup(r, best[1]) if best else None
        behind = sp is not None and sp < 1.0
        far = p.batch >= 8 and xb > 1.3
        ratio, how = two_thread_ratio(p, lmcc, scaling)
        # Issue 20: two threads within 1.15x of half the one-thread time (batch >= 8, or n >= 40 at batch 1).
        unscaled = ratio is not None and scaling_covered(p) and ratio < 2 / 1.15
        if behind or far or unscaled:
            gaps.append({"point": p, "peer": best[0] if best else "-", "speedup": sp, "xb": xb, "ratio": ratio,
                         "ratio_how": how, "speedup_text": fmt_speedup(r, best[1]) if best else "-",
                         "unscaled_only": unscaled and not (behind or far), "flops": flops,
                         "seconds": r["median"], "peak": limits[("peak", p.threads)],
                         "placement": placement((scaling or {}).get(p.name), nearest) if unscaled else None})
    return gaps


def kernel_category(dso, sym):
    """What a profiled symbol of a generated library's call is: (category, GEMM shape N x K or None)."""
    if sym.startswith("lm_train_gemm_"):  # the trainer's GEMM: its shapes come at run time
        return "GEMM", "runtime shape"
    m = re.match(r"lm_gemm(?:_task)?_(\d+)x(\d+)", sym)
    if m:
        return "GEMM", "%sx%s" % (m.group(1), m.group(2))
    for prefix, what in (("lm_attention", "attention"), ("lm_logprob", "log-softmax"),
                         ("lm_rows_", "norms/activations")):
        if sym.startswith(prefix):
            return what, None
    if dso == "[kernel.kallsyms]":
        return "kernel (page faults, scheduling)", None
    if dso.startswith("lib") and dso.endswith(".so") and sym.endswith("_kernel"):
        return "entry body (embeddings, copies, small ops)", None
    if dso.startswith("liblmrt") or "tbb" in dso:
        return "runtime (threads, buffers)", None
    if dso.startswith(("libc.", "libm.", "libstdc++")):
        return "libc/libm", None
    return "other", None


def profile_gaps(ws, gaps, seconds=2.0):
    """`perf record` (cpu-clock) of each gap entry's timed calls (model_bench --perf-ctl enables it after the
    weights are loaded): {point name: {"categories": [[category, share], ...], "gemms": [[N x K, share], ...],
    "samples": n}} or {point name: {"error": why}}. Shares are of all samples of the timed calls (both threads'
    for a 2-thread entry)."""
    import shutil
    import tempfile
    out = {}
    if not shutil.which("perf"):
        return {g["point"].name: {"error": "perf is not installed"} for g in gaps}
    for g in gaps:
        p = g["point"]
        with tempfile.TemporaryDirectory(prefix="lmcc-bench-perf-") as tmp:
            tmp = Path(tmp)
            (tmp / "plan.txt").write_text(plan_line(ws, p, "-") + "\n")
            os.mkfifo(tmp / "ctl")
            log("profiling %s" % p.name)
            rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "-D", "-1",
                                  "--control", "fifo:%s" % (tmp / "ctl"), "-o", str(tmp / "perf.data"), "--",
                                  bench_binary("model_bench"), "--plan", str(tmp / "plan.txt"),
                                  "--perf-ctl", str(tmp / "ctl"), "--benchmark_min_time=%s" % seconds],
                                 text=True, capture_output=True)
            if rec.returncode != 0:
                out[p.name] = {"error": "perf record failed: %s" % (rec.stderr.strip().splitlines() or ["?"])[-1]}
                continue
            rep = subprocess.run(["perf", "report", "-i", str(tmp / "perf.data"), "--no-children", "--sort",
                                  "dso,sym", "--stdio", "--percent-limit", "0"], text=True, capture_output=True)
        cats, gemms, samples = {}, {}, 0
        for line in rep.stdout.splitlines():
            m = re.match(r"#\s*Samples:\s*([\d.]+)([KM]?)", line)  # e.g. "# Samples: 5K of event 'cpu-clock'"
            if m:
                samples = int(float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6}[m.group(2)])
            m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(\S+)", line)
            if not m:
                continue
            share, dso, sym = float(m.group(1)) / 100, m.group(2), m.group(3)
            cat, shape = kernel_category(dso, sym)
            cats[cat] = cats.get(cat, 0) + share
            if shape:
                gemms[shape] = gemms.get(shape, 0) + share
        if not cats:
            out[p.name] = {"error": "perf report gave no samples: %s" % rep.stderr.strip()[-200:]}
            continue
        out[p.name] = {"categories": sorted(([k, v] for k, v in cats.items()), key=lambda kv: -kv[1]),
                       "gemms": sorted(([k, v] for k, v in gemms.items()), key=lambda kv: -kv[1]), "samples": samples}
    return out


def measured_cause(g, profile):
    """The cause column of a gap: the thread scaling or the distance to the bound, and where the call's time went
    (its profile): the categories over 1% of the samples, the largest GEMMs, and the rate of the kernels that do
    the counted FLOPs (GEMM and attention), i.e. FLOPs / (time x their share)."""
    parts = []
    if g["unscaled_only"]:
        parts.append("thread scaling only (%.2fx, under the 1.74x line; ahead of the peers)" % g["ratio"])
    elif g["ratio"] is not None and g["ratio"] < 1.6:
        parts.append("thread scaling (%.2fx of the ideal 2x)" % g["ratio"])
    elif g["xb"] <= 1.15:
        parts.append("at the roofline bound: the peer is as close to it")
    else:
        parts.append("%.2fx the bound" % g["xb"])
    pl = g.get("placement")
    if pl and pl["far"]:
        parts.append("the two CPUs did not share a last-level cache in %d of %d rounds (round trip %.0f ns)%s" % (
            pl["far"], pl["rounds"], pl["trip"], "; the other rounds %.2fx" % pl["near_scaling"]
            if pl["near_scaling"] is not None else ""))
    if profile is None:
        parts.append("not profiled")
    elif "error" in profile:
        parts.append("not profiled (%s)" % profile["error"])
    else:
        shares = dict(profile["categories"])
        cats = []
        for cat, share in profile["categories"]:
            if share < 0.01:
                continue
            text = "%s %.0f%%" % (cat, 100 * share)
            if cat == "GEMM" and profile["gemms"]:
                text += " (%s)" % ", ".join("%s %.0f%%" % (k, 100 * v) for k, v in profile["gemms"][:3])
            cats.append(text)
        parts.append("profile: " + ", ".join(cats))
        products = shares.get("GEMM", 0) + shares.get("attention", 0)
        if products > 0:
            rate = g["flops"] / (g["seconds"] * products)
            parts.append("GEMM + attention at %.0f GFLOP/s (%.0f%% of peak)" % (rate / 1e9, 100 * rate / g["peak"]))
    return "; ".join(parts)


def gaps_section(gaps, profiles):
    rows = []
    for g in gaps:
        p = g["point"]
        rows.append("| %s | %s | %d | %d | %d | %s | %s | %.2f | %s | %s |" % (
            p.model, p.entry, p.n, p.batch, p.threads, g["peer"], g["speedup_text"],
            g["xb"], "%.2fx (%s)" % (g["ratio"], g["ratio_how"]) if g["ratio"] is not None else "-",
            measured_cause(g, profiles.get(p.name))))
    md = ["## Gaps", "",
          "Entries where lmcc is not ahead of the best peer, or (batch >= 8) above 1.3x its roofline bound, or "
          "(two threads, batch >= 8 or n >= 40) slower than 1.15x half the one-thread time. "
          "`2-thread scaling` = the same entry's 1-thread time / its 2-thread time (2.00x ideal; 1.74x the line), "
          "measured side by side (one process, calls alternating: the Two threads section) or, for calls too long "
          "for that, the ratio of the grid's medians. "
          "`measured cause`: the distance to the bound or the thread scaling, then where the call's time went: "
          "`perf record -e cpu-clock` of the entry's timed calls alone (model_bench --perf-ctl, after the weights "
          "are loaded), the share of the samples per kind of kernel and for the three largest GEMMs (N x K), and "
          "the rate of the kernels that do the counted FLOPs: FLOPs / (median time x the GEMM and attention share).",
          ""]
    if not rows:
        return md + ["None in this run.", ""]
    return md + ["| model | entry | n | batch | threads | best peer | lmcc speedup | x bound | 2-thread scaling | "
                 "measured cause |", "|" + "---|" * 10] + rows + [""]


def scaling_section(points, lmcc, scaling):
    """Every entry of the scaling line (scaling_covered) with its 2-thread speedup side by side and the ratio of
    the grid's medians (timed minutes apart, in separate processes)."""
    rows = []
    nearest = nearest_trip(scaling)
    for p in points:
        if not scaling_covered(p):
            continue
        s = (scaling or {}).get(p.name)
        m = medians_ratio(p, lmcc)
        medians = "%.2fx" % m if m is not None else "-"
        if s is None:
            side = "-"
        elif "skipped" in s:
            side = "not measured (%s)" % s["skipped"]
        else:
            side = "%.2fx (%d/%d%s)" % (s["scaling"], s["won"], s["rounds"], "" if s["identical"] else
                                        ", results differ")
        times = "%.2f / %.2f" % (s["one_ms"], s["two_ms"]) if s and "scaling" in s else "-"
        ratio, _ = two_thread_ratio(p, lmcc, scaling)
        verdict = "-" if ratio is None else "yes" if ratio >= 2 / 1.15 else "**no**"
        where = placement_text(placement(s, nearest))
        rows.append("| %s | %s | %d | %d | %s | %s | %s | %s | %s |" % (p.model, p.entry, p.n, p.batch, times, side,
                                                                         where, medians, verdict))
    if not rows:
        return []
    return ["## Two threads", "",
            "Issue 20: two threads within 1.15x of half the one-thread time (a speedup of at least 1.74x) on every "
            "entry with batch >= 8 and on batch-1 entries with n >= 40. `side by side`: the entry's library at 1 and "
            "2 threads in one `model_bench --ab` process, calls alternating (median of the per-round ratios, the "
            "rounds the 2-thread side won; its medians in ms); `grid medians`: the 1-thread entry's median / the "
            "2-thread one's, timed minutes apart in separate processes (a slow spell of the host moves one and not "
            "the other). The verdict uses the side-by-side ratio where there is one. `CPU placement`: the round trip "
            "of a cache line between the process's two CPUs, measured before and after every side-by-side round "
            "(bench/CoreLatency.h; the median of the rounds' slower reading), and the rounds in which it was over "
            "twice the fastest this run measured (%s): the two CPUs did not share a last-level cache then (a "
            "virtual machine's vCPUs can move between L3 domains within seconds, and a 2-thread call slows where its "
            "threads' data crosses: bench/results/2026-12-07-placement.md), with the median speedup of the other "
            "rounds." % ("%.0f ns" % nearest if nearest else "none measured"), "",
            "| model | entry | n | batch | 1 / 2 threads ms | side by side | CPU placement | grid medians | "
            "within the line |",
            "|" + "---|" * 9] + rows + [""]


def flags_of(quick, only):
    """The command-line flags a report was made with (its title and the command it names)."""
    return (" --quick" if quick else "") + (" --only '%s'" % only if only else "")


def command_line(flags, no_peers=False, max_call=None):
    """What produced the report: scripts/bench.sh (which sets LMCC_BENCH_SCRIPT, adds the training grid and says
    in LMCC_BENCH_NO_TRAIN=1 that --no-train dropped it) with the flags that change what is measured, or
    bench/run.py run directly, with its arguments."""
    if os.environ.get("LMCC_BENCH_SCRIPT"):
        return ("scripts/bench.sh" + flags + (" --no-peers" if no_peers else "") +
                (" --max-call %g" % max_call if max_call is not None else "") +
                (" --no-train" if os.environ.get("LMCC_BENCH_NO_TRAIN") == "1" else ""))
    return " ".join(["bench/run.py"] + sys.argv[1:])


def free_stem(out_dir, stem):
    """`stem`, or the first of stem-b, stem-c, ... whose report is not in out_dir yet: a second run on one day
    keeps the first's report and plots (they were overwritten once, 2026-11-28)."""
    for suffix in [""] + ["-" + c for c in "bcdefghijklmnopqrstuvwxyz"]:
        if not (out_dir / (stem + suffix + ".md")).exists():
            return stem + suffix
    raise SystemExit("bench: %s has reports %s through %s-z already" % (out_dir, stem, stem))


def report_stem(out_dir, date, suffixes):
    """The report's file stem (its plots share it): `date` when out_dir has no <date>.md yet, whatever the kind of
    run (issue 7: the command writes bench/results/<date>.md; the title says the mode); else date + the mode's
    suffixes (-quick, -only, -partial) through free_stem, so that a second run on one day keeps the first's files."""
    if not (out_dir / (date + ".md")).exists():
        return date
    return free_stem(out_dir, date + suffixes)


def timing_text(rounds):
    """How the run timed its entries: rounds = {"rounds": ROUNDS, "seconds": ROUND_SECONDS} as it ran, None for a run
    from before the rounds (one model_bench process for lmcc's entries, the peers minutes later)."""
    if not rounds:
        return ""
    table = ", ".join(("%d for calls up to %.1f s" % (k, limit)) if limit is not None else "%d above" % k
                      for limit, k in rounds["rounds"])
    return ("An entry with peers is timed in alternating rounds (%s; 1 with --quick): lmcc's library in a model_bench "
            "process of its own, the naive library of the same entry likewise, and every peer, each for %.2f s (at "
            "least one call) per round, lmcc first in round 1 and the order reversed in every other round; a sample "
            "is one round's mean time per call. `lmcc speedup` is the median over rounds of the best peer's sample / "
            "lmcc's sample of the same round, then the rounds in which lmcc was faster (`0.96x, 3/8`; the ratio of "
            "the medians alone where a peer has only its first call). Other "
            "entries (dropped passes) are timed in one model_bench process. " % (table, rounds["seconds"]))


def write_report(ws, date, quick, limits, kernels, points, lmcc, peer, out_dir, versions, wall, machine, only=None,
                 command=None, profiles=None, rounds=None, partial=False, scaling=None, l3=None):
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = report_stem(out_dir, date, ("-quick" if quick else "") + ("-only" if only else "") +
                       ("-partial" if partial else ""))
    flags = flags_of(quick, only)
    mode = [flags.strip() or "full grid"] + (["partial run"] if partial else [])  # the file name may not say it
    md = ["# lmcc benchmarks, %s (%s)" % (date, ", ".join(mode)), "",
          "Command: `%s` (%.0f s wall). %s" % (command or command_line(flags), wall, versions), "",
          "Machine: " + machine, "",
          "Times are medians in milliseconds per call (± the spread: population standard deviation over the samples "
          "as a percentage of the median; `(1)` = one sample). " + timing_text(rounds) + "`bound` is the roofline "
          "bound of that call: max(FLOPs / peak, weight bytes / read bandwidth) with the call's own pipeline FLOPs "
          "(`lmcc compile --stats`) and this run's peak and bandwidth for the same thread count. `x bound` = time / "
          "bound. Peers were checked against lmcc's results on the same ids before being timed (max abs difference "
          "in the last column).", ""]
    if partial:
        done = sum(1 for p in points if p.name in lmcc)
        md += ["**A partial run**: written with `--report-from` from the results the run had saved when it stopped: "
               "%d of the grid's %d entries; the others are missing from the tables, and no gap was profiled."
               % (done, len(points)), ""]

    # Entry points vs peers
    md += ["## Entry points: lmcc (optimized) vs PyTorch and ONNX Runtime", "",
           "| model | entry | n | batch | threads | lmcc ms | bound ms | x bound | GFLOP/s | best peer | peer ms | "
           "lmcc speedup | peers (ms) | max diff |", "|" + "---|" * 14]
    for p in points:
        if p.variant != "opt":
            continue
        r = lmcc.get(p.name)
        if r is None:
            continue
        b, flops = roofline(ws, limits, p)
        peer_rs, best = best_peer(p, peer)
        cells = ", ".join("%s %s" % (k, fmt_ms(v) if "median" in v else ("skipped" if "skipped" in v else "failed"))
                          for k, v in sorted(peer_rs.items()))
        diffs = [v["max_diff"] for v in peer_rs.values() if "max_diff" in v]
        if "median" in r:
            md.append("| %s | %s | %d | %d | %d | %s | %.2f | %.2f | %.1f | %s | %s | %s | %s | %s |" % (
                p.model, p.entry, p.n, p.batch, p.threads, fmt_ms(r), b * 1e3, r["median"] / b, flops / r["median"] / 1e9,
                best[0] if best else "-", fmt_ms(best[1]) if best else "-", fmt_speedup(r, best[1]) if best else "-",
                cells or "-", "%.1e" % max(diffs) if diffs else "-"))
        else:
            md.append("| %s | %s | %d | %d | %d | %s | %.2f | - | - | - | - | - | %s | - |" % (
                p.model, p.entry, p.n, p.batch, p.threads, r.get("skipped", r.get("error", "?")), b * 1e3, cells or "-"))
    md.append("")
    md += below_bound_note(ws, limits, points, lmcc, l3)
    md += gaps_section(find_gaps(ws, limits, points, lmcc, peer, scaling), profiles or {})
    md += scaling_section(points, lmcc, scaling)
    failed = {k: v for k, v in peer.items() if "error" in v}
    if failed:
        md += ["Peers that did not run or disagreed:", ""] + ["- `%s`: %s" % (k, v["error"]) for k, v in
                                                             sorted(failed.items())] + [""]

    # Fused vs naive
    md += ["## Fused vs naive (same kernels: generated GEMM in both)", "",
           "| model | entry | n | batch | threads | optimized ms | naive ms | speedup | FLOP ratio |", "|" + "---|" * 9]
    for p in points:
        if p.variant != "naive":
            continue
        o = lmcc.get(p.name.replace("/naive/", "/opt/"), {})
        nv = lmcc.get(p.name, {})
        fo, fn = ws.flops(p.model, "opt", p.entry, p.n), ws.flops(p.model, "naive", p.entry, p.n)
        sp = "%.2fx" % (nv["median"] / o["median"]) if "median" in o and "median" in nv else "-"
        md.append("| %s | %s | %d | %d | %d | %s | %s | %s | %.2fx |" % (p.model, p.entry, p.n, p.batch, p.threads,
                                                                        fmt_ms(o), fmt_ms(nv), sp, fn / fo))
    md.append("")
    ablation = [p for p in points if p.variant.startswith("no-")]
    if ablation:
        base = lmcc.get(Point("bilm", "opt", "score", 20, 1, 1).name, {})
        md += ["## Each pass dropped (biLM PLL, n = 20, batch 1, 1 thread)", "",
               "| pipeline | ms | vs optimized | GFLOP |", "|---|---|---|---|",
               "| optimized | %s | 1.00x | %.2f |" % (fmt_ms(base), ws.flops("bilm", "opt", "score", 20) / 1e9)]
        for p in ablation:
            r = lmcc.get(p.name, {})
            rel = "%.2fx" % (r["median"] / base["median"]) if "median" in r and "median" in base else "-"
            md.append("| --%s | %s | %s | %.2f |" % (p.variant, fmt_ms(r), rel, ws.flops("bilm", p.variant, "score", 20) / 1e9))
        md.append("")

    # T-TA vs biLM
    md += ["## T-TA vs biLM PLL (same size; the paper reports 6.35x for reranking and 12.7x for STS)", "",
           "| n | batch | threads | T-TA score ms | biLM PLL ms (optimized) | speedup | biLM --naive ms | speedup vs naive |",
           "|---|---|---|---|---|---|---|---|"]
    for p in points:
        if p.model == "tta" and p.variant == "opt" and p.entry == "score":
            # None (printed "-") where the run did not include the entry (--only), unlike a failed one
            bl = lmcc.get(Point("bilm", "opt", "score", p.n, p.batch, p.threads).name)
            bn = lmcc.get(Point("bilm", "naive", "score", p.n, p.batch, p.threads).name)
            t = lmcc.get(p.name)
            if t is None:
                continue
            s1 = "%.1fx" % (bl["median"] / t["median"]) if bl and "median" in bl and "median" in t else "-"
            s2 = "%.1fx" % (bn["median"] / t["median"]) if bn and "median" in bn and "median" in t else "-"
            md.append("| %d | %d | %d | %s | %s | %s | %s | %s |" % (p.n, p.batch, p.threads, fmt_ms(t), fmt_ms(bl), s1,
                                                                   fmt_ms(bn), s2))
    md.append("")

    # Kernels
    peak1 = limits[("peak", 1)] / 1e9
    md += ["## GEMM kernels (1 thread, GFLOP/s and fraction of the measured peak)", "",
           "`of bound`: the kernel's roofline bound / its median time (1.00 = at the bound), the bound max(2 M K N / "
           "peak, 4 (M K + K N + M N) bytes / read bandwidth) with this run's 1-thread peak and bandwidth.", "",
           "| M x K x N | generated | of peak | of bound | Eigen | of peak | of bound | OpenBLAS | of peak | of bound |",
           "|" + "---|" * 10]
    shapes = sorted({k.split("/")[2] for k in kernels if k.startswith("gemm/generated/")},
                    key=lambda s: [int(x) for x in s.split("x")])
    for s in shapes:
        row = [s]
        m, k, n = (int(x) for x in s.split("x"))
        for lib in ("generated", "eigen", "openblas"):
            r = kernels.get("gemm/%s/%s" % (lib, s))
            row += ["%.1f" % r["GFLOPs"], "%.0f%%" % (100 * r["GFLOPs"] / peak1),
                    "%.2f" % kernel_of_bound(limits, 2.0 * m * k * n, 4 * (m * k + k * n + m * n), r["median"])] \
                if r and "GFLOPs" in r and "median" in r else ["-", "-", "-"]
        md.append("| " + " | ".join(row) + " |")
    md += ["", "## Attention kernels (8 heads, d 512, 1 thread)", "",
           "`forward`: lm.attention, generated; `backward`: lm.attention_grad, generated (its vector form, what "
           "compiled training runs here); `backward (C++)`: the runtime's lm_rt_attention_grad (head sizes off "
           "multiples of 16). `+ relative`: with Shaw relative positions clipped at 16. Mask `directional`: the "
           "Diformer's per-row directions and hidden keys as its `directional` objective draws them. FLOPs: 4 d "
           "(forward) and 10 d (backward) per visible query-key pair, the relative terms' work not counted. "
           "`of bound`: the kernel's roofline bound / its median time (1.00 = at the bound), the bound max(FLOPs / "
           "peak, bytes / read bandwidth) with this run's 1-thread peak and bandwidth and the [batch, n, 512] fp32 "
           "buffers each call reads or writes once: 4 forward (q, k, v read, out written), 7 backward (q, k, v, dO "
           "read, dq, dk, dv written; the relative tables and mask rows not counted).", "",
           "| kernel | mask | n | batch | ms | GFLOP/s | of peak | of bound |", "|" + "---|" * 8]
    kinds = {"attention": "forward", "attention_grad": "backward", "attention_grad_rt": "backward (C++)",
             "attention_rel": "forward + relative", "attention_grad_rel": "backward + relative",
             "attention_grad_rt_rel": "backward (C++) + relative"}
    for k, r in kernels.items():
        parts = k.split("/")
        if parts[0] in kinds and len(parts) == 4 and "GFLOPs" in r:
            n, batch = int(parts[2][2:]), int(parts[3][6:])
            buffers = 7 if parts[0].startswith("attention_grad") else 4
            of_bound = kernel_of_bound(limits, r["GFLOPs"] * 1e9 * r["median"],
                                       4 * buffers * batch * n * KERNEL_BENCH_D, r["median"])
            md.append("| %s | %s | %d | %d | %.3f | %.1f | %.0f%% | %.2f |" % (
                kinds[parts[0]], parts[1], n, batch, r["median"] * 1e3, r["GFLOPs"], 100 * r["GFLOPs"] / peak1,
                of_bound))
    md.append("")
    plots = make_plots(ws, points, lmcc, peer, limits, out_dir, stem)
    md += ["## Plots", ""] + ["![%s](%s)" % (p.stem, p.name) for p in plots] + [""]
    path = out_dir / (stem + ".md")
    path.write_text("\n".join(md))
    return path


def make_plots(ws, points, lmcc, peer, limits, out_dir, stem):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    # 1. time vs n per system (batch 1, 1 thread), one panel per entry point.
    panels = [("tta", "score", "T-TA score"), ("tta", "embed", "T-TA embed"), ("bilm", "score", "biLM PLL"),
              ("unilm", "score", "uniLM score")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (model, entry, title) in zip(axes, panels):
        series = {}
        for p in points:
            if p.model != model or p.entry != entry or p.batch != 1 or p.threads != 1:
                continue
            r = lmcc.get(p.name, {})
            if "median" in r:
                series.setdefault("lmcc " + p.variant, []).append((p.n, r["median"] * 1e3))
            if p.variant == "opt":
                series.setdefault("roofline bound", []).append((p.n, roofline(ws, limits, p)[0] * 1e3))
                for k, v in peer.items():
                    if k.endswith("/" + p.name) and "median" in v:
                        series.setdefault(k.split("/" + p.name)[0], []).append((p.n, v["median"] * 1e3))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = "--" if label == "roofline bound" else "-"
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", label=label)
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel("ms per sentence (batch 1, 1 thread)")
        ax.set_title(title)
        if series:  # an --only selection may leave a model without batch-1 one-thread entries
            ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    files.append(out_dir / (stem + "-time-vs-n.png"))
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    # 2. speedup of lmcc over each peer at every measured point of the optimized pipelines.
    labels, bars = [], {}
    for p in points:
        if p.variant != "opt" or p.threads != 1:
            continue
        r = lmcc.get(p.name, {})
        if "median" not in r:
            continue
        ps = {k.split("/" + p.name)[0]: v for k, v in peer.items() if k.endswith("/" + p.name) and "median" in v}
        if not ps:
            continue
        labels.append("%s %s\nn%d b%d" % (p.model, p.entry, p.n, p.batch))
        for k, v in ps.items():
            bars.setdefault(k, {})[len(labels) - 1] = speedup(r, v)
    if labels:
        fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(labels) * max(1, len(bars)) / 2), 4.5))
        width = 0.8 / max(1, len(bars))
        for i, (k, vals) in enumerate(sorted(bars.items())):
            xs = [j + i * width for j in vals]
            ax.bar(xs, list(vals.values()), width, label=k)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
        ax.set_xticklabels(labels, fontsize=6, rotation=90)
        ax.set_ylabel("peer time / lmcc time (1 thread)")
        ax.set_title("lmcc speedup over each peer (above 1: lmcc faster)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        files.append(out_dir / (stem + "-speedup.png"))
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)
    # 3. fraction of the roofline bound reached (bound / time) and 4. fraction of the measured FP32 peak reached (the
    # call's FLOPs / time / peak at its thread count), one bar per entry point.
    def entry_bars(suffix, fraction, target, target_label, ylabel, title, headroom):
        labels, fracs, colors = [], [], []
        for p in points:
            r = lmcc.get(p.name, {})
            if p.variant != "opt" or "median" not in r:
                continue
            labels.append("%s %s n%d b%d t%d" % (p.model, p.entry, p.n, p.batch, p.threads))
            fracs.append(fraction(p, r["median"]))
            colors.append({"tta": "C0", "bilm": "C1", "unilm": "C2", "bert": "C3"}[p.model])
        if not labels:
            return
        fig, ax = plt.subplots(figsize=(max(8, 0.18 * len(labels)), 4.5))
        ax.bar(range(len(labels)), fracs, color=colors)
        ax.axhline(target, color="black", linestyle="--", linewidth=0.8, label=target_label)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=5, rotation=90)
        if headroom:
            ax.set_ylim(0, 1.15 * max(1.0, max(fracs)))  # headroom for the legend
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        files.append(out_dir / (stem + suffix))
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    entry_bars("-roofline.png", lambda p, t: roofline(ws, limits, p)[0] / t, 1 / 1.3,
               "target at batch >= 8: within 1.3x of the bound", "roofline bound / time",
               "Fraction of the roofline bound (max(FLOPs/peak, bytes/bandwidth)) reached", False)
    entry_bars("-peak.png", lambda p, t: roofline(ws, limits, p)[1] / t / limits[("peak", p.threads)], 0.7,
               "issue 7's target for compute-bound entries (batch 32, batched PLL): 70% of peak",
               "GFLOP/s / FP32 FMA peak", "Fraction of the measured FP32 peak (at the entry's thread count) reached", True)
    return files


def torch_label(version):
    """The PyTorch peer as the report names it: the PyPI wheel (issue 7: as a user installs it), which on Linux x86-64
    is the CUDA build (a "+cu" version), run on the CPU here."""
    return "PyTorch %s (PyPI wheel, %s)" % (version, "CUDA build, run on the CPU" if "+cu" in version else "CPU")


def check_args(ap, args):
    """Refuses bad arguments before any work, with the usage line and exit status 2 (ap.error): an --only that is no
    regular expression or matches no entry, a --report-from file that cannot be read or is not a run's raw results.
    Returns --report-from's raw results (None without it)."""
    if args.only is not None:
        try:
            re.compile(args.only)
        except re.error as e:
            ap.error("--only %r is not a valid regular expression: %s" % (args.only, e))
    if args.max_call is not None and args.max_call <= 0:
        ap.error("--max-call %g: give a positive number of seconds" % args.max_call)
    if not args.report_from:
        if not make_plan(args.quick, args.only):
            ap.error("no entry of the%s grid matches --only %r (names are like %s)"
                     % (" --quick" if args.quick else "", args.only, make_plan(args.quick)[0].name))
        return None
    try:
        raw = json.loads(Path(args.report_from).read_text())
    except OSError as e:
        ap.error("--report-from %s: cannot read it (%s)" % (args.report_from, e.strerror or e))
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        ap.error("--report-from %s is not valid JSON (%s)" % (args.report_from, e))
    if not isinstance(raw, dict):
        missing = ["JSON object"]
    else:
        missing = [k for k in ("limits", "kernels", "lmcc", "peers", "meta") if k not in raw]
        if "meta" in raw:
            meta = raw["meta"] if isinstance(raw["meta"], dict) else {}
            missing += ["meta." + k for k in ("date", "quick", "versions", "wall") if k not in meta]
    if missing:
        ap.error("--report-from %s is not the raw results of a bench/run.py run (no %s)"
                 % (args.report_from, ", ".join(missing)))
    return raw


def report_from(args, raw):
    """Writes the report of an earlier run from its raw.json (the machine's limits re-measured now)."""
    start = {(k.split("/")[0], int(k.split("/")[1])): v for k, v in raw["limits"].items()}
    if "limits_end" in raw:
        end, note = {(k.split("/")[0], int(k.split("/")[1])): v for k, v in raw["limits_end"].items()}, "at its end"
    else:
        log("re-measuring the machine's limits")
        end = machine_limits(run_kernel_bench(False, Path(args.work) / "kernel_bench-end.json", machine_only=True))
        note = "re-measured when this report was written from the run's raw results"
    limits = combine_limits(start, end)
    meta = raw["meta"]
    ws = Workspace(args.work)
    points = make_plan(meta["quick"], meta.get("only"))
    # Its PyTorch named as torch_label() names it now (runs before it called a "+cu" wheel "CPU").
    versions = re.sub(r"PyTorch (\S+) \(PyPI wheel, CPU\)", lambda m: torch_label(m.group(1)), meta["versions"])
    path = write_report(ws, meta["date"], meta["quick"], limits, raw["kernels"], points, raw["lmcc"],
                        raw["peers"], Path(args.out), versions, meta["wall"], machine_text(limits, start, end, note),
                        meta.get("only"), command=meta.get("command"), profiles=raw.get("profiles"), rounds=meta.get("rounds"),
                        partial=raw.get("partial", False), scaling=raw.get("scaling"),
                        l3=meta.get("l3", l3_cache_bytes()))  # runs before the L3 was recorded: this machine's
    log("wrote %s" % path)


def main():
    script = bool(os.environ.get("LMCC_BENCH_SCRIPT"))  # run by scripts/bench.sh: its name and its --no-train
    ap = argparse.ArgumentParser(prog="scripts/bench.sh" if script else None, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 20, batch 1, 1 thread, short runs (< 3 minutes)")
    ap.add_argument("--work", default=os.environ.get("LMCC_BENCH_WORK", str(Path.home() / ".cache/lmcc-bench/work")),
                    help="weights, libraries, ids and raw results (default ~/.cache/lmcc-bench/work)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="where the report and plots go")
    ap.add_argument("--no-peers", action="store_true", help="lmcc only")
    ap.add_argument("--max-call", type=float, default=None,
                    help="skip calls estimated longer than this many seconds (default 60, quick 5)")
    ap.add_argument("--only", metavar="REGEX",
                    help="the entries whose name (model/variant/entry/n:N/batch:B/threads:T) matches REGEX, with the"
                         " machine limits only from kernel_bench (re-measuring a report's gap entries)")
    ap.add_argument("--report-from", metavar="RAW_JSON",
                    help="only write the report of an earlier run from its raw.json (in --work)")
    ap.add_argument("--check-args", action="store_true",
                    help="only check the arguments and exit (status 2 and the usage on a bad one): scripts/bench.sh "
                         "runs this before it installs or builds anything")
    if script:
        ap.add_argument("--no-train", action="store_true",
                        help="the full grid without the training grid that follows it (scripts/bench-train.sh)")
    args = ap.parse_args()
    raw = check_args(ap, args)
    if args.check_args:
        return
    check_build()  # the build's stamp: the run measures this one
    if args.report_from:
        return report_from(args, raw)
    start = time.time()
    est_limit = args.max_call or (5.0 if args.quick else 60.0)
    ws = Workspace(args.work)
    date = datetime.date.today().isoformat()
    # Files per kind of run, so that a --quick or --only run does not replace a full grid's raw results.
    tag = "-quick" if args.quick else "-only" if args.only else ""
    log("kernel_bench (machine limits, GEMM, attention)")
    kernels = run_kernel_bench(args.quick, ws.work / ("kernel_bench%s.json" % tag), machine_only=bool(args.only))
    limits = machine_limits(kernels)
    log(machine_text(limits))
    points = make_plan(args.quick, args.only)  # not empty: check_args
    for p in points:  # weights and libraries first, so that compiling does not overlap timing
        ws.weights(p.model)
        ws.library(p.model, p.variant)
    # Entries with peers are timed in rounds with them (and with their naive variant); the rest in one process.
    paired = [] if args.no_peers else [p for p in points if has_peers(p)]
    naive = {p.name.replace("/opt/", "/naive/") for p in paired}
    versions = "lmcc %s" % run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
    command = command_line(flags_of(args.quick, args.only), args.no_peers, args.max_call)
    rounds = {"rounds": ROUNDS, "seconds": ROUND_SECONDS} if paired else None
    raw_path = ws.work / ("raw%s.json" % tag)
    l3 = l3_cache_bytes()

    def save_raw(lmcc, peer, partial, **more):
        """raw<tag>.json, written to a temporary name and renamed: after every entry (`partial`: a stopped run's
        report can still be written from it with --report-from) and at the end."""
        meta = {"date": date, "quick": args.quick, "only": args.only, "versions": versions,
                "wall": time.time() - start, "command": command, "rounds": rounds, "l3": l3}
        data = {"limits": {"%s/%d" % k: v for k, v in limits.items()}, "kernels": kernels, "lmcc": lmcc,
                "peers": peer, "meta": meta, "partial": partial}
        data.update(more)
        tmp = raw_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, default=str, indent=1))
        os.replace(tmp, raw_path)

    lmcc = run_model_bench(ws, [p for p in points if p not in paired and p.name not in naive], limits, args.quick,
                           est_limit)
    save_raw(lmcc, {}, True)
    peer = {}
    if paired:
        import onnxruntime
        import torch
        versions += ", %s, ONNX Runtime %s (PyPI)" % (torch_label(torch.__version__), onnxruntime.__version__)
        peer = run_rounds(ws, [p for p in points if p in paired or p.name in naive], lmcc, limits, args.quick,
                          est_limit, checkpoint=lambda so_far: save_raw(lmcc, so_far, True))
    scaling = thread_scaling(ws, points, lmcc)
    save_raw(lmcc, peer, True, scaling=scaling)
    log("kernel_bench (machine limits again, at the end)")
    end = machine_limits(run_kernel_bench(args.quick, ws.work / ("kernel_bench-end%s.json" % tag),
                                          machine_only=True))
    used = combine_limits(limits, end)
    # Where the time of every gap entry goes: each one profiled alone, after all timing.
    profiles = profile_gaps(ws, find_gaps(ws, used, points, lmcc, peer, scaling))
    wall = time.time() - start
    save_raw(lmcc, peer, False, limits_end={"%s/%d" % k: v for k, v in end.items()}, profiles=profiles,
             scaling=scaling)
    path = write_report(ws, date, args.quick, used, kernels, points, lmcc, peer, Path(args.out), versions, wall,
                        machine_text(used, limits, end), args.only, command, profiles, rounds, scaling=scaling, l3=l3)
    log("wrote %s (%.0f s)" % (path, time.time() - start))


if __name__ == "__main__":
    main()
