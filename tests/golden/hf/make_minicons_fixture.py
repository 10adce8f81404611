#!/usr/bin/env python3
"""minicons' PLL scores of the tiny BertForMaskedLM, for `lmcc score --pll word-l2r|original` (tests/cli/hf.test).

Run from the repository root, after tests/golden/hf/make_hf_fixtures.py has written fixtures/mlm_model/, with a
Python that has torch, transformers 4.x, tokenizers and minicons (minicons 0.3.39 calls the tokenizer's
batch_encode_plus, which transformers 5 removed). Written with minicons 0.3.39, transformers 4.57.6,
tokenizers 0.22.2, torch 2.15 CPU, in a venv outside the repository that reuses an existing torch venv:
    python3 -m venv ~/.cache/lmcc-minicons/venv
    echo ~/.cache/lmcc-bench/venv/lib/python3.11/site-packages \
        > ~/.cache/lmcc-minicons/venv/lib/python3.11/site-packages/torch-venv.pth     # torch, numpy
    ~/.cache/lmcc-minicons/venv/bin/pip install --no-deps minicons==0.3.39 transformers==4.57.6 \
        tokenizers==0.22.2 huggingface_hub==0.36.2 safetensors regex tqdm pyyaml filelock packaging requests \
        urllib3 certifi idna wonderwords
    ~/.cache/lmcc-minicons/venv/bin/python tests/golden/hf/make_minicons_fixture.py
Output is deterministic (one torch thread, one sentence per forward batch).

Writes tests/golden/hf/fixtures/:
  mlm_model.word_l2r.jsonl  minicons `MaskedLMScorer.token_score(..., PLL_metric="within_word_l2r")`
  mlm_model.original.jsonl  minicons `MaskedLMScorer.token_score(..., PLL_metric="original")`
on fixtures/sentences.txt followed by the WORDS sentences below (one sentence at a time, so no padding), in
lmcc score's format:
{"token_logprobs": [...], "score": S, "n_scored": K} per line, one log-prob per piece of the BertTokenizerFast
encoding including [CLS] and [SEP] (0.0: minicons does not score them), S their float64 sum, K the number of
non-special pieces. The log-probs are minicons' own (float32 log-softmax of the HF logits).

WORDS: the WordPiece vocabulary was trained on sentences.txt, so every word there is a single piece and
within_word_l2r equals original on it; the WORDS sentences (ASCII, so tests/cli/hf.test appends them to a copy
of sentences.txt with `echo` lines; keep the two in sync) use words outside the vocabulary, which split into
2 to 10 pieces (e.g. "un ##b ##el ##i ##e ##v ##abl ##y"), including a multi-piece word right before [SEP].

The within_word_l2r metric (Kauf & Ivanova 2023, https://arxiv.org/abs/2305.10588) as minicons implements it
(minicons/scorer.py, MaskedLMScorer.get_masked_tensors): for each target piece at position p (every piece that
is not [PAD]/[CLS]/[SEP]), the copy that predicts it masks p and every later target position j with
word_ids[j] == word_ids[p], where word_ids is the fast tokenizer's BatchEncoding.word_ids(), i.e. the
pre-token (BertPreTokenizer: whitespace and punctuation split) the piece came from; pieces with word_id None
are masked alone. For a WordPiece tokenizer a pre-token is one first piece followed by its "##" pieces, so
this is lmcc's definition ("piece i is predicted with pieces [i, end of its word) masked, a word = a piece
plus the following ## pieces"); the script asserts that the two definitions give the same mask sets on every
sentence, and that minicons' (token, score) lists line up with the encoding's pieces.

Also checked: minicons' original PLL against mlm_model.score.jsonl (make_hf_fixtures.py, float64 log-softmax;
max |difference| printed, 6.5e-7, must be < 1e-5); token_score sums against sequence_score with a sum reduction;
within_word_l2r differs from original on every piece whose mask set has more than one piece (63 of 247).
"""
import json, os

