#!/usr/bin/env python3
"""lmcc tokenize against transformers' BertTokenizerFast on every Unicode scalar value (not run by ctest).

    python3 tests/golden/tokenizer/check_code_points.py [--lmcc build/bin/lmcc]   # needs: pip install transformers

For each code point c (but newline and carriage return, which end lines) the line "a<c>b <c>B" is tokenized by both,
with the BERT-base uncased and the T-TA vocabularies of ../shared/data, cased and uncased; prints the mismatches
per configuration (0 each when lmcc is right) and the first few.
"""
import argparse, os, shutil, subprocess, sys, tempfile, unicodedata

from transformers import BertTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DATA = os.path.join(ROOT, "..", "shared", "data")
VOCABS = {"bert": (os.path.join(DATA, "bert-base-uncased", "vocab.txt"), 30522, "pad = 0\nunk = 100\nbos = 101\n"
                   "eos = 102\nmask = 103\n", {}),
          "tta": (os.path.join(DATA, "tta", "vocab-lower.sub-32k.txt"), 29530, "",
                  {"cls_token": "[SOS]", "sep_token": "[EOS]"})}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lmcc", default=os.path.join(ROOT, "build", "bin", "lmcc"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c not in (0x0A, 0x0D)]
    lines = ["a" + chr(c) + "b " + chr(c) + "B" for c in cps]
    text = os.path.join(tmp, "text.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    failed = 0
    for name, (vocab, size, tokens, specials) in VOCABS.items():
        folder = os.path.join(tmp, name)
        os.makedirs(folder)
        shutil.copy(vocab, os.path.join(folder, "vocab.txt"))
        for lowercase in (True, False):
            tag = f"{name}-{'uncased' if lowercase else 'cased'}"
            spec = os.path.join(tmp, tag + ".toml")
            with open(spec, "w") as f:
                f.write(f'name = "tok"\nfamily = "bilm"\n[dims]\nvocab = {size}\nmax_len = 512\nd_model = 8\nheads = 1\n'
                        f'd_ff = 8\nlayers = 1\n[tokens]\n{tokens}[tokenizer]\nvocab = "{vocab}"\n'
                        f'lowercase = {"true" if lowercase else "false"}\n')
            tok = BertTokenizerFast.from_pretrained(folder, do_lower_case=lowercase, **specials)
            out = subprocess.run([a.lmcc, "tokenize", spec, "--text", text], capture_output=True, text=True, check=True)
            ours = out.stdout.split("\n")[:-1]
            theirs = tok(lines)["input_ids"]
            bad = [(c, o, t) for c, o, t in zip(cps, ours, theirs) if o != " ".join(map(str, t))]
            failed += len(bad) + abs(len(ours) - len(lines))
            print(f"{tag}: {len(lines)} code points, {len(bad)} mismatches")
            for c, o, t in bad[:5]:
                print(f"  U+{c:04X} {unicodedata.name(chr(c), '?')}: lmcc {o} | BertTokenizerFast {t}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
