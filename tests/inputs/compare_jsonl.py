"""compare_jsonl.py A B TOL: the JSON lines of A and B hold the same keys and numbers within TOL (absolute)."""
import json
import sys

a = [json.loads(line) for line in open(sys.argv[1])]
b = [json.loads(line) for line in open(sys.argv[2])]
tol = float(sys.argv[3])
if len(a) != len(b):
    sys.exit(f"{len(a)} lines vs {len(b)}")
worst = 0.0
for n, (x, y) in enumerate(zip(a, b), 1):
    if sorted(x) != sorted(y):
        sys.exit(f"line {n}: keys {sorted(x)} vs {sorted(y)}")
    for key in x:
        xs = x[key] if isinstance(x[key], list) else [x[key]]
        ys = y[key] if isinstance(y[key], list) else [y[key]]
        if len(xs) != len(ys):
            sys.exit(f"line {n}: {key} has {len(xs)} values vs {len(ys)}")
        for i, (p, q) in enumerate(zip(xs, ys)):
            worst = max(worst, abs(p - q))
            if abs(p - q) > tol:
                sys.exit(f"line {n}: {key}[{i}] = {p} vs {q}")
print(f"{len(a)} lines agree, max abs difference {worst:.3g}")
