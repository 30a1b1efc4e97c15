"""Soak check of the exact solvers against the brute force on random adversarial rows (a longer run than the tests).

    .venv/bin/python benchmarks/soak_exact.py [--cases 2000] [--seed 0]

Each case draws a row of 14-40 keys (or 40-90 keys at s <= 4, or s near N) whose values are Gaussian, copies of a few
value rows (as at layer 0), rank 2, small integers or scaled by 1e-8..1e8, and whose masses are a softmax, equal,
a few heavy, a third ~1e-30 of the rest, or keys whose value is the row's mean; then compares with
``brute_force_best``: ``solve_bnb`` (one or two threads, with or without key exclusion, the long rows' warm-started
tests on or off, sometimes node-limited: then only its bound and value are checked), ``root_bound`` and the
pool-restricted search (``pool.bnb_in_pool``) against ``enumerate_best`` on a random pool. Prints one line per
disagreement and a count every 200 cases; exits 1 if any.
"""

from __future__ import annotations

import argparse
import sys
import time
from math import comb

import numpy as np

from forcedweight.certify.enumerate import brute_force_best, enumerate_best
from forcedweight.certify.pool import bnb_in_pool
from forcedweight.certify.solvers import node_tests as nt
from forcedweight.certify.solvers.bnb import REL_TOL, root_bound, solve_bnb
from forcedweight.core import operator as op

EPS = np.finfo(float).eps
KINDS = ("gauss", "copies", "lowrank", "int", "scaled", "equalp", "tiny", "heavy", "zero")


def make_case(seed: int):
    """(kind, p, V, s) of case ``seed``."""
    rng = np.random.default_rng(seed)
    mode = seed % 3
    n = int(rng.integers(40, 90)) if mode == 0 else int(rng.integers(14, 41))
    d = int(rng.choice([1, 2, 3, 4, 8, 16, 64]))
    kind = str(rng.choice(KINDS))
    z = rng.normal(size=n) * rng.choice([0.2, 1.0, 3.0])
    p = np.exp(z - z.max())
    V = rng.normal(size=(n, d))
    if kind == "copies":
        U = rng.normal(size=(int(rng.integers(2, max(3, n // 3))), d))
        V = U[rng.integers(0, len(U), n)]
    elif kind == "lowrank":
        V = rng.normal(size=(n, 2)) @ rng.normal(size=(2, d))
    elif kind == "int":
        V = rng.integers(-3, 4, size=(n, d)).astype(float)
    elif kind == "scaled":
        V = V * 10.0 ** int(rng.integers(-8, 9))
    elif kind == "equalp":
        p = np.ones(n)
    elif kind == "tiny":
        p[rng.integers(0, n, size=n // 3)] *= 1e-30
    elif kind == "heavy":
        p[:3] *= 1e6
    elif kind == "zero":
        V[rng.integers(0, n, size=n // 4)] = (p / p.sum()) @ V
    p = p / p.sum()
    s = int(rng.integers(2, 5)) if mode == 0 else (int(rng.integers(max(1, n - 4), n)) if mode == 1
                                                    else int(rng.integers(2, 7)))
    while comb(n, s) > 3e5:  # (only the small-s modes get here: s <= 6 <= n / 2)
        s -= 1
    return kind, p, V, s, rng


def check_case(seed: int) -> list:
    """The disagreements of case ``seed`` (empty when none)."""
    kind, p, V, s, rng = make_case(seed)
    n, d = V.shape
    ref, _ = brute_force_best(p, V, s)
    # what float64 rounding of E allows between two evaluations (as tests/certify/test_bounds.py's _ceil)
    slack = 16 * (n + d) * EPS * float(np.abs(p[:, None] * V).sum() + np.abs(V).max()) / np.sort(p)[:s].sum()
    long_rows = bool(rng.integers(0, 2))
    threads = int(rng.choice([1, 2]))
    exclude = bool(rng.integers(0, 4) > 0)
    node_limit = None if rng.integers(0, 3) else int(rng.integers(1, 200))
    bad = []
    saved = nt.LONG_ROWS
    nt.LONG_ROWS = 10 if long_rows else saved  # every row a long row: warm-started tests, 16 steps
    try:
        res = solve_bnb(p, V, s, time_limit=120, threads=threads if node_limit is None else 1, exclude=exclude,
                        node_limit=node_limit, bound_time=5.0)
        if res.value != op.forced_error(p, V, res.best_set):
            bad.append("value is not E of its set")
        if res.value < ref - slack - 1e-13:
            bad.append(f"value {res.value} below the optimum {ref}")
        if res.proved and res.value > ref * (1 + 2 * REL_TOL) + slack + 1e-13:
            bad.append(f"proved {res.value} above the optimum {ref}")
        if res.lower_bound > ref * (1 + 1e-12) + slack:
            bad.append(f"lower bound {res.lower_bound} above the optimum {ref}")
        if node_limit is None and not res.proved:
            bad.append("not proved without a limit")
        rb = root_bound(p, V, s, refine_work=float(rng.choice([0.0, 1e5])))
        if rb > ref * (1 + 1e-12) + slack:
            bad.append(f"root bound {rb} above the optimum {ref}")
        if s < n:
            pool = np.sort(rng.choice(n, size=int(rng.integers(s, n + 1)), replace=False))
            ev, _ = enumerate_best(p, V, pool, s)
            proved, pv, pb = bnb_in_pool(p, V, pool, s, 10**7)
            if not proved or abs(pv - ev) > 2 * REL_TOL * ev + slack + 1e-13 or not np.isin(pb, pool).all():
                bad.append(f"pool search {proved} {pv} against the enumeration {ev}")
    except Exception as e:  # noqa: BLE001 (a soak reports every failure and goes on)
        bad.append("raised " + repr(e)[:200])
    finally:
        nt.LONG_ROWS = saved
    return [f"case {seed} ({kind}, N = {n}, d = {d}, s = {s}, long rows {long_rows}, threads {threads}, "
            f"exclude {exclude}, node limit {node_limit}): {b}" for b in bad]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    fails = 0
    for c in range(args.cases):
        lines = check_case(args.seed + c)
        fails += bool(lines)
        for line in lines:
            print(line, flush=True)
        if (c + 1) % 200 == 0:
            print(f"{c + 1} cases, {fails} with a disagreement, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{args.cases} cases from seed {args.seed}: {fails} with a disagreement, {time.perf_counter() - t0:.0f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
