#!/usr/bin/env python3
"""strip_head.py IN OUT: a canonical safetensors file without the MLM head's tensors (head.*), for the
encoder-only twin of a biLM (eval.sh). Plain Python: the header is JSON, the tensors are byte ranges."""
import json, os, struct, sys

src, dst = sys.argv[1:3]
with open(src, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
out, chunks, offset = {}, [], 0
for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
    if name == "__metadata__":
        out[name] = t
        continue
    if name.startswith("head."):
        continue
    begin, end = t["data_offsets"]
    chunks.append(data[begin:end])
    out[name] = dict(t, data_offsets=[offset, offset + end - begin])
    offset += end - begin
blob = json.dumps(out, separators=(",", ":")).encode()
blob += b" " * (-len(blob) % 8)
with open(dst + ".tmp", "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob + b"".join(chunks))
os.replace(dst + ".tmp", dst)
