"""hf_decoder.py IN.safetensors OUT.safetensors [--perturb]: a copy of a Hugging Face BertForMaskedLM checkpoint
(F32) with cls.predictions.decoder.weight written out as a copy of the word embeddings (as an untied save stores
it); --perturb adds 0.5 to its first element, so that it is no longer the word embeddings."""
import argparse
import json
import struct

parser = argparse.ArgumentParser()
parser.add_argument("src")
parser.add_argument("dst")
parser.add_argument("--perturb", action="store_true")
args = parser.parse_args()
raw = open(args.src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
tensors = {k: v for k, v in header.items() if k != "__metadata__"}
blobs = {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in tensors.items()}
word = next(k for k in tensors if k.endswith("embeddings.word_embeddings.weight"))
assert tensors[word]["dtype"] == "F32"
decoder = bytearray(blobs[word])
if args.perturb:
    decoder[0:4] = struct.pack("<f", struct.unpack("<f", decoder[0:4])[0] + 0.5)
tensors["cls.predictions.decoder.weight"] = dict(tensors[word])
blobs["cls.predictions.decoder.weight"] = bytes(decoder)
out_header, body, offset = {}, b"", 0
if "__metadata__" in header:
    out_header["__metadata__"] = header["__metadata__"]
for k in sorted(tensors):
    out_header[k] = {"dtype": tensors[k]["dtype"], "shape": tensors[k]["shape"],
                     "data_offsets": [offset, offset + len(blobs[k])]}
    body += blobs[k]
    offset += len(blobs[k])
text = json.dumps(out_header).encode()
text += b" " * (-len(text) % 8)
open(args.dst, "wb").write(struct.pack("<Q", len(text)) + text + body)
