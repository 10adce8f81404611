"""huge_weight.py IN.safetensors TENSOR OUT.safetensors [--row R] [--value V]: a copy of IN (F32) whose TENSOR has
every element (with --row, every element of its row R, one position's embedding say) set to V (default 3e38):
finite, so the weights load, but products with it overflow to inf/NaN."""
import argparse
import json
import struct

parser = argparse.ArgumentParser()
parser.add_argument("src")
parser.add_argument("name")
parser.add_argument("dst")
parser.add_argument("--row", type=int)
parser.add_argument("--value", type=float, default=3e38)
args = parser.parse_args()
raw = bytearray(open(args.src, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
info = json.loads(raw[8:8 + n])[args.name]
assert info["dtype"] == "F32"
begin, end = info["data_offsets"]
if args.row is not None:
    width = 4
    for dim in info["shape"][1:]:
        width *= dim
    assert 0 <= args.row < info["shape"][0]
    begin, end = begin + args.row * width, begin + (args.row + 1) * width
raw[8 + n + begin:8 + n + end] = struct.pack("<f", args.value) * ((end - begin) // 4)
open(args.dst, "wb").write(raw)
