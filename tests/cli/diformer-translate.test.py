"""Helper of diformer-translate.test.

  srcs VOCAB BOS EOS SEED COUNT OUT        random sources (1..12 content ids) for lmcc translate, one per line
  modes LMCC SPEC WEIGHTS SRC [FLAGS...]   every mode with and without --rerank, compiled (with FLAGS) and on the
                                           reference: the same translations, scores within 1e-4 (relative to
                                           max(1, |score|)), the same candidate counts
  onepass LMCC SPEC WEIGHTS SRC            the incremental path equals the one-pass score: l2r and r2l decoding
                                           with --beam 1, then lmcc score of each output with DIRS l2r / r2l:
                                           score / (n - 1) equals the decoder's score within 1e-5; with
                                           --rerank (l2r, mask-predict) the score is the mean of the two
                                           directions' lmcc scores (sums, not per token) within 1e-5
  capi LIB NAME SRC LMCC SPEC WEIGHTS      <name>_translate through ctypes gives lmcc translate's output for every
                                           mode; bad arguments fail with LM_ERR_ARGUMENT and say why
"""
import json
import random
import subprocess
import sys

MODES = ["l2r", "r2l", "mask-predict", "easy-first"]


def srcs(vocab, bos, eos, seed, count, out):
    rng = random.Random(seed)
    content = [t for t in range(vocab) if t not in (bos, eos)]
    with open(out, "w") as f:
        for _ in range(count):
            f.write(" ".join(str(rng.choice(content)) for _ in range(rng.randint(1, 12))) + "\n")


