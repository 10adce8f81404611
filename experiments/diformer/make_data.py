#!/usr/bin/python3
"""Synthetic translation task for the Diformer experiment (issue 19).

Source: 4-16 words from a lexicon of 30 source words. Target: the source reversed, each word
mapped through a fixed bijection; 8 of the 30 words become two target tokens, so the target's
length depends on the content. Ids: 0-4 specials ([tokens] defaults: pad 0, eos 1, unk 2, bos 3,
mask 4), source words 5..34, target tokens 35..72. Writes into OUT/:
  train.jsonl  batches {"src":[[...]],"tgt":[[bos..eos]]} (directions drawn by lmcc train)
  test.src     test sources, ids, one per line;  test.ref  references (target token ids)
"""
import json
import os
import random
import sys

SEED = 1234
N_WORDS, N_SPLIT = 30, 8
FIRST_SRC, FIRST_TGT = 5, 35
BOS, EOS = 3, 1


def lexicon():
    rng = random.Random(SEED)
    perm = list(range(N_WORDS))
    rng.shuffle(perm)
    split = set(rng.sample(range(N_WORDS), N_SPLIT))
    table, nxt = {}, FIRST_TGT + N_WORDS
    for w in range(N_WORDS):
        toks = [FIRST_TGT + perm[w]]
        if w in split:
            toks.append(nxt)
            nxt += 1
        table[FIRST_SRC + w] = toks
    return table


def translate(table, src):
    out = []
    for w in reversed(src):
        out += table[w]
    return out


def sample(rng):
    return [FIRST_SRC + rng.randrange(N_WORDS) for _ in range(rng.randint(4, 16))]


def main():
    out, n_train, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    table = lexicon()
    rng = random.Random(SEED + 1)
    test_rng = random.Random(SEED + 2)
    test = [sample(test_rng) for _ in range(200)]
    test_keys = {tuple(s) for s in test}
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        pairs = []
        while len(pairs) < n_train:
            s = sample(rng)
            if tuple(s) in test_keys:
                continue
            pairs.append((s, [BOS] + translate(table, s) + [EOS]))
            if len(pairs) % batch == 0:
                chunk = pairs[-batch:]
                f.write(json.dumps({"src": [p[0] for p in chunk], "tgt": [p[1] for p in chunk]},
                                   separators=(",", ":")) + "\n")
    with open(os.path.join(out, "test.src"), "w") as f:
        f.write("".join(" ".join(map(str, s)) + "\n" for s in test))
    with open(os.path.join(out, "test.ref"), "w") as f:
        f.write("".join(" ".join(map(str, translate(table, s))) + "\n" for s in test))


if __name__ == "__main__":
    main()
