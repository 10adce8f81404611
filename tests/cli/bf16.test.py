"""bf16.test: the largest per-token difference between two `lmcc score` outputs (JSON lines), which must be
positive (the numbers differ) and at most the bound."""
import json
import sys

a = [json.loads(line) for line in open(sys.argv[1])]
b = [json.loads(line) for line in open(sys.argv[2])]
bound = float(sys.argv[3])
assert len(a) == len(b) > 0, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    assert len(x["token_logprobs"]) == len(y["token_logprobs"])
    worst = max([worst] + [abs(u - v) for u, v in zip(x["token_logprobs"], y["token_logprobs"])])
assert 0 < worst <= bound, "max |bf16 - fp32| per token %g, bound %g" % (worst, bound)
print("%d sentences, max |bf16 - fp32| per token %.3g <= %g" % (len(a), worst, bound))
