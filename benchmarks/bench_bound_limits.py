"""Why an open row's bound stays 0: what convex relaxations can and cannot prove on its first-level nodes.

    .venv/bin/python benchmarks/bench_bound_limits.py --real DUMP --rows 21,47,65 [--s 8]
        [--node-limit 100000] [--steps 3,10,30] [--sample 20]

For each row (``row_id``s of a ``forcedweight dump``): a search of ``--node-limit`` nodes from the pool
optimum (deterministic; the bound phase off), whose open frontier holds every first-level node ``{k}`` from
``k_open`` (its level-0 count) on. Then, over those nodes (keys in the search order, ``search_row.search_order``):

- ``kz``: the first node, from the last key down, that the first-level pass of the bound
  (``frontier._first_level_vals``: the node tests and the quick relaxation) leaves at 0;
- the *tail* from ``k_open``, i.e. all the open first-level nodes under one relaxation (FISTA, 600 steps
  and 3 re-aimed phases; and the LP direction, ``lp_bound.tail_bound``): 0 when some fractional point of
  the tail's capped simplex cancels exactly;
- on ``--sample`` nodes evenly spaced in ``[k_open, kz]``: whether the node has a *cancelling point*
  (``x in [0, 1]``, ``sum x = s - 1``, ``a_k + sum x_j a_j = 0``: an LP feasibility problem, HiGHS;
  when it has one, no convex relaxation of the node proves a bound > 0), and its full relaxation bound
  (``bounds.relax_bound``, 150 steps and one re-aimed phase, as the search's full bound) with its time;
- a warm-started sweep of the same relaxation over every node from ``kz`` down to ``k_open`` (each node's
  FISTA starts from the previous node's point, the Lipschitz constant kept up to date incrementally; the
  bound of each node is ``bounds._bound_along``, a proof) at ``--steps`` steps per node: how many nodes it
  leaves at 0, and its seconds. (The sweep is an experiment: the solver does not use it.)

Everything on one thread (``NUMBA_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit
from scipy.optimize import linprog

from forcedweight.certify.pool import pool_optimum
from forcedweight.certify.solvers import bnb
from forcedweight.certify.solvers.bounds import RELAX_ITERS, _bound_along, _project_capped, relax_bound
from forcedweight.certify.solvers.frontier import _first_level_vals
from forcedweight.certify.solvers.lp_bound import tail_bound
from forcedweight.certify.solvers.search_row import contributions, prepare
from forcedweight.certify.warmup import warm_up
from forcedweight.rows import rows_by_id


def has_cancelling_point(A, k: int, r: int) -> bool:
    """Whether some x in [0, 1]^(N-k-1), sum x = r, has a_k + sum_j x_j a_{k+1+j} = 0 (HiGHS, feasibility)."""
    R = A[k + 1:]
    scale = float(np.abs(R).max())
    res = linprog(np.zeros(R.shape[0]), A_eq=np.vstack([R.T / scale, np.ones((1, R.shape[0]))]),
                  b_eq=np.concatenate([-A[k] / scale, [float(r)]]), bounds=[(0.0, 1.0)] * R.shape[0], method="highs")
    return res.status == 0


@njit(cache=True)
def _point(A, k, lo, x, y):
    """y (d,) = a_k + sum_{j >= lo} x_j a_j: the relaxation's point for the node {k} at weights x."""
    N, d = A.shape
    for q in range(d):
        y[q] = A[k, q]
    for j in range(lo, N):
        if x[j] != 0.0:
            for q in range(d):
                y[q] += x[j] * A[j, q]


