"""ES_pool at s = 32: the pool-restricted branch and bound against enumerating the shrunk pool.

    .venv/bin/python benchmarks/bench_pool.py [--n 256,1024] [--rows 20] [--s 32] [--seed 0]
        [--real DUMP_DIR] [--pool-mass 12] [--pool-error 8] [--node-limit 200000]

Where C(pool, s) is above ``--max-subsets`` (s = 32), ``pool.pool_optimum`` proves the optimum of the
configured pool by ``pool.bnb_in_pool`` and enumerates the shrunk pool (``pool.pool_for``) only when that
bnb is not proved. Per row this prints the configured and shrunk pool sizes, whether the bnb proved the
configured pool, its nodes and seconds from its own start (what certify runs) and from the shrunk pool's
optimum (the warm start certify used before), the enumeration's seconds (the baseline, measured in the same
run) and ES_pool(configured) / ES_pool(shrunk). Rows: ``--real`` (``bench_solvers.real_rows``: N in
[0.8 n, n]) or synthetic (``bench_solvers.make_row``, "flat", d = 64). One process, kernels compiled first.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench_solvers import KINDS, make_row, real_rows
from forcedweight.certify.pool import best_in_pool, candidate_pool, pool_for, pool_search
from forcedweight.certify.warmup import warm_up
from forcedweight.core import operator as op


def pool_bnb(p, A, pool, s, node_limit, start=None):
    """(proved, value, nodes, seconds) of ``pool.pool_search`` (what ``pool_optimum`` runs)."""
    t0 = time.perf_counter()
    res = pool_search(p, A, pool, s, node_limit, start)
    return bool(res.proved), res.value, int(res.info["nodes"]), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=str, default="256,1024")
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--s", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real", type=str, default=None, help="a dump directory of real rows")
    ap.add_argument("--pool-mass", type=int, default=12)
    ap.add_argument("--pool-error", type=int, default=8)
    ap.add_argument("--node-limit", type=int, default=200_000)
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    s = args.s
    warm_up()
    if args.real:
        rows = real_rows(args.real, ns, args.rows, s, args.seed)
    else:
        rows = {n: [(*make_row(n, KINDS["flat"], 64, args.seed * 1000 + i), i, -1) for i in range(args.rows)]
                for n in ns}
    print("n row N pool shrunk proved nodes s_bnb nodes_warm s_bnb_warm s_enum es_pool/es_shrunk")
    for n in ns:
        proved, t_bnb, t_enum = [], [], []
        for p, V, rid, _layer in rows[n]:
            A = op.centred_contributions(p, V)
            full = candidate_pool(p, V, s, args.pool_mass, args.pool_error)
            t0 = time.perf_counter()
            shrunk = pool_for(p, V, s, args.pool_mass, args.pool_error)
            v_shrunk, b_shrunk = best_in_pool(p, V, shrunk, s)
            te = time.perf_counter() - t0
            ok, v, nodes, tb = pool_bnb(p, A, full, s, args.node_limit)
            _, _, nodes_w, tw = pool_bnb(p, A, full, s, args.node_limit, np.searchsorted(full, b_shrunk))
            proved.append(ok)
            t_bnb.append(tb)
            t_enum.append(te)
            print(f"{n} {rid} {p.size} {full.size} {shrunk.size} {int(ok)} {nodes} {tb:.3f} {nodes_w} {tw:.3f} "
                  f"{te:.3f} {v / v_shrunk:.4f}", flush=True)
        ratio = np.median(np.asarray(t_bnb) / np.asarray(t_enum))
        print(f"# n={n}: configured pool proved {sum(proved)}/{len(proved)}; bnb seconds / shrunk-pool enumeration "
              f"seconds, median {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
