"""Compile (or load from Numba's cache) every kernel of a certification before any row's clock.

A time limit is wall-clock: Numba's first compile inside the first row would count against it
(on a fresh install the first row of a run came out ``unsolved`` after 11 s at a 2 s limit).
``warm_up()`` runs each kernel once on a tiny fixed row, once per process (the in-process run,
each worker process, each Dask worker): pool enumeration (serial and parallel scans, rescans),
the branch and bound (search, open bound, first-level bound, pool-restricted form), the
1-swap search, the kick search and its random restarts. Nothing it computes is kept.
"""

from __future__ import annotations

import numpy as np

from forcedweight.certify.enumerate import enumerate_best
from forcedweight.certify.pool import bnb_in_pool, candidate_pool
from forcedweight.certify.solvers.bnb import root_bound, solve_bnb
from forcedweight.core import operator as op
from forcedweight.core.kick_search import KICK_SIZE, kick_search, multistart_search
from forcedweight.core.swaps import swap_search

_DONE = False


def warm_up(force: bool = False) -> bool:
    """Run every certification kernel once on a fixed 40-key row; True when it ran now.

    Later calls in the same process return False at once (unless ``force``).
    """
    global _DONE
    if _DONE and not force:
        return False
    rng = np.random.default_rng(0)
    n, d = 40, 4
    p = rng.dirichlet(np.full(n, 0.5))
    V = rng.normal(size=(n, d))
    pool = candidate_pool(p, V, 8)  # 28 keys: C(28, 8) = 3.1e6 subsets, the parallel scan
    enumerate_best(p, V, pool, 8)
    enumerate_best(p, V, pool[:12], 3)  # the serial scan
    enumerate_best(p, V, pool[:12], 1)
    swap_search(p, V, np.arange(4))
    A = op.centred_contributions(p, V)
    kick_search(A, p, A @ A.T, np.arange(4, dtype=np.int64), 2000.0, KICK_SIZE, 0)
    multistart_search(A, p, A @ A.T, 4, 2000.0, 0)
    for s in (1, 4):
        solve_bnb(p, V, s, node_limit=30, time_limit=60.0)  # stopped: open bound
    solve_bnb(p[:10], V[:10], 3, time_limit=60.0)  # proved
    root_bound(p, V, 4)
    bnb_in_pool(p, V, pool[:14], 6, node_limit=30)
    _DONE = True
    return True


__all__ = ["warm_up"]
