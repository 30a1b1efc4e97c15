"""Where a branch and bound's proof spends its nodes and time, by the first key of its sets.

    .venv/bin/python benchmarks/proof_by_first_key.py --real DUMP --row 49 [--s 8] [--incumbent best.npy]
        [--bins 0,50,200,500,1000,2000,3000]

The search of ``solve_bnb`` is independent across its first-level subtrees ``T = {k}`` (k a key's rank in
the search order, ``search_row.search_order``: contribution norms descending), which is how its threads share it
(``solvers.subtrees``). This script runs them one after another on one thread, in that order, each to its
end, from ``--incumbent`` (a saved best set, e.g. the optimum, so the run is the proof alone) or from the
top-mass set (the incumbent then improves as the subtrees find better sets; no polish, kicks or restarts),
and prints, for each range of first keys (``--bins``: the ranges' starts), the nodes and seconds spent there
with the norm ``||a_k||`` and the largest mass from the range's first key on. Until a level-0 node is pruned
(then every later one is too) every first key is a subtree of its own.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", required=True, help="a forcedweight dump (folder or Parquet file)")
    ap.add_argument("--row", type=int, required=True, help="row_id of the row to search")
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--incumbent", default=None, help=".npy file of a best set (key indices) to start from")
    ap.add_argument("--bins", default="0,50,200,500,1000,2000,3000", help="starts of the first-key ranges (ranks)")
    args = ap.parse_args(argv)

    from forcedweight.certify.solvers import bnb
    from forcedweight.certify.solvers.node_tests import search_steps
    from forcedweight.certify.solvers.search_row import contributions, prepare
    from forcedweight.certify.solvers.subtrees import SearchState
    from forcedweight.core import operator as op
    from forcedweight.rows import rows_by_id

    r = rows_by_id(args.real, [args.row]).get(args.row)
    if r is None:
        sys.exit(f"proof_by_first_key: no row with row_id {args.row} in {args.real}")
    s = args.s
    p, V, A_keys = contributions(r.p, r.V, s)
    N = p.shape[0]
    row = prepare(A_keys, p, s)
    order, rank = row.order, row.rank
    A, pw, nrm, G, lo, hi, use_box, kappa, gamma, wtop = row[:10]
    start = op.top_mass_set(p, s) if args.incumbent is None else op.as_index(np.load(args.incumbent), N)
    bestset = np.sort(rank[start])
    best = np.array([bnb._set_error(A, pw, bestset)])
    steps = search_steps(N)
    prep = (A, pw, wtop, nrm, G, lo, hi, use_box, s, bnb.REL_TOL, kappa, gamma)
    warm = SearchState(N, s, A.shape[1])  # compile (or load) the search before any clock
    bnb._search(*prep, *warm.arrays(), *warm.warm_arrays(), best.copy(), bestset.copy(), 10, *steps, True, 0)
    per_key = []
    for k in range(N):
        st = SearchState(N, s, A.shape[1])
        st.at_first_level(k)
        t0 = time.perf_counter()
        bnb._search(*prep, *st.arrays(), *st.warm_arrays(), best, bestset, 1 << 62, *steps, True, st.floor)
        per_key.append((int(st.state[2]), time.perf_counter() - t0))
        if st.state[1] == 1:  # the level-0 node k was pruned: so is every later one
            break
    nodes = np.array([n for n, _ in per_key], dtype=np.int64)
    secs = np.array([t for _, t in per_key])
    value = float(op.forced_error(p, V, np.sort(order[bestset])))
    print(f"row {args.row}: N = {N}, s = {s}, value {value:.8g}, {len(per_key)} first-level subtrees, "
          f"{int(nodes.sum())} nodes, {secs.sum():.2f} s (one thread)")
    print("| first keys (search ranks) | nodes | share | seconds | share | ||a_k|| at the first | largest mass from it on |")
    print("|---|---|---|---|---|---|---|")
    starts = sorted({int(b) for b in args.bins.split(",") if 0 <= int(b) < N} | {0})
    for a, b in zip(starts, starts[1:] + [N]):
        n_, t_ = int(nodes[a:b].sum()), float(secs[a:b].sum())
        print(f"| {a}–{b - 1} | {n_:,} | {n_ / max(nodes.sum(), 1):.3f} | {t_:.2f} | {t_ / max(secs.sum(), 1e-12):.3f} "
              f"| {nrm[a]:.3g} | {wtop[a, 1]:.3g} |")


if __name__ == "__main__":
    main()
