"""to_hf.py CANONICAL.safetensors LAYERS OUT.safetensors: rename canonical lmcc tensors to Hugging Face
BertForMaskedLM names, add a zero token-type table (row 0 folds into positions), a longer position table
(cut to max_len on import), and the tensors import ignores (pooler, seq_relationship, position_ids)."""
import json
import struct
import sys

src, layers, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
tensors = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    b, e = info["data_offsets"]
    tensors[name] = (info["shape"], data[b:e])

names = {"embed.token": "bert.embeddings.word_embeddings.weight",
         "embed.position": "bert.embeddings.position_embeddings.weight",
         "embed.norm.weight": "bert.embeddings.LayerNorm.weight",
         "embed.norm.bias": "bert.embeddings.LayerNorm.bias",
         "head.transform.weight": "cls.predictions.transform.dense.weight",
         "head.transform.bias": "cls.predictions.transform.dense.bias",
         "head.norm.weight": "cls.predictions.transform.LayerNorm.weight",
         "head.norm.bias": "cls.predictions.transform.LayerNorm.bias",
         "head.bias": "cls.predictions.bias"}
for i in range(layers):
    p, h = f"layers.{i}.", f"bert.encoder.layer.{i}."
    for ours, theirs in [("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"),
                         ("attn.v", "attention.self.value"), ("attn.o", "attention.output.dense"),
                         ("attn_norm", "attention.output.LayerNorm"), ("ffn.in", "intermediate.dense"),
                         ("ffn.out", "output.dense"), ("ffn_norm", "output.LayerNorm")]:
        for kind in ("weight", "bias"):
            names[p + ours + "." + kind] = h + theirs + "." + kind
out = {}
for name, (shape, blob) in tensors.items():
    out[names[name]] = (shape, blob)
# A longer position table (extra rows are cut on import) and a zero token-type table.
shape, blob = out["bert.embeddings.position_embeddings.weight"]
out["bert.embeddings.position_embeddings.weight"] = ([shape[0] + 3, shape[1]], blob + b"\x11" * (3 * shape[1] * 4))
out["bert.embeddings.token_type_embeddings.weight"] = ([2, shape[1]], b"\0" * (2 * shape[1] * 4))
out["bert.embeddings.position_ids"] = ([1, shape[0] + 3], b"\0" * ((shape[0] + 3) * 4))
out["bert.pooler.dense.weight"] = ([2, 2], b"\0" * 16)
out["cls.seq_relationship.bias"] = ([2], b"\0" * 8)
head, body, offset = {}, b"", 0
for name, (shape, blob) in sorted(out.items()):
    head[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    body += blob
    offset += len(blob)
text = json.dumps(head).encode()
text += b" " * (-len(text) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + body)
