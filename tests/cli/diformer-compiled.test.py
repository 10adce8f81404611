"""Helper of diformer-compiled.test.

  gen VOCAB MAX_LEN BOS EOS SEED OUT   random SRC ||| TGT ||| DIRS [||| HIDE] lines: every direction mix
                                        (l2r, r2l, pll, random R/L/S/- rows), hidden sets, lengths 2..max_len-1
  batch LINES OUT                       the first 12 SRC ||| TGT ||| DIRS [||| HIDE] lines as one lmcc grad batch
                                        {"src","tgt","dirs","hide"} (HIDE on every S row but itself)
  sharpen IN OUT SEED                   rewrites lmcc init's weights (std 0.02) with std 0.3 values (norm gains
                                        1 +- 0.3), so that attention is far from uniform and errors show
  capi LIB NAME MAX_LEN BOS EOS         <name>_score_pairs through ctypes: one valid pair, then invalid
                                        arguments (each must fail with LM_ERR_ARGUMENT and say why)
  gradcmp A B TOL                       every tensor of two gradient files agrees within TOL of max(the tensor's
                                        largest magnitude, 1e-3) (DiformerTest's measure); same names and shapes
  cmp A B TOL                           token log-probs, scores and length log-probs of two lmcc score outputs
                                        agree within TOL (relative to max(1, |value|)); n_scored equal
"""
import json
import random
import struct
import sys


def gen(vocab, max_len, bos, eos, seed, out):
    rng = random.Random(seed)
    content = [t for t in range(vocab) if t not in (bos, eos)]
    lines = []
    for k in range(40):
        n = rng.choice([2, 3, 4, max_len - 1]) if k < 8 else rng.randint(2, max_len - 1)
        m = rng.randint(1, max_len)
        src = [rng.choice(content) for _ in range(m)]
        tgt = [bos] + [rng.choice(content) for _ in range(n - 2)] + [eos]
        kind = k % 5
        if kind == 0:
            dirs = "l2r"
        elif kind == 1:
            dirs = "r2l"
        elif kind == 2:
            dirs = "pll"
        else:
            letters = ["R" if rng.random() < 0.8 else "-"]
            letters += [rng.choice("RLS-") for _ in range(n - 2)]
            letters += ["L" if rng.random() < 0.8 else "-"]
            dirs = "".join(letters)
        line = " ".join(map(str, src)) + " ||| " + " ".join(map(str, tgt)) + " ||| " + dirs
        if kind >= 2 and n > 2 and rng.random() < 0.7:
            hide = rng.sample(range(1, n - 1), rng.randint(1, n - 2))
            line += " ||| " + " ".join(map(str, sorted(hide)))
        lines.append(line)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def cmp(a, b, tol):
    xs = [json.loads(l) for l in open(a)]
    ys = [json.loads(l) for l in open(b)]
    assert len(xs) == len(ys), (len(xs), len(ys))
    worst = 0.0
    for i, (x, y) in enumerate(zip(xs, ys)):
        assert x["n_scored"] == y["n_scored"], (i, x["n_scored"], y["n_scored"])
        assert len(x["token_logprobs"]) == len(y["token_logprobs"]), i
        pairs = [(x["score"], y["score"]), (x["length_logprob"], y["length_logprob"])]
        pairs += list(zip(x["token_logprobs"], y["token_logprobs"]))
        for u, v in pairs:
            d = abs(u - v) / max(1.0, abs(v))
            worst = max(worst, d)
            if d > tol:
                sys.exit("line %d: %r vs %r (relative difference %.3g > %g)" % (i + 1, u, v, d, tol))
    print("%d lines agree: max relative difference %.3g <= %g" % (len(xs), worst, tol))


