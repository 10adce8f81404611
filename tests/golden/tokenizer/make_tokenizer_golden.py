#!/usr/bin/env python3
"""Golden tokenizer fixtures from Hugging Face `tokenizers` (the library behind BertTokenizerFast).

Run from the repository root (needs `pip install tokenizers`; `transformers` too for the cross-check):
    python3 tests/golden/tokenizer/make_tokenizer_golden.py

Sentences (read from ../shared/data, not copied into the repository):
  stsb: every sentence1/sentence2 of stsb/dev.tsv then stsb/test.tsv, in file order;
  blimp: per paradigm (files in sorted order), the first 20 pairs, sentence_good then sentence_bad.
Vocabularies: bert = bert-base-uncased/vocab.txt ([CLS]/[SEP]), tta = tta/vocab-lower.sub-32k.txt ([SOS]/[EOS]),
each cased (lowercase=False) and uncased. Writes fixtures/<vocab>-<cased|uncased>.ids.gz (one sentence of ids a
line, the stsb lines then the blimp lines) and fixtures/torture.json (hex-encoded texts with the ids of all four
configurations, or "error" for invalid UTF-8). GoldenTokenizerTest reads them.
"""
import csv, glob, gzip, io, json, os, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DATA = os.path.join(ROOT, "..", "shared", "data")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
BLIMP_PAIRS = 20

VOCABS = {
    "bert": (os.path.join(DATA, "bert-base-uncased", "vocab.txt"), "[CLS]", "[SEP]"),
    "tta": (os.path.join(DATA, "tta", "vocab-lower.sub-32k.txt"), "[SOS]", "[EOS]"),
}


def sentences():
    out = []
    with open(os.path.join(DATA, "stsb", "dev.tsv"), encoding="utf-8") as f:
        for i, line in enumerate(f.read().split("\n")):
            cols = line.split("\t")
            if i == 0 or len(cols) < 10:
                continue
            out += [cols[7], cols[8]]
    with open(os.path.join(DATA, "stsb", "test.tsv"), encoding="utf-8") as f:
        for line in f.read().split("\n"):
            cols = line.split("\t")
            if len(cols) < 7:
                continue
            out += [cols[5], cols[6]]
    for path in sorted(glob.glob(os.path.join(DATA, "blimp", "*.jsonl.gz"))):
        if os.path.basename(path).startswith("models_summary"):
            continue
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i >= BLIMP_PAIRS:
                    break
                row = json.loads(line)
                out += [row["sentence_good"], row["sentence_bad"]]
    return out


TORTURE = [
    "Café naïve résumé Ångström façade coöperate",
    "ÀÉÎÕÜ àéîõü ÇçÑñ",
    "e\u0301 a\u0308\u0323 a\u0323\u0308 o\u0302\u0300 combining marks",
    "Ελληνικά ΟΔΟΣ οδός Русский текст Ёлка",
    "中文字符测试 日本語のテキスト 한국어 텍스트 中a文b",
    "CJK ext: \U00020000\U0002A700 compat \uF900 radical \u2F00",
    "emoji 😀👍🏽 👨\u200d👩\u200d👧 🇩🇪 ❤️",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "ctrl\x01char\x7fdel\x0bvt\x0cff\u0085nel\x1bescape",
    "tab\there\nnewline\r\ncrlf",
    "nbsp\u00a0ideographic\u3000space\u2003em\u2028line\u2029para",
    "a" * 100,
    "b" * 101,
    "supercalifragilisticexpialidocious" * 4,
    "İstanbul ıi ß ﬁ ﬀ ǅ Ⅻ ＡＢＣ ｆｕｌｌ",
    "العربية עברית हिन्दी क्षत्रिय ไทย",
    "math ∑∫√∞ ≤≥ ± × ÷ ∀x∃y",
    "$100 €50 £3 ¥9 ₹7 a+b=c <tag> ^_^ `x` |y| ~z",
    "«quotes» “double” ‘single’ — dash … ellipsis ¿qué? ¡sí!",
    "private\ue000use unassigned\u0378 nonchar\uffff replacement\ufffd",
    "nul\x00byte",
    "specials [MASK] [CLS] [SEP] [PAD] [UNK] [mask] x[SEP]y [SOS] [EOS]",
    "don't won't it's O'Neil U.S.A. e-mail 3.14 1,000",
    "",
    "   ",
    "Ⓐⓑ ① ¹²³ ½ ㎏ ㍿",
    "Hello, World! HELLO world. Hello-World",
    "antidisestablishmentarianism unbelievably tokenization",
    "\U0001F600" * 30,
    "ä" * 60 + " " + "A\u0308" * 60,
    # Characters whose category changed after the Unicode of tokenizers' tables (runtime/lib/TokenizerCompat.inc):
    # Po, Cf, Mn assigned since Unicode 12, and U+166D (Po then, So now).
    "a\u061db \u0890x\u0891y a\u07fdb A\u08caB a\u0898\u0899b \u166dsign a\u2e43b\u2e44c a\u1b7db \u0c77\u0c84",
]
INVALID = [b"\xff", b"abc\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"ok \xe2\x82 bad", b"\xf4\x90\x80\x80"]


def make(vocab, cls, sep, lowercase):
    from tokenizers import BertWordPieceTokenizer
    return BertWordPieceTokenizer(vocab, unk_token="[UNK]", sep_token=sep, cls_token=cls, pad_token="[PAD]",
                                  mask_token="[MASK]", clean_text=True, handle_chinese_chars=True,
                                  strip_accents=None, lowercase=lowercase)


def main():
    os.makedirs(OUT, exist_ok=True)
    sents = sentences()
    torture = {"texts": [t.encode("utf-8").hex() for t in TORTURE] + [b.hex() for b in INVALID],
               "valid": len(TORTURE), "ids": {}}
    for name, (vocab, cls, sep) in VOCABS.items():
        for lowercase in (True, False):
            tag = f"{name}-{'uncased' if lowercase else 'cased'}"
            tok = make(vocab, cls, sep, lowercase)
            check = None
            try:  # cross-check: transformers' BertTokenizerFast on the same vocabulary gives the same ids
                import shutil, tempfile
                from transformers import BertTokenizerFast
                folder = tempfile.mkdtemp()
                shutil.copy(vocab, os.path.join(folder, "vocab.txt"))
                check = BertTokenizerFast.from_pretrained(folder, do_lower_case=lowercase, cls_token=cls,
                                                          sep_token=sep)
            except ImportError:
                pass
            lines = []
            for s in sents:
                ids = tok.encode(s).ids
                if check is not None:
                    assert check(s)["input_ids"] == ids, (tag, s)
                lines.append(" ".join(map(str, ids)))
            data = ("\n".join(lines) + "\n").encode()
            with open(os.path.join(OUT, f"{tag}.ids.gz"), "wb") as f:
                with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
                    g.write(data)
            torture["ids"][tag] = [tok.encode(t).ids for t in TORTURE]
            if check is not None:
                for t, ids in zip(TORTURE, torture["ids"][tag]):
                    assert check(t)["input_ids"] == ids, (tag, t)
            print(f"{tag}: {len(lines)} sentences", file=sys.stderr)
    with open(os.path.join(OUT, "torture.json"), "w") as f:
        json.dump(torture, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
