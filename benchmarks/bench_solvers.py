"""Share of rows proved optimal within a time limit, and median solve time: bnb vs SCIP.

    .venv/bin/python benchmarks/bench_solvers.py [--n 64,256,1024] [--rows 4] [--time-limit 2] [--s 8]
    .venv/bin/python benchmarks/bench_solvers.py --real DUMP_DIR [--n 64,256] [--rows 10]

Synthetic rows: softmax of N(0, sigma^2) logits with Gaussian values (d = 64); "peaked"
sigma = 3, "flat" sigma = 0.5. ``--real``: rows of a ``forcedweight dump`` whose N lies within
[0.8 n, n] for each n (the first ``--rows`` of them). Both solvers get the same warm start, the
pool optimum (``candidate_pool`` + ``enumerate_best``), as ``forcedweight certify`` gives them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from forcedweight.enumerate import candidate_pool, enumerate_best
from forcedweight.solvers.bnb import solve_bnb
from forcedweight.solvers.scip import solve_scip

KINDS = {"peaked": 3.0, "flat": 0.5}


def make_row(n, sigma, d, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n) * sigma
    p = np.exp(z - z.max())
    return p / p.sum(), rng.normal(size=(n, d))


def real_rows(path, n, k, s):
    from forcedweight.rows import Row, iter_rows

    out = []
    for r in iter_rows(path, skip_invalid=True):
        if isinstance(r, Row) and 0.8 * n <= r.n_keys <= n and r.n_keys > s:
            out.append((r.p, r.V))
            if len(out) == k:
                break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=str, default="64,256,1024")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=2.0)
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--solvers", type=str, default="bnb,scip")
    ap.add_argument("--real", type=str, default=None, help="a dump directory of real rows")
    args = ap.parse_args()
    solvers = {"bnb": solve_bnb, "scip": solve_scip}
    names = [x for x in args.solvers.split(",") if x]
    p, V = make_row(16, 1.0, 4, 0)
    solve_bnb(p, V, 3)  # load the Numba cache before timing
    enumerate_best(p, V, np.arange(16), 3)
    rows_desc = f"real rows from {args.real}" if args.real else f"d = {args.d}, synthetic"
    print(f"s = {args.s}, {rows_desc}, up to {args.rows} rows per cell, "
          f"time limit {args.time_limit} s\n")
    print("| N | kind | solver | proved | median s (proved) | median s (all) | "
          "improved on pool | median gap unsolved |")
    print("|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.n.split(",")]:
        for kind, sigma in KINDS.items() if args.real is None else [("real", None)]:
            if args.real is None:
                data = [make_row(n, sigma, args.d, 1000 * n + i) for i in range(args.rows)]
            else:
                data = real_rows(args.real, n, args.rows, args.s)
                if not data:
                    continue
            starts = []
            for p, V in data:
                pool = candidate_pool(p, V, args.s)
                starts.append(enumerate_best(p, V, pool, args.s))
            for name in names:
                proved, secs, secs_ok, better, gaps = 0, [], [], 0, []
                for (p, V), (v0, S0) in zip(data, starts):
                    t = time.perf_counter()
                    r = solvers[name](p, V, args.s, incumbent=S0, time_limit=args.time_limit)
                    dt = time.perf_counter() - t
                    secs.append(dt)
                    if r.proved:
                        proved += 1
                        secs_ok.append(dt)
                    else:
                        gaps.append(1 - r.lower_bound / r.value)
                    better += r.value < v0 * (1 - 1e-9)
                med_ok = f"{np.median(secs_ok):.3g}" if secs_ok else "-"
                gap = f"{np.median(gaps):.3g}" if gaps else "-"
                print(f"| {n} | {kind} | {name} | {proved}/{len(data)} | {med_ok} | "
                      f"{np.median(secs):.3g} | {better}/{len(data)} | {gap} |", flush=True)


if __name__ == "__main__":
    main()