def batch(lines_path, out):
    src, tgt, dirs, hide = [], [], [], []
    for line in open(lines_path).read().splitlines()[:12]:
        parts = [p.strip() for p in line.split("|||")]
        s_ids, t_ids = list(map(int, parts[0].split())), list(map(int, parts[1].split()))
        n = len(t_ids)
        d = parts[2]
        d = {"l2r": "R" * (n - 1) + "-", "r2l": "-" + "L" * (n - 1), "pll": "-" + "S" * (n - 2) + "-"}.get(d, d)
        h = list(map(int, parts[3].split())) if len(parts) > 3 else []
        src.append(s_ids)
        tgt.append(t_ids)
        dirs.append(d)
        hide.append([[j for j in h if j != i] if d[i] == "S" else [] for i in range(n)])
    with open(out, "w") as f:
        json.dump({"src": src, "tgt": tgt, "dirs": dirs, "hide": hide}, f)


def read_safetensors(path):
    data = open(path, "rb").read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = (t["shape"], struct.unpack("<%df" % ((end - begin) // 4), data[8 + size + begin:8 + size + end]))
    return out


def gradcmp(a, b, tol):
    x, y = read_safetensors(a), read_safetensors(b)
    assert sorted(x) == sorted(y), (sorted(set(x) ^ set(y)))
    worst = 0.0
    for name in sorted(x):
        assert x[name][0] == y[name][0], (name, x[name][0], y[name][0])
        scale = max(max(abs(v) for v in y[name][1]), 1e-3)  # as DiformerTest: tensors whose gradient vanishes
        d = max(abs(u - v) for u, v in zip(x[name][1], y[name][1])) / scale
        worst = max(worst, d)
        if d > tol:
            sys.exit("%s: max difference %.3g of the tensor's scale > %g" % (name, d, tol))
    print("%d tensors agree: max difference %.3g of the tensor's scale <= %g" % (len(x), worst, tol))


def sharpen(src, dst, seed):
    rng = random.Random(seed)
    data = open(src, "rb").read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    body = bytearray(data[8 + size:])
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", name
        begin, end = t["data_offsets"]
        count = (end - begin) // 4
        gain = name.endswith("norm.weight")
        values = [(1.0 if gain else 0.0) + rng.gauss(0.0, 0.3) for _ in range(count)]
        body[begin:end] = struct.pack("<%df" % count, *values)
    with open(dst, "wb") as f:
        f.write(data[:8 + size])
        f.write(body)


def capi(lib_path, name, max_len, bos, eos):
    import ctypes
    lib = ctypes.CDLL(lib_path)
    i32p, f32p = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
    load, score_pairs = getattr(lib, name + "_load"), getattr(lib, name + "_score_pairs")
    lib.lm_last_error.restype = ctypes.c_char_p
    model = ctypes.c_void_p()
    assert load(None, ctypes.byref(model)) == 0, lib.lm_last_error()
    words = (max_len + 31) // 32

    def call(src, tgt, dirs, hidden_bits=(), n=None):
        n = len(tgt) if n is None else n
        S = (ctypes.c_int32 * len(src))(*src)
        T = (ctypes.c_int32 * max(len(tgt), n))(*tgt)
        D = (ctypes.c_int32 * max(len(dirs), n))(*dirs)
        H = (ctypes.c_uint32 * (max(len(tgt), n) * words))()
        for row, key in hidden_bits:
            H[row * words + key // 32] |= 1 << (key % 32)
        lp = (ctypes.c_float * max(len(tgt), n))()
        sc, ln = ctypes.c_float(), ctypes.c_float()
        rc = score_pairs(model, S, ctypes.byref(ctypes.c_int32(len(src))), len(src), T,
                         ctypes.byref(ctypes.c_int32(n)), max(len(tgt), n), D, H, 1, lp, ctypes.byref(sc),
                         ctypes.byref(ln))
        return rc, sc.value, ln.value

    rc, sc, ln = call([7, 8, 9], [bos, 7, 9, eos], [0, 2, 2, 1], [(1, 2)])
    print("valid: rc %d, score %.4f, length %.4f" % (rc, sc, ln))
    cases = [
        ("row 0 not R", [7], [bos, 7, eos], [2, 2, 1], []),
        ("row n-1 not L", [7], [bos, 7, eos], [0, 2, 0], []),
        ("bad direction", [7], [bos, 7, eos], [0, 4, 1], []),
        ("hidden on an R row", [7], [bos, 7, 9, eos], [0, 0, 2, 1], [(1, 2)]),
        ("hidden bos", [7], [bos, 7, 9, eos], [0, 2, 2, 1], [(1, 0)]),
        ("hidden past eos", [7], [bos, 7, 9, eos], [0, 2, 2, 1], [(1, 33)]),
        ("target without bos", [7], [7, 7, eos], [0, 2, 1], []),
        ("target too long", [7], [bos] + [7] * (max_len - 2) + [eos], [0] + [2] * (max_len - 2) + [1], []),
        ("id outside the vocabulary", [7000], [bos, eos], [0, 1], []),
    ]
    for what, src, tgt, dirs, hidden in cases:
        rc, _, _ = call(src, tgt, dirs, hidden)
        print("%s: rc %d: %s" % (what, rc, lib.lm_last_error().decode()))
    ids = (ctypes.c_int32 * 3)(bos, 7, eos)
    scores = (ctypes.c_float * 1)()
    rc = getattr(lib, name + "_score")(model, ids, ctypes.byref(ctypes.c_int32(3)), 1, 3, None, scores)
    print("ids-only score: rc %d: %s" % (rc, lib.lm_last_error().decode()))


def capitrain(lib_path, name, batch_path, max_len):
    """<name>_pair_loss_and_grad and <name>_train_step_pairs on batch.json's pairs (library compiled with --train);
    <name>_loss_and_grad, which a Diformer does not have, is an error."""
    import ctypes
    lib = ctypes.CDLL(lib_path)
    lib.lm_last_error.restype = ctypes.c_char_p
    b = json.load(open(batch_path))
    count, words = len(b["src"]), (max_len + 31) // 32
    ss, ts = max(map(len, b["src"])), max(map(len, b["tgt"]))
    S, T = (ctypes.c_int32 * (count * ss))(), (ctypes.c_int32 * (count * ts))()
    D, H = (ctypes.c_int32 * (count * ts))(), (ctypes.c_uint32 * (count * ts * words))()
    SL, TL = (ctypes.c_int32 * count)(*map(len, b["src"])), (ctypes.c_int32 * count)(*map(len, b["tgt"]))
    for k in range(count):
        for i, v in enumerate(b["src"][k]):
            S[k * ss + i] = v
        for i, v in enumerate(b["tgt"][k]):
            T[k * ts + i] = v
            D[k * ts + i] = "RLS-".index(b["dirs"][k][i])
            for j in b["hide"][k][i]:
                H[(k * ts + i) * words + j // 32] |= 1 << (j % 32)
    model, trainer = ctypes.c_void_p(), ctypes.c_void_p()
    assert getattr(lib, name + "_load")(None, ctypes.byref(model)) == 0, lib.lm_last_error()
    loss, nll = ctypes.c_float(), (ctypes.c_double * 2)()
    rc = getattr(lib, name + "_pair_loss_and_grad")(model, S, SL, ss, T, TL, ts, D, H, count, ctypes.byref(loss),
                                                     nll, None)
    print("pair_loss_and_grad: rc %d, loss %.9g" % (rc, loss.value))
    assert getattr(lib, name + "_trainer_new")(model, ctypes.byref(trainer)) == 0, lib.lm_last_error()
    step = ctypes.c_float()
    rc = getattr(lib, name + "_train_step_pairs")(trainer, S, SL, ss, T, TL, ts, D, H, count, ctypes.byref(step), None)
    print("train_step_pairs: rc %d, loss %.9g" % (rc, step.value))
    rc = getattr(lib, name + "_loss_and_grad")(model, T, TL, TL, count, ts, ctypes.byref(loss), None)
    print("loss_and_grad: rc %d: %s" % (rc, lib.lm_last_error().decode()))


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(*map(int, sys.argv[2:7]), sys.argv[7])
    elif sys.argv[1] == "capitrain":
        capitrain(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif sys.argv[1] == "capi":
        capi(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7]))
    elif sys.argv[1] == "batch":
        batch(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "gradcmp":
        gradcmp(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1] == "sharpen":
        sharpen(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        cmp(sys.argv[2], sys.argv[3], float(sys.argv[4]))
