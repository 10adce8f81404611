#!/usr/bin/python3
"""Writes the golden fixtures tests/golden/fixtures/<case>/{spec.toml, weights.safetensors,
ids.txt, score.jsonl, embed.jsonl} with the independent PyTorch implementation (torch_ref.py).

Deterministic: fixed seeds, single-threaded torch. Regenerate with
    /usr/bin/python3 tests/golden/make_golden.py [CASE ...]
Outputs are computed from the files as written (spec parsed back, weights read back
after F16/BF16 rounding), exactly as `torch_ref.py score|embed` would.
"""
import os
import random
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import torch  # noqa: E402
import torch_ref  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures")
V, L = 61, 40


def dims(d, heads, ff, layers, vocab=V, max_len=L):
    return ("[dims]\nvocab = %d\nmax_len = %d\nd_model = %d\nheads = %d\nd_ff = %d\nlayers = %d\n"
            % (vocab, max_len, d, heads, ff, layers))


# name -> (description, spec TOML body after name/family, family, seed, dtype, sentence options)
CASES = [
    ("unilm_post_tied", "unilm, post-norm, tied head, learned positions, gelu, family defaults "
     "(mask causal, keys/values hidden, first query embedding, causal scoring)",
     "unilm", dims(72, 6, 100, 3), 101, "F32", {}),
    ("unilm_pre_untied_sin", "unilm, pre-norm (final_norm), 5 layers, untied head, sinusoidal positions, "
     "gelu_tanh, eps 1e-5, skip_special = false (position 0 still unscored)",
     "unilm", dims(36, 6, 52, 5) +
     '[embedding]\nposition = "sinusoidal"\n[block]\nactivation = "gelu_tanh"\nnorm = "pre"\neps = 1e-5\n'
     "[head]\ntied = false\n[score]\nskip_special = false\n", 102, "F32", {}),
    ("bilm_mp", "bilm, family defaults: mask none, mask-and-predict (n copies), post-norm, gelu",
     "bilm", dims(48, 6, 76, 3), 103, "F32", {"only_specials": True}),
    ("bilm_relu_nohead", "bilm, relu, no head transform, custom token ids (pad 0, unk 1, bos 2, eos 5, mask 7), "
     "explicit [attention]/[score] keys equal to the defaults",
     "bilm", dims(36, 6, 52, 3) +
     '[attention]\nmask = "none"\nkeys_values = "hidden"\nfirst_query = "embedding"\nrelative_positions = 0\n'
     '[block]\nactivation = "relu"\n[head]\ntransform = false\n'
     "[tokens]\npad = 0\nunk = 1\nbos = 2\neos = 5\nmask = 7\n"
     '[score]\nmethod = "mask-and-predict"\nskip_special = true\n', 104, "F32", {}),
    ("tta_position", "T-TA, family defaults: diagonal mask, keys/values = embedding stream, "
     "first query = norm_e(P), single-pass; the 1-token sentence has no visible key (zero context)",
     "tta", dims(72, 6, 100, 3), 105, "F32", {"single_plain": True}),
    ("tta_maskpos", "T-TA with first_query = mask+position (norm_e(E[MASK] + P)), gelu_tanh",
     "tta", dims(48, 6, 76, 3) + '[attention]\nfirst_query = "mask+position"\n[block]\nactivation = "gelu_tanh"\n',
     106, "F32", {"single_plain": True}),
    ("tta_pre", "T-TA pre-norm (keys/values X without per-layer norm, final_norm), 5 layers, untied head",
     "tta", dims(36, 6, 52, 5) + '[block]\nnorm = "pre"\n[head]\ntied = false\n', 107, "F32", {}),
    ("bilm_anticausal", "bilm with mask anticausal (j >= i) under mask-and-predict, eps 1e-6",
     "bilm", dims(36, 6, 52, 3) + '[attention]\nmask = "anticausal"\n[block]\neps = 1e-6\n', 108, "F32", {}),
    ("bilm_relpos3", "bilm with Shaw relative positions k = 3 (rel_k / rel_v per layer), no absolute positions",
     "bilm", dims(48, 6, 76, 3) + '[embedding]\nposition = "none"\n[attention]\nrelative_positions = 3\n',
     109, "F32", {}),
    ("tta_relpos2_pre", "T-TA pre-norm with relative positions k = 2 and learned absolute positions",
     "tta", dims(36, 6, 52, 3) + '[attention]\nrelative_positions = 2\n[block]\nnorm = "pre"\n',
     110, "F32", {"single_plain": True}),
    ("tta_noembnorm_nobias", "T-TA with [embedding] norm = false (X = E[x] + P, h0 = P) and [head] bias = false",
     "tta", dims(36, 6, 52, 3) + "[embedding]\nnorm = false\n[head]\nbias = false\n", 111, "F32", {}),
    ("tta_f16", "T-TA stored as F16 safetensors (outputs computed from the f16-rounded values)",
     "tta", dims(72, 6, 100, 3), 112, "F16", {}),
    ("unilm_kvemb_bf16", "unilm with keys_values = embedding, stored as BF16, skip_special = false",
     "unilm", dims(36, 6, 52, 3) + '[attention]\nkeys_values = "embedding"\n[score]\nskip_special = false\n',
     113, "BF16", {"only_specials": True}),
]


