"""A two-minute tour: the forms of attention agree, and how their time grows with N.

Run as ``python -m linattn demo``. Prints plain text; the plots come from ``linattn.figures``.
"""
import time

import numpy as np

from . import linear_attention, softmax_attention

METHODS = ("quadratic", "linear", "chunked", "recurrent")


def agreement(seed=0, n=37, d=8, m=8):
    """Largest difference of each method from the quadratic oracle, causal and not."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, n, w)) for w in (d, d, m))
    rows = []
    for causal in (False, True):
        want = linear_attention(q, k, v, causal=causal, method="quadratic")
        for method in METHODS[1:]:
            got = linear_attention(q, k, v, causal=causal, method=method, chunk_size=16)
            rows.append((causal, method, float(np.max(np.abs(got - want)))))
    return rows


def median_seconds(f, repeats=3):
    """Median wall time of ``f()`` over ``repeats`` calls after one warm-up call."""
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def scaling(ns=(256, 512, 1024, 2048, 4096), heads=4, d=32):
    """Causal forward time of softmax and chunked linear attention for each N."""
    rng = np.random.default_rng(1)
    rows = []
    for n in ns:
        q, k, v = rng.standard_normal((3, heads, n, d)).astype(np.float32)
        soft = median_seconds(lambda: softmax_attention(q, k, v, causal=True))
        lin = median_seconds(lambda: linear_attention(q, k, v, causal=True, method="chunked"))
        rows.append((n, soft, lin))
    return rows


def main(argv=None):
    print("max |method - quadratic oracle|, float64, N=37, chunk 16:")
    for causal, method, err in agreement():
        print(f"  causal={causal!s:5}  {method:9}  {err:.1e}")
    print("\ncausal forward, float32, 4 heads, D=M=32 (median of 3):")
    print(f"  {'N':>6}  {'softmax ms':>10}  {'linear ms':>10}")
    for n, soft, lin in scaling():
        print(f"  {n:>6}  {1e3 * soft:>10.2f}  {1e3 * lin:>10.2f}")
    print("softmax time grows ~4x per doubling of N, linear ~2x.")
