"""Enumeration speed: Numba Gram enumeration vs the vectorised NumPy brute force, same rows.

    .venv/bin/python benchmarks/bench_enumerate.py [--pool 24] [--d 64] [--s 8] [--rows 3]

Rows have N = pool keys (so the brute force over all N keys and the enumeration over the pool
scan the same C(pool, s) subsets). Two NumPy baselines: ``brute_force_best`` (column-wise
gathers, ``(chunk, d)`` temporaries) and the textbook ``A[C].sum(axis=1)``. Per-core figures use ``numba.set_num_threads(1)``; the
all-threads figure uses every Numba thread. Timings are the best of ``--repeat`` runs (the
machine may be shared). ``--extra`` pools are timed for the enumeration alone.
"""

from __future__ import annotations

import argparse
import math
import time
from itertools import combinations

import numba
import numpy as np

from forcedweight.core import operator as op
from forcedweight.certify.enumerate import brute_force_best, enumerate_best


def make_rows(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        z = rng.normal(size=n)
        p = np.exp(z - z.max())
        out.append((p / p.sum(), rng.normal(size=(n, d))))
    return out


def naive_numpy(p, V, s, chunk=8192):
    """The textbook vectorisation: all index tuples, then ``A[C].sum(axis=1)`` (3-D gather)."""
    A = op.centred_contributions(p, V)
    C = np.array(list(combinations(range(p.shape[0]), s)), dtype=np.int64)
    best = np.inf
    for i in range(0, C.shape[0], chunk):
        c = C[i : i + chunk]
        E = np.linalg.norm(A[c].sum(axis=1), axis=1) / p[c].sum(axis=1)
        best = min(best, E.min())
    return best


def time_enum(rows, s, threads, repeat):
    numba.set_num_threads(threads)
    best = []
    for p, V in rows:
        ts = []
        for _ in range(repeat):
            t = time.perf_counter()
            enumerate_best(p, V, np.arange(p.shape[0]), s)
            ts.append(time.perf_counter() - t)
        best.append(min(ts))
    return sum(best)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=24)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--extra", type=str, default="28,32", help="pools timed without baseline")
    args = ap.parse_args()
    all_threads = numba.config.NUMBA_NUM_THREADS
    rows = make_rows(args.pool, args.d, args.rows)
    n_sub = math.comb(args.pool, args.s) * len(rows)
    enumerate_best(*rows[0], np.arange(args.pool), args.s)  # compile / load the cache
    for p, V in rows:  # same minimum as the brute force (checked on every row)
        v1, _ = enumerate_best(p, V, np.arange(args.pool), args.s)
        v2, _ = brute_force_best(p, V, args.s)
        assert abs(v1 - v2) <= 1e-12 * v2, (v1, v2)
    t = time.perf_counter()
    for p, V in rows:
        brute_force_best(p, V, args.s)
    t_np = time.perf_counter() - t
    t = time.perf_counter()
    for p, V in rows:
        naive_numpy(p, V, args.s)
    t_naive = time.perf_counter() - t
    t1 = time_enum(rows, args.s, 1, args.repeat)
    tn = time_enum(rows, args.s, all_threads, args.repeat)
    print(f"pool {args.pool}, d {args.d}, s {args.s}: {len(rows)} rows x "
          f"{math.comb(args.pool, args.s)} subsets\n")
    print("| method | threads | subsets/s | per core | vs NumPy brute force | vs naive NumPy |")
    print("|---|---|---|---|---|---|")
    base = n_sub / t_np
    print(f"| NumPy brute force (`brute_force_best`) | 1 | {base:.3g} | {base:.3g} | 1x | "
          f"{t_naive / t_np:.1f}x |")
    print(f"| naive NumPy `A[C].sum(1)` | 1 | {n_sub / t_naive:.3g} | {n_sub / t_naive:.3g} | "
          f"{t_np / t_naive:.2f}x | 1x |")
    print(f"| Numba enumeration | 1 | {n_sub / t1:.3g} | {n_sub / t1:.3g} | {t_np / t1:.0f}x | "
          f"{t_naive / t1:.0f}x |")
    print(f"| Numba enumeration | {all_threads} | {n_sub / tn:.3g} | {n_sub / tn / all_threads:.3g} "
          f"| {t_np / tn:.0f}x | {t_naive / tn:.0f}x |")
    for pool in [int(x) for x in args.extra.split(",") if x]:
        rows2 = make_rows(pool, args.d, 1, seed=1)
        m = math.comb(pool, args.s)
        r1 = m / time_enum(rows2, args.s, 1, 3)
        rn = m / time_enum(rows2, args.s, all_threads, 3)
        print(f"| Numba enumeration, pool {pool} ({m} subsets) | 1 / {all_threads} | {r1:.3g} / "
              f"{rn:.3g} | {r1:.3g} | - | - |")
    numba.set_num_threads(all_threads)


if __name__ == "__main__":
    main()