def make_sentences(s, seed, opts):
    """~8 sentences: a 1-token one, a max_len one, others 2..max_len-1 tokens; bos/eos at the ends of most."""
    rng = random.Random(seed * 7919 + 17)
    special = {s.bos, s.eos}
    ordinary = [t for t in range(s.vocab) if t not in special]
    words = [t for t in ordinary if t not in (s.pad, s.unk, s.mask_id)]

    def body(n):
        out = []
        for _ in range(n):
            r = rng.random()
            out.append(rng.choice([s.unk, s.pad, s.mask_id]) if r < 0.06 else rng.choice(words))
        return out

    sents = []
    # 1 token: a plain word (no bos/eos, so it is scored) or a lone bos.
    sents.append([rng.choice(words)] if opts.get("single_plain") or seed % 2 else [s.bos])
    # max_len tokens with bos/eos at the ends.
    sents.append([s.bos] + body(s.max_len - 2) + [s.eos])
    lengths = [2, 3, 7, 13, 24, s.max_len - 1]
    for k, n in enumerate(lengths):
        if k == 2:  # no bos/eos at all
            sents.append(body(n))
        elif k == 3:  # bos only, an eos inside as well
            b = body(n - 1)
            b[n // 2] = s.eos
            sents.append([s.bos] + b)
        elif n == 2:
            sents.append([s.bos, rng.choice(words)] if not opts.get("only_specials") else [s.bos, s.eos])
        else:
            sents.append([s.bos] + body(n - 2) + [s.eos])
    if not opts.get("single_plain") and seed % 2 == 0:
        sents.append([rng.choice(words)])
    return sents


def write_case(name, desc, family, body, seed, dtype, opts):
    d = os.path.join(FIXTURES, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    spec_path = os.path.join(d, "spec.toml")
    with open(spec_path, "w") as f:
        f.write("# %s\n# Generated by tests/golden/make_golden.py; do not edit.\n" % desc)
        f.write('name = "%s"\nfamily = "%s"\n' % (name, family))
        f.write(body)
    s = torch_ref.load_spec(spec_path)
    w_path = os.path.join(d, "weights.safetensors")
    torch_ref.write_safetensors(w_path, torch_ref.init_weights(s, seed),
                                {"name": s.name, "generator": "tests/golden/make_golden.py", "seed": str(seed)},
                                dtype)
    ids_path = os.path.join(d, "ids.txt")
    with open(ids_path, "w") as f:
        for x in make_sentences(s, seed, opts):
            f.write(" ".join(str(t) for t in x) + "\n")
    for cmd in ("score", "embed"):
        text = torch_ref.run(cmd, spec_path, w_path, ids_path)
        with open(os.path.join(d, cmd + ".jsonl"), "w") as f:
            f.write(text)
    return d


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
