#!/usr/bin/env python3
"""The coefficients of the generated GELU (codegen/LmToLoops/Elementwise.cpp, emitActivation "gelu").

x Phi(x) = x s / 2 with s = 2 - e (x > 0) or e (x <= 0), e = erfc(|x| / sqrt 2) = exp(a R(a)), a = min(|x|, 5.54):
R is the least-squares fit of degree 10 of log(erfc(a / sqrt 2)) / a on 1500 Chebyshev nodes of [0, 5.54]. Prints
R's coefficients (constant first, as float32) and the error of the float32 evaluation (Horner with FMA, exp
correctly rounded) against x Phi(x) in double on [-8, 8]; tests/unit/ActivationTest.cpp measures the generated code.
Needs numpy (pip install numpy); not part of the build.
"""
import math

import numpy as np

f32, f64 = np.float32, np.float64
LAST, DEGREE, NODES = 5.54, 10, 1500


def fit():
    k = np.arange(NODES)
    a = LAST / 2 + LAST / 2 * np.cos((2 * k + 1) * np.pi / (2 * NODES))
    y = np.array([math.log(math.erfc(v / math.sqrt(2))) for v in a])
    basis = np.vander(a, DEGREE + 2, increasing=True)[:, 1:]  # a, a^2, ...: e = 1 at a = 0
    return np.linalg.lstsq(basis, y, rcond=None)[0].astype(f32)


def gelu32(x, r):
    fma = lambda p, q, s: (p.astype(f64) * q.astype(f64) + s.astype(f64)).astype(f32)
    a = np.minimum(np.abs(x), f32(LAST))
    acc = np.full_like(x, r[-1])
    for c in r[-2::-1]:
        acc = fma(acc, a, np.full_like(x, c))
    e = np.exp((a * acc).astype(f32).astype(f64)).astype(f32)
    e = np.where(np.abs(x) < LAST, e, f32(0))
    s = np.where(x > 0, (f32(2) - e).astype(f32), e)
    return ((f32(0.5) * x).astype(f32) * s).astype(f32)


def main():
    r = fit()
    print("R:", ", ".join("%.9gf" % c for c in r))
    x = np.linspace(-8, 8, 400001).astype(f32)
    want = np.array([0.5 * float(v) * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    ulp = np.maximum(np.spacing(np.abs(want).astype(f32)).astype(f64), 1e-45)
    err = np.abs(gelu32(x, r).astype(f64) - want) / ulp
    for name, m in (("x >= 0", x >= 0), ("-2 < x < 0", (x < 0) & (x > -2)), ("-5.5 < x <= -2", (x <= -2) & (x > -5.5))):
        print("max error %s: %.2f ulp" % (name, err[m].max()))


if __name__ == "__main__":
    main()
