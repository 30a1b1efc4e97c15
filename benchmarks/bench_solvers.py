"""Share of rows proved optimal within a time limit, and median solve time: bnb vs SCIP.

    .venv/bin/python benchmarks/bench_solvers.py [--n 64,256,1024] [--rows 4] [--time-limit 2] [--s 8]
    .venv/bin/python benchmarks/bench_solvers.py --real DUMP_DIR [--n 64,256,1024] [--rows 20]
        [--rows-scip 10] [--seed 0] [--csv per_row.csv] [--node-limit K] [--relax-iters R]
        [--refine-work W] [--kick-work K] [--threads T]

Synthetic rows: softmax of N(0, sigma^2) logits with Gaussian values (d = 64); "peaked"
sigma = 3, "flat" sigma = 0.5. ``--real``: rows of a ``forcedweight dump`` whose N lies within
[0.8 n, n] for each n, a random sample (``--seed``) of ``--rows`` of them (SCIP gets the first
``--rows-scip`` of that sample). Both solvers get the same warm start, the pool optimum
(``pool.pool_optimum``: enumeration, or the pool-restricted bnb at s = 32, and its unproved set
when better), as ``forcedweight certify`` gives them. Every Numba kernel is compiled first
(``certify.warmup.warm_up``). "gap" = (value − lower_bound) / value of the open rows; "open lb>0" =
open rows whose proved lower bound is above 0; "rows/s" = rows over the seconds of the pool optimum
and the solver together (one process).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from forcedweight.certify.pool import pool_optimum
from forcedweight.certify.solvers.bnb import solve_bnb
from forcedweight.certify.solvers.scip import solve_scip
from forcedweight.certify.warmup import warm_up
from forcedweight.core import operator as op

KINDS = {"peaked": 3.0, "flat": 0.5}


def make_row(n, sigma, d, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n) * sigma
    p = np.exp(z - z.max())
    return p / p.sum(), rng.normal(size=(n, d))


def real_rows(path, ns, k, s, seed):
    """{n: [(p, V, row_id, layer), ...]}: a seeded random sample of k rows with N in [0.8 n, n]."""
    from forcedweight.rows import Row, iter_rows

    ids = {n: [] for n in ns}
    for i, r in enumerate(iter_rows(path, skip_invalid=True)):
        if isinstance(r, Row):
            for n in ns:
                if 0.8 * n <= r.n_keys <= n and r.n_keys > s:
                    ids[n].append(i)
    rng = np.random.default_rng(seed)
    pick = {n: set(rng.permutation(v)[:k].tolist()) for n, v in ids.items()}
    out = {n: [] for n in ns}
    for i, r in enumerate(iter_rows(path, skip_invalid=True)):
        for n in ns:
            if i in pick[n]:
                out[n].append((r.p, r.V, getattr(r, "row_id", i), r.extra.get("layer", -1)))
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
    ap.add_argument("--rows-scip", type=int, default=None, help="rows per cell for SCIP")
    ap.add_argument("--seed", type=int, default=0, help="seed of the real-row sample")
    ap.add_argument("--csv", type=str, default=None, help="write per-row results here")
    ap.add_argument("--node-limit", type=int, default=None, help="bnb node limit (deterministic stop)")
    ap.add_argument("--relax-iters", type=int, default=None,
                    help="bnb relaxation-bound FISTA steps on open nodes (0 = off; default: the solver's)")
    ap.add_argument("--refine-work", type=float, default=None,
                    help="bnb key-steps of best-first refinement of the open frontier's bound (0 = off)")
    ap.add_argument("--kick-work", type=float, default=None,
                    help="bnb pair evaluations of the kick search on the incumbent (0 = off)")
    ap.add_argument("--threads", type=int, default=1,
                    help="bnb search threads per row (rows still run one at a time; 1 = the serial search)")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    real = real_rows(args.real, ns, args.rows, args.s, args.seed) if args.real else None
    per_row = []
    solvers = {"bnb": solve_bnb, "scip": solve_scip}
    names = [x for x in args.solvers.split(",") if x]
    warm_up()  # compile / load every kernel before timing
    rows_desc = f"real rows from {args.real}" if args.real else f"d = {args.d}, synthetic"
    print(f"s = {args.s}, {rows_desc}, up to {args.rows} rows per cell, "
          f"time limit {args.time_limit} s\n")
    print("| N | kind | solver | proved | median s (proved) | median s (all) | rows/s | "
          "improved on pool | median gap open | open lb>0 | pool size (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        for kind, sigma in KINDS.items() if args.real is None else [("real", None)]:
            if args.real is None:
                data = [make_row(n, sigma, args.d, 1000 * n + i) for i in range(args.rows)]
                rids = list(range(len(data)))
                layers = [-1] * len(data)
            else:
                data = [(p, V) for p, V, _, _ in real[n]]
                rids = [rid for _, _, rid, _ in real[n]]
                layers = [layer for _, _, _, layer in real[n]]
                if not data:
                    continue
            starts, psize, psecs = [], [], []
            for p, V in data:
                t = time.perf_counter()
                pool, v0, S0, extra = pool_optimum(p, V, args.s)
                psecs.append(time.perf_counter() - t)
                if extra is not None:
                    v0, S0 = op.forced_error(p, V, extra), extra
                starts.append((v0, S0))
                psize.append(pool.size)
            for name in names:
                proved, secs, secs_ok, better, gaps, pos = 0, [], [], 0, [], 0
                k = len(data) if name != "scip" or args.rows_scip is None else args.rows_scip
                for (p, V), (v0, S0), rid, layer, ps in list(zip(data, starts, rids, layers, psecs))[:k]:
                    t = time.perf_counter()
                    kw = {"node_limit": args.node_limit} if name == "bnb" and args.node_limit else {}
                    if name == "bnb" and args.relax_iters is not None:
                        kw["relax_iters"] = args.relax_iters
                    if name == "bnb" and args.refine_work is not None:
                        kw["refine_work"] = args.refine_work
                    if name == "bnb" and args.kick_work is not None:
                        kw["kick_work"] = args.kick_work
                    if name == "bnb" and args.threads > 1:
                        kw["threads"] = args.threads
                    r = solvers[name](p, V, args.s, incumbent=S0, time_limit=args.time_limit, **kw)
                    dt = time.perf_counter() - t
                    secs.append(dt)
                    if r.proved:
                        proved += 1
                        secs_ok.append(dt)
                    else:
                        gaps.append(1 - r.lower_bound / r.value)
                        pos += r.lower_bound > 0
                    better += r.value < v0 * (1 - 1e-9)
                    per_row.append(dict(n=n, kind=kind, solver=name, row_id=str(rid), layer=layer,
                                        n_keys=len(p), s=args.s, proved=r.proved, seconds=dt, pool_seconds=ps,
                                        value=r.value, lower_bound=r.lower_bound, pool=v0,
                                        nodes=r.info.get("nodes", -1) if r.info else -1))
                k = len(secs)
                med_ok = f"{np.median(secs_ok):.3g}" if secs_ok else "-"
                gap = f"{np.median(gaps):.3g}" if gaps else "-"
                rate = k / (sum(secs) + sum(psecs[:k]))  # rows per second, pool optimum + solver, one process
                print(f"| {n} | {kind} | {name} | {proved}/{k} | {med_ok} | "
                      f"{np.median(secs):.3g} | {rate:.3g} | {better}/{k} | {gap} | {pos}/{len(gaps)} | "
                      f"{int(np.median(psize))} |", flush=True)
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(per_row[0]))
            w.writeheader()
            w.writerows(per_row)


if __name__ == "__main__":
    main()
