#!/usr/bin/env python3
"""Word-level batches from the King James Bible for issue 14's loss check (no tokenizer needed).

make_batches.py OUT_DIR --sentences N --vocab V --max-len L --batch B --objective causal|masked|autoencoding
Writes OUT_DIR/train.jsonl and OUT_DIR/valid.jsonl (lmcc train --batches format, one batch per line) and
OUT_DIR/stats.json with the unigram entropy (nats) of the training targets: the loss of the best model
that ignores context. Ids: 0 pad, 1 eos, 2 unk, 3 bos, 4 [MASK] (lmcc's defaults), then words by frequency.
Masked objective as issue 14 states it: each non-special position chosen with probability 0.15 (one if
none, at most 20), replaced by [MASK], targets only there.
"""
import argparse, collections, json, math, os, random, re, subprocess

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--sentences", type=int, default=4000)
p.add_argument("--vocab", type=int, default=2000)
p.add_argument("--max-len", type=int, default=32)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--objective", default="causal")
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
verses = [re.sub(r"^\S+\s+", "", line).lower() for line in text.splitlines() if line.strip()]
words = [re.findall(r"[a-z]+", v) for v in verses]
words = [w[: a.max_len - 2] for w in words if w]
rng = random.Random(a.seed)
rng.shuffle(words)
train_words, valid_words = words[: a.sentences], words[a.sentences : a.sentences + a.sentences // 10]
counts = collections.Counter(w for s in train_words for w in s)
vocab = {w: i + 5 for i, (w, _) in enumerate(counts.most_common(a.vocab - 5))}
encode = lambda s: [3] + [vocab.get(w, 2) for w in s] + [1]


def example(x):
    n = len(x)
    if a.objective == "causal":
        return x, x[1:] + [-1]
    if a.objective == "autoencoding":
        return x, [-1] + x[1:-1] + [-1]
    inner = list(range(1, n - 1))
    chosen = [i for i in inner if rng.random() < 0.15] or [rng.choice(inner)]
    chosen = set(rng.sample(chosen, 20) if len(chosen) > 20 else chosen)
    return [4 if i in chosen else t for i, t in enumerate(x)], [t if i in chosen else -1 for i, t in enumerate(x)]


def write(path, sents, epochs):
    target_counts = collections.Counter()
    with open(path, "w") as f:
        for _ in range(epochs):
            order = list(range(len(sents)))
            rng.shuffle(order)
            for b in range(0, len(order) - a.batch + 1, a.batch):
                ex = [example(encode(sents[i])) for i in order[b : b + a.batch]]
                for _, t in ex:
                    target_counts.update(y for y in t if y >= 0)
                f.write(json.dumps({"inputs": [e[0] for e in ex], "targets": [e[1] for e in ex]}) + "\n")
    return target_counts


os.makedirs(a.out, exist_ok=True)
c = write(os.path.join(a.out, "train.jsonl"), train_words, 1)
write(os.path.join(a.out, "valid.jsonl"), valid_words, 1)
total = sum(c.values())
entropy = -sum(n / total * math.log(n / total) for n in c.values())
json.dump({"unigram_entropy_nats": entropy, "train_sentences": len(train_words), "vocab": a.vocab,
           "objective": a.objective}, open(os.path.join(a.out, "stats.json"), "w"))
print(json.dumps({"unigram_entropy_nats": round(entropy, 4), "objective": a.objective}))