def run(lmcc, spec, weights, src, *flags):
    out = subprocess.run([lmcc, "translate", spec, "--weights", weights, "--ids", src, *flags], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def modes(lmcc, spec, weights, src, *flags):
    worst, count = 0.0, 0
    for mode in MODES:
        for rerank in ([], ["--rerank"]):
            extra = ["--mode", mode, "--iterations", "4", "--length-beam", "3", "--beam", "3"] + rerank
            ref = run(lmcc, spec, weights, src, *extra, "--reference")
            got = run(lmcc, spec, weights, src, *extra, *flags)
            assert len(ref) == len(got)
            for i, (x, y) in enumerate(zip(got, ref)):
                where = "%s%s line %d" % (mode, " --rerank" if rerank else "", i + 1)
                if x["ids"] != y["ids"] or x["candidates"] != y["candidates"]:
                    sys.exit("%s: compiled %s (%d candidates) vs reference %s (%d)" %
                             (where, x["ids"], x["candidates"], y["ids"], y["candidates"]))
                d = abs(x["score"] - y["score"]) / max(1.0, abs(y["score"]))
                worst = max(worst, d)
                if d > 1e-4:
                    sys.exit("%s: score %r vs %r" % (where, x["score"], y["score"]))
                count += 1
    print("%d translations agree: max relative score difference %.3g <= 0.0001" % (count, worst))


def scores(lmcc, spec, weights, sources, outs, dirs):
    """lmcc score of each translation (teacher forced with DIRS l2r or r2l): its log-likelihood, a sum."""
    lines = ["%s ||| %s ||| %s" % (s, " ".join(map(str, o["ids"])), dirs) for s, o in zip(sources, outs)]
    out = subprocess.run([lmcc, "score", spec, "--weights", weights, "--ids", "-"], input="\n".join(lines) + "\n",
                         check=True, capture_output=True, text=True).stdout.splitlines()
    return [json.loads(line)["score"] for line in out]


def within(got, want, what):
    """The relative difference of got from want; exits naming `what` above 1e-5."""
    d = abs(got - want) / max(1.0, abs(want))
    if d > 1e-5:
        sys.exit("%s: %r vs %r" % (what, got, want))
    return d


def onepass(lmcc, spec, weights, src):
    sources = open(src).read().splitlines()
    worst, count = 0.0, 0
    for mode, dirs in (("l2r", "l2r"), ("r2l", "r2l")):
        outs = run(lmcc, spec, weights, src, "--mode", mode, "--beam", "1")
        for i, (o, ll) in enumerate(zip(outs, scores(lmcc, spec, weights, sources, outs, dirs))):
            one = ll / (len(o["ids"]) - 1)
            worst = max(worst, within(o["score"], one, "%s line %d: incremental vs one pass" % (mode, i + 1)))
            count += 1
    print("%d decodings: incremental = one pass within %.3g <= 1e-05" % (count, worst))
    # --rerank: the score is the mean of the teacher-forced L2R and R2L log-likelihoods (issue 19), each the
    # sum over the n - 1 predicted tokens that lmcc score gives for DIRS l2r / r2l: no length normalization.
    worst, count = 0.0, 0
    for mode in ("l2r", "mask-predict"):
        outs = run(lmcc, spec, weights, src, "--mode", mode, "--beam", "3", "--length-beam", "3", "--iterations", "3",
                   "--rerank")
        both = [scores(lmcc, spec, weights, sources, outs, dirs) for dirs in ("l2r", "r2l")]
        for i, (o, l2r, r2l) in enumerate(zip(outs, *both)):
            what = "%s --rerank line %d: score vs the mean of the two directions" % (mode, i + 1)
            worst = max(worst, within(o["score"], 0.5 * (l2r + r2l), what))
            count += 1
    print("%d reranked decodings: score = mean of the L2R and R2L log-likelihoods within %.3g <= 1e-05" % (count, worst))


def capi(lib_path, name, src, lmcc, spec, weights):
    import ctypes
    lib = ctypes.CDLL(lib_path)
    lib.lm_last_error.restype = ctypes.c_char_p
    model = ctypes.c_void_p()
    assert getattr(lib, name + "_load")(None, ctypes.byref(model)) == 0, lib.lm_last_error()
    translate = getattr(lib, name + "_translate")
    i32 = ctypes.c_int32

    def call(ids, mode, beam=3, length_beam=3, iterations=4, rerank=0, max_target=0, capacity=64, m=model):
        S = (i32 * max(1, len(ids)))(*ids)
        T = (i32 * max(1, capacity))()
        n, cands, score = i32(), i32(), ctypes.c_double()
        rc = translate(m, S, len(ids), mode, beam, length_beam, iterations, rerank, max_target, T, capacity,
                       ctypes.byref(n), ctypes.byref(score), ctypes.byref(cands))
        return rc, list(T[: n.value]) if rc == 0 else n.value, score.value, cands.value

    sources = [list(map(int, l.split())) for l in open(src).read().splitlines()]
    for k, mode in enumerate(MODES):
        for rerank in (0, 1):
            flags = ["--mode", mode, "--iterations", "4", "--length-beam", "3", "--beam", "3"]
            cli = run(lmcc, spec, weights, src, *flags, *(["--rerank"] if rerank else []))
            for s, c in zip(sources, cli):
                # lmcc translate bounds an AR target to 2 * len(src) + 10 tokens
                rc, ids, score, cands = call(s, k, rerank=rerank, max_target=min(2 * len(s) + 10, 63))
                assert rc == 0, lib.lm_last_error()
                assert ids == c["ids"] and cands == c["candidates"], (mode, ids, c)
                assert abs(score - c["score"]) <= 1e-6 * max(1.0, abs(score)), (score, c["score"])
    print("C API: %d translations equal lmcc translate's" % (len(sources) * 8))
    s = sources[0]
    for what, args in [("mode 4", dict(ids=s, mode=4)), ("beam 0", dict(ids=s, mode=0, beam=0)),
                       ("beam 1001", dict(ids=s, mode=0, beam=1001)),
                       ("iterations 0", dict(ids=s, mode=2, iterations=0)),
                       ("max_target 1", dict(ids=s, mode=0, max_target=1)),
                       ("empty source", dict(ids=[], mode=0)), ("id outside the vocabulary", dict(ids=[7000], mode=0)),
                       ("capacity 2", dict(ids=s, mode=1, capacity=2)), ("no model", dict(ids=s, mode=0, m=None))]:
        rc, n, _, _ = call(**args)
        extra = " (tgt_length %d)" % n if what == "capacity 2" else ""
        print("%s: rc %d: %s%s" % (what, rc, lib.lm_last_error().decode(), extra))


if __name__ == "__main__":
    if sys.argv[1] == "srcs":
        srcs(*map(int, sys.argv[2:7]), sys.argv[7])
    elif sys.argv[1] == "modes":
        modes(*sys.argv[2:])
    elif sys.argv[1] == "onepass":
        onepass(*sys.argv[2:6])
    elif sys.argv[1] == "capi":
        capi(*sys.argv[2:8])
    else:
        sys.exit("unknown command " + sys.argv[1])
