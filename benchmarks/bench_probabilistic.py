"""Probabilistic eviction micro-benchmarks (issue 7), each as a ratio against a baseline of the same run.

1. Algorithm 2 (exponential + binary search, O(n log m)) against a linear scan over m (O(n m)).
2. ``ragged_decode`` with the per-entry correction bias against the same call without bias.

Usage: .venv/bin/python benchmarks/bench_probabilistic.py [--n 4096] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from forcedweight.kernels import ragged_decode
from forcedweight.probabilistic import correction_bias, expected_unique, sample, sample_count


def best_of(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def linear_scan(pi, j):
    m, best, best_err = 1, 1, abs(expected_unique(pi, 1) - j)
    while True:
        m += 1
        e = expected_unique(pi, m)
        if abs(e - j) < best_err:
            best, best_err = m, abs(e - j)
        if e >= j:
            return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    n = a.n
    pi = 0.9 * rng.dirichlet(np.full(n, 0.5)) + 0.1 / n
    j = 0.5 * n
    m = sample_count(pi, j)
    assert m == linear_scan(pi, j)
    t_alg = best_of(lambda: sample_count(pi, j), a.repeat)
    t_lin = best_of(lambda: linear_scan(pi, j), 1)
    print(f"Algorithm 2, n={n}, j*={j:g}: m={m}; {t_alg * 1e3:.2f} ms vs linear scan {t_lin * 1e3:.1f} ms "
          f"-> {t_lin / t_alg:.0f}x faster")

    B, Hkv, G, D = 4, 3, 3, 64
    kept, counts = sample(pi, m, rng)
    T = B * Hkv * kept.size
    q = torch.randn(B, Hkv * G, D)
    k, v = torch.randn(T, D), torch.randn(T, D)
    indptr = torch.arange(0, T + 1, kept.size, dtype=torch.int64)
    bias = torch.tensor(np.tile(correction_bias(counts, pi[kept], m), B * Hkv), dtype=torch.float32)
    t_plain, t_bias = float("inf"), float("inf")
    for _ in range(a.repeat):  # interleaved, so both see the same machine load
        t_plain = min(t_plain, best_of(lambda: ragged_decode(q, k, v, indptr), 1))
        t_bias = min(t_bias, best_of(lambda: ragged_decode(q, k, v, indptr, bias=bias), 1))
    print(f"ragged_decode (CPU path) B={B} Hkv={Hkv} G={G} D={D}, {kept.size} kept entries/segment: "
          f"with bias {t_bias * 1e3:.2f} ms vs without {t_plain * 1e3:.2f} ms -> {t_bias / t_plain:.2f}x")



if __name__ == "__main__":
    main()