import torch
from minicons import scorer
from transformers import BertTokenizerFast

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
MODEL = os.path.join(FIX, "mlm_model")
WORDS = [
    "The horses were unbelievably photogenic.",
    "Cats chased mice through kitchens yesterday, quickly.",
    "Unhappiness makes researchers overthink everything.",
    "xylophone qwerty",
]
METRICS = {"within_word_l2r": "mlm_model.word_l2r.jsonl", "original": "mlm_model.original.jsonl"}


def lmcc_word_l2r_masks(pieces):
    """lmcc's word-l2r: target i masks [i, end of its word); a word is a piece plus the following ## pieces."""
    special = {"[CLS]", "[SEP]", "[PAD]"}
    sets = []
    for i in range(1, len(pieces) - 1):
        end = i + 1
        while end < len(pieces) - 1 and pieces[end].startswith("##") and pieces[end] not in special:
            end += 1
        sets.append(list(range(i, end)))
    return sets


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with open(os.path.join(FIX, "sentences.txt")) as f:
        sentences = [line.rstrip("\n") for line in f if line.strip()] + WORDS
    mlm = scorer.MaskedLMScorer(MODEL, "cpu")
    tok = BertTokenizerFast.from_pretrained(MODEL)
    out = {}
    for metric, name in METRICS.items():
        rows = []
        for s in sentences:
            ids = tok(s)["input_ids"]
            pieces = tok.convert_ids_to_tokens(ids)
            assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]" and "[PAD]" not in pieces, pieces
            # minicons' own mask sets for this metric, checked against lmcc's definition.
            (masked, _, target_ids, target_pos), = list(mlm.prepare_text([s], PLL_metric=metric))
            assert target_pos.tolist() == list(range(1, len(ids) - 1)), (s, target_pos)
            assert target_ids.tolist() == ids[1:-1], s
            sets = [[j for j in range(len(ids)) if masked[r, j] == tok.mask_token_id] for r in range(len(masked))]
            want = lmcc_word_l2r_masks(pieces) if metric == "within_word_l2r" else [[i] for i in range(1, len(ids) - 1)]
            assert sets == want, (s, sets, want)
            (scored,) = mlm.token_score([s], PLL_metric=metric)
            assert len(scored) == len(ids) - 2, (s, scored)
            for (t, _), i in zip(scored, ids[1:-1]):
                assert t == tok.decode([i]).strip(), (s, t, i)
            lps = [0.0] + [float(v) for _, v in scored] + [0.0]
            total = float(sum(lps))  # python floats: float64
            (seq,) = mlm.sequence_score([s], reduction=lambda x: x.sum(0).item(), PLL_metric=metric)
            assert abs(seq - total) < 1e-4, (s, seq, total)
            rows.append({"token_logprobs": lps, "score": total, "n_scored": len(ids) - 2})
        with open(os.path.join(FIX, name), "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        out[metric] = rows
        print(f"{name}: {len(rows)} sentences, {sum(r['n_scored'] for r in rows)} pieces scored")

    with open(os.path.join(FIX, "mlm_model.score.jsonl")) as f:
        hf = [json.loads(line) for line in f]
    assert len(hf) == len(out["original"]) - len(WORDS)
    worst = max(abs(a - b) for r, h in zip(out["original"], hf) for a, b in zip(r["token_logprobs"], h["token_logprobs"]))
    print(f"minicons original vs mlm_model.score.jsonl: max |difference| {worst:.3g}")
    changed = sum(a != b for r, w in zip(out["original"], out["within_word_l2r"])
                  for a, b in zip(r["token_logprobs"], w["token_logprobs"]))
    multi = sum(len(m) > 1 for s in sentences for m in lmcc_word_l2r_masks(tok.convert_ids_to_tokens(tok(s)["input_ids"])))
    print(f"within_word_l2r masks more than one piece for {multi} pieces; differs from original on {changed}")
    assert changed >= multi > 0
    assert worst < 1e-5, worst


if __name__ == "__main__":
    main()