@njit(cache=True)
def relax_sweep(A, pw, nrm, k_from, k_to, s, top, steps, vals):
    """vals[k], k = k_to down to k_from: the relaxation bound of the first-level node {k} after ``steps``
    FISTA steps started from the previous node's point (proved along the direction reached)."""
    N, d = A.shape
    r = s - 1
    x = np.zeros(N)
    M = np.zeros((d, d))  # A[k+1:]^T A[k+1:], kept up to date as k falls
    for j in range(k_to + 1, N):
        for a in range(d):
            for b in range(d):
                M[a, b] += A[j, a] * A[j, b]
    for j in range(k_to + 1, N):
        x[j] = r / (N - k_to - 1)
    pv = np.ones(d) / np.sqrt(d)
    y = np.empty(d)
    xn = np.empty(N)
    z = np.empty(N)
    v = np.empty(N)
    for k in range(k_to, k_from - 1, -1):
        if k < k_to:  # key k + 1 (the previous node's own) becomes free, at 0
            x[k + 1] = 0.0
            for a in range(d):
                for b in range(d):
                    M[a, b] += A[k + 1, a] * A[k + 1, b]
        lam = 0.0
        for _ in range(6):  # power iteration, warm
            w = M @ pv
            lam = np.sqrt(np.sum(w * w))
            pv = w / lam
        tr = 0.0
        for a in range(d):
            tr += M[a, a]
        L = min(1.1 * lam, tr) + 1e-300
        lo = k + 1
        m = N - lo
        for j in range(lo, N):
            z[j] = x[j]
        tk = 1.0
        for _ in range(steps):
            _point(A, k, lo, z, y)
            for j in range(lo, N):
                g = 0.0
                for q in range(d):
                    g += A[j, q] * y[q]
                v[j - lo] = z[j] - g / L
            _project_capped(v[:m], r, xn[:m])
            tn = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * tk * tk))
            c = (tk - 1.0) / tn
            for j in range(lo, N):
                xo = x[j]
                x[j] = xn[j - lo]
                z[j] = x[j] + c * (x[j] - xo)
            tk = tn
        _point(A, k, lo, x, y)
        vals[k] = _bound_along(y.copy(), A[k].copy(), pw[k], A, pw, nrm, lo, r, top)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", required=True, help="a dump directory")
    ap.add_argument("--rows", required=True, help="row_ids, comma-separated")
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--node-limit", type=int, default=100_000)
    ap.add_argument("--steps", default="3,10,30")
    ap.add_argument("--sample", type=int, default=20)
    a = ap.parse_args()
    ids = [int(x) for x in a.rows.split(",")]
    steps = [int(x) for x in a.steps.split(",")]
    warm_up()
    rng = np.random.default_rng(0)  # compile the sweep before any clock starts
    Aw = rng.normal(size=(30, 4))
    relax_sweep(Aw, np.full(30, 1 / 30), np.sqrt((Aw * Aw).sum(1)), 10, 20, 3, 1.0, 2, np.zeros(30))
    rows = rows_by_id(a.real, set(ids))
    s = a.s
    print("| row | layer | N | value | k_open | kz | tail: FISTA / LP | sample: cancelling | sample: full relaxation > 0, "
          "median s/node, min/value | " + " | ".join(f"sweep {t} steps: at 0, s" for t in steps) + " |")
    print("|" + "---|" * (9 + len(steps)))
    for rid in ids:
        r = rows[rid]
        p, V = r.p, r.V
        best = pool_optimum(p, V, s)[2]
        res = bnb.solve_bnb(p, V, s, incumbent=best, node_limit=a.node_limit, time_limit=1e9, refine_work=0,
                            tail_lps=0, relax_iters=0)
        value = float(res.value)
        p, V, A_keys = contributions(p, V, s)
        A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A_keys, p, s)[:10]
        N = A.shape[0]
        k_open = int(res.info["level_nodes"][0])
        vals = np.full(N, np.inf)
        fstate = np.zeros(N, np.int64)
        out = np.zeros(1, np.int64)
        _first_level_vals(A, pw, wtop, nrm, G, lo, hi, use_box, s, k_open, value, gamma, bnb.BOUND_ITERS, RELAX_ITERS,
                          vals, fstate, N, np.inf, 1e-300, out)
        kz = int(out[0])
        zero = np.zeros(A.shape[1])
        t_fista = relax_bound(zero, 0.0, A, pw, nrm, k_open, s, value, 600, 3)
        t_lp = tail_bound(A, pw, nrm, k_open, s, value)
        if kz < 0:
            print(f"| {rid} | {r.extra.get('layer')} | {N} | {value:.4g} | {k_open} | – (pass > 0) | {t_fista:.3g} / {t_lp:.3g} |"
                  + " – |" * (2 + len(steps)))
            continue
        sample = np.unique(np.linspace(k_open, kz, a.sample).astype(np.int64))
        canc = sum(has_cancelling_point(A, int(k), s - 1) for k in sample)
        full, secs = [], []
        for k in sample:
            k = int(k)
            t0 = time.perf_counter()
            full.append(relax_bound(A[k].copy(), float(pw[k]), A, pw, nrm, k + 1, s - 1, value, RELAX_ITERS, 1))
            secs.append(time.perf_counter() - t0)
        full = np.array(full)
        cells = []
        for t in steps:
            sv = np.full(N, np.nan)
            t0 = time.perf_counter()
            relax_sweep(A, pw, nrm, k_open, kz, s, value, t, sv)
            cells.append(f"{int(np.sum(sv[k_open:kz + 1] <= 0.0))}/{kz - k_open + 1}, {time.perf_counter() - t0:.1f}")
        print(f"| {rid} | {r.extra.get('layer')} | {N} | {value:.4g} | {k_open} | {kz} | {t_fista:.3g} / {t_lp:.3g} | "
              f"{canc}/{sample.size} | {int(np.sum(full > 0))}/{sample.size}, {np.median(secs):.2f}, {full.min() / value:.3g} | "
              + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
