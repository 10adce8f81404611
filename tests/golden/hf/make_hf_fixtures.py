#!/usr/bin/env python3
"""Hugging Face checkpoints and their outputs, for tests/cli/hf.test (no PyPI package needed to run it).

Run from the repository root with torch, transformers, tokenizers and sentence-transformers installed:
    python3 tests/golden/hf/make_hf_fixtures.py

Writes tests/golden/hf/fixtures/:
  bert_model/  a random-init transformers BertModel (save_pretrained, safetensors) + its BertTokenizerFast files;
               bert_model.embed.jsonl: per sentence, the attention-masked mean of last_hidden_state
               (what `lmcc embed` with [embed] pool = "mean_all" computes);
  mlm_model/   a random-init BertForMaskedLM; mlm_model.score.jsonl: the pseudo-log-likelihood (mask each
               non-special token, Hugging Face forward, log-softmax at that position), in lmcc score's format;
  st_model/    a sentence-transformers folder (Transformer + mean Pooling + Normalize, max_seq_length 24);
               st_model.embed.jsonl: SentenceTransformer.encode;
  sentences.txt, vocab built by the `tokenizers` WordPiece trainer on sentences.txt (lowercase, 400 entries).
Models are tiny (d 32, 2 layers) so the fixtures stay small; every output is float32 computed in float64 where
the reduction is ours.
"""
import json, os, shutil, tempfile

import torch
from tokenizers import BertWordPieceTokenizer
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
SENTENCES = [
    "A man with a hard hat is dancing.",
    "A young child is riding a horse.",
    "The cat sat on the mat, and the dog ran away!",
    "Café au lait costs $3.50 in Zürich.",
    "She didn't know what to say about the new results.",
    "Two dogs are playing in the snow near a red house.",
    "The quick brown fox jumps over the lazy dog.",
    "Is this the real life? Is this just fantasy?",
    "Researchers at the university published a study on language models.",
    "A woman is slicing an onion.",
    "Naïve coöperation between the teams improved everything.",
    "The stock market fell sharply on Monday morning.",
    "He plays the guitar while she sings.",
    "北京 is a city; Tokyo is another.",
    "Numbers like 1,000 and 3.14 appear in text.",
    "An extraordinarily long unpronounceable word: pneumonoultramicroscopicsilicovolcanoconiosis.",
]


def config(**extra):
    return BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=40, hidden_act="gelu", **extra)


def save_tokenizer(vocab_dir, folder):
    tok = BertTokenizerFast.from_pretrained(vocab_dir, do_lower_case=True)
    tok.save_pretrained(folder)
    return tok


def dump(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main():
    torch.manual_seed(0)
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    with open(os.path.join(OUT, "sentences.txt"), "w") as f:
        f.write("\n".join(SENTENCES) + "\n")
    vocab_dir = tempfile.mkdtemp()
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train([os.path.join(OUT, "sentences.txt")], vocab_size=400, min_frequency=1,
                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    trainer.save_model(vocab_dir)
    with open(os.path.join(vocab_dir, "vocab.txt")) as f:
        n = len(f.read().split("\n")) - 1
    assert n <= 400, n

    # BertModel: masked mean of last_hidden_state.
    folder = os.path.join(OUT, "bert_model")
    model = BertModel(config(), add_pooling_layer=True).eval()
    model.save_pretrained(folder, safe_serialization=True)
    tok = save_tokenizer(vocab_dir, folder)
    rows = []
    with torch.no_grad():
        for s in SENTENCES:
            enc = tok(s, return_tensors="pt")
            h = model(**enc).last_hidden_state[0].double()
            m = enc["attention_mask"][0].double().unsqueeze(-1)
            rows.append({"embedding": ((h * m).sum(0) / m.sum()).float().tolist()})
    dump(os.path.join(OUT, "bert_model.embed.jsonl"), rows)

    # BertForMaskedLM: PLL, lmcc score's format (specials get 0 and are not counted).
    folder = os.path.join(OUT, "mlm_model")
    mlm = BertForMaskedLM(config(architectures=["BertForMaskedLM"])).eval()
    mlm.save_pretrained(folder, safe_serialization=True)
    tok = save_tokenizer(vocab_dir, folder)
    rows = []
    with torch.no_grad():
        for s in SENTENCES:
            ids = tok(s)["input_ids"]
            lps = [0.0] * len(ids)
            for i in range(1, len(ids) - 1):
                masked = list(ids)
                masked[i] = tok.mask_token_id
                logits = mlm(input_ids=torch.tensor([masked])).logits[0, i].double()
                lps[i] = float(torch.log_softmax(logits, -1)[ids[i]])
            rows.append({"token_logprobs": lps, "score": sum(lps), "n_scored": len(ids) - 2})
    dump(os.path.join(OUT, "mlm_model.score.jsonl"), rows)

    # sentence-transformers: Transformer + mean pooling + Normalize, as `SentenceTransformer.save` writes it.
    from sentence_transformers import SentenceTransformer, models
    st_src = tempfile.mkdtemp()
    BertModel(config(), add_pooling_layer=False).eval().save_pretrained(st_src, safe_serialization=True)
    save_tokenizer(vocab_dir, st_src)
    word = models.Transformer(st_src, max_seq_length=24)
    st = SentenceTransformer(modules=[word, models.Pooling(32, pooling_mode="mean"), models.Normalize()],
                             device="cpu")
    folder = os.path.join(OUT, "st_model")
    st.save(folder)
    emb = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
    dump(os.path.join(OUT, "st_model.embed.jsonl"), [{"embedding": e.tolist()} for e in emb])
    # What the test needs and nothing else: drop README/model-card files that carry no contract.
    for root, _, files in os.walk(OUT):
        for f in files:
            if f == "README.md":
                os.remove(os.path.join(root, f))


if __name__ == "__main__":
    main()
