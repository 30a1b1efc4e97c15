"""THE candidate pool and ``ES_pool`` (docs/enumerate.md), used by ``certify_row`` and group voting.

The pool is the top ``s + pool_mass`` keys by mass joined with the top ``pool_error`` keys by
single-key error (``candidate_pool``). When it has more than ``max_subsets`` subsets of size s,
``pool_mass`` / ``pool_error`` are lowered one at a time (the larger first; ``pool_mass`` on a
tie) until ``C(pool, s) <= max_subsets`` or both are 0 (``pool_for``). ``ES_pool`` is the exact
minimum of E over the s-subsets of that pool (``enumerate.enumerate_best``; ``pool_best``).

``pool_optimum`` (what certify and group voting use) first tries the pool as configured: where
``C(pool, s) > max_subsets`` (s = 32: pools of 40-52 keys) the pool optimum comes from the
branch and bound restricted to the pool keys (``solve_bnb`` on ``p`` and the contributions
``a_i = p_i (v_i - mu)`` of the pool rows, ``mu`` of the FULL row), with a node limit
(deterministic), started from the pool's top-mass set polished by 1-swaps. Only when that search is
not proved within ``node_limit`` nodes is the pool shrunk and enumerated as above; its unproved set
stays a candidate when it beats the shrunk pool's optimum.
"""

from __future__ import annotations

import math

import numpy as np

from forcedweight.certify.enumerate import enumerate_best
from forcedweight.certify.solvers.bnb import solve_bnb
from forcedweight.core import operator as op

#: default cap on C(pool, s) (``--max-subsets``)
MAX_SUBSETS = 4_000_000
#: default node limit of the pool-restricted branch and bound (``CertifyOptions.pool_node_limit``)
POOL_NODE_LIMIT = 200_000


def pool_size_limit(n: int, s: int, pool_mass: int, pool_error: int) -> int:
    """The most keys ``candidate_pool`` can hold on a row of N = n keys: ``min(n, s + pool_mass + pool_error)``
    (a pool of fewer than n keys leaves the rest of the row to the solver)."""
    return min(int(n), int(s) + int(pool_mass) + int(pool_error))


def candidate_pool(p, V, s: int, pool_mass: int = 12, pool_error: int = 8) -> np.ndarray:
    """Top ``s + pool_mass`` keys by mass joined with the top ``pool_error`` by single-key error.

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : budget.

    Returns
    -------
    (P,) int64, sorted, ``P <= N``. Ties in mass or error go to the lower index.
    """
    p = np.asarray(p, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64).reshape(p.shape[0], -1)
    n = p.shape[0]
    if pool_mass < 0 or pool_error < 0:
        raise ValueError("pool_mass and pool_error must be >= 0")
    by_mass = op.rank_order(p)[: min(n, s + pool_mass)]
    parts = [by_mass]
    if pool_error > 0:
        e = op.single_key_errors(p, V)
        by_err = op.rank_order(e)[: min(n, pool_error)]
        parts.append(by_err)
    return np.unique(np.concatenate(parts)).astype(np.int64)


def pool_for(p, V, s: int, pool_mass: int = 12, pool_error: int = 8,
             max_subsets: int = MAX_SUBSETS) -> np.ndarray:
    """``candidate_pool``, shrunk until ``C(pool, s) <= max_subsets`` (see the module doc).

    Returns
    -------
    (P,) int64 sorted key indices; ``pool.size`` is what certify records as ``pool_size``.
    """
    a, b = pool_mass, pool_error
    while True:
        pool = np.asarray(candidate_pool(p, V, s, pool_mass=a, pool_error=b), dtype=np.int64)
        if math.comb(pool.size, s) <= max_subsets or (a == 0 and b == 0):
            return pool
        if a >= b:
            a -= 1
        else:
            b -= 1


def best_in_pool(p, V, pool, s: int) -> tuple[float, np.ndarray]:
    """Exact minimum of E over the s-subsets of ``pool``: ``(value, best_set)``.

    ``best_set`` is (s,) sorted int64 (ties to the lexicographically first set) and
    ``value = operator.forced_error(p, V, best_set)``.
    """
    value, best = enumerate_best(p, V, pool, s)
    return float(value), op.as_index(best, np.asarray(p).shape[0])


def pool_search(p, A, pool, s: int, node_limit: int, start=None):
    """``solve_bnb`` on the keys of ``pool`` alone: p[pool] (N,) masses, A (N, d) the FULL row's centred
    contributions; ``start``: optional (s,) positions in ``pool`` (default its top-mass set). Returns the
    ``SolverResult`` (its ``best_set`` in pool positions), node-limited, without the bound of a stopped
    search (only a proof is ever used)."""
    k = op.unit_exponent(A[pool])  # (the contributions scaled by 2**-k, exactly: see certify.options.in_unit_scale)
    return solve_bnb(p[pool], None, s, incumbent=start, time_limit=math.inf, node_limit=node_limit,
                     A=np.ldexp(A[pool], -k), relax_iters=0, refine_work=0, tail_lps=0).in_units(k)


def bnb_in_pool(p, V, pool, s: int, node_limit: int, A=None, incumbent=None):
    """The branch and bound restricted to ``pool``: ``(proved, value, best_set)``.

    The sub-row is ``p[pool]`` with the contributions ``A[pool]`` of the FULL row (its ``mu``), so
    ``E`` of every subset of the pool is the row's own. ``best_set`` is (s,) sorted int64 row
    indices and ``value = operator.forced_error(p, V, best_set)``; ``proved`` means no s-subset of
    the pool is below ``value (1 - 1e-9)`` (bnb's ``rel_tol``). ``incumbent``: optional (s,) row
    indices inside the pool (the warm start; default the pool's top-mass set).
    """
    p = np.asarray(p, dtype=np.float64)
    pool = np.asarray(pool, dtype=np.int64)
    if A is None:
        A = op.centred_contributions(p, np.asarray(V, dtype=np.float64).reshape(p.shape[0], -1))
    start = None if incumbent is None else np.searchsorted(pool, np.asarray(incumbent, dtype=np.int64))
    res = pool_search(p, A, pool, s, node_limit, start)
    best = np.sort(pool[res.best_set])
    return bool(res.proved), op.forced_error(p, V, best, A=A), best


def pool_optimum(p, V, s: int, pool_mass: int = 12, pool_error: int = 8, max_subsets: int = MAX_SUBSETS,
                 node_limit: int = POOL_NODE_LIMIT) -> tuple[np.ndarray, float, np.ndarray, np.ndarray | None]:
    """The pool and its exact optimum: ``(pool, ES_pool, best_set, unproved)`` (see the module doc).

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : 1 <= s <= N.
    pool_mass, pool_error, max_subsets : the pool, as in ``CertifyOptions``.
    node_limit : nodes of the pool-restricted bnb where ``C(pool, s) > max_subsets`` (0: shrink
        at once, the behaviour of ``pool_for``).

    Returns
    -------
    pool : (P,) int64 sorted (``pool_size = P``); ES_pool : float; best_set : (s,) int64 sorted.
    unproved : the best set of the configured pool's bnb when it ran out of nodes (the pool was
        shrunk; a candidate for ``es_best``, often far better than the shrunk pool's optimum), else None.
    """
    full = candidate_pool(p, V, s, pool_mass, pool_error)
    if math.comb(full.size, s) <= max_subsets or node_limit <= 0 or full.size <= s:
        pool = pool_for(p, V, s, pool_mass, pool_error, max_subsets)
        value, best = best_in_pool(p, V, pool, s)
        return pool, value, best, None
    # The bnb first, from its own (1-swap polished top-mass) start: on real SmolLM2 rows at s = 32 it
    # proves the configured pool in 63-16,000 nodes (< 0.3 s), while enumerating the shrunk pool (the
    # warm start before) took 0.15-0.2 s on every row and saved at most a few % of the nodes.
    proved, v_full, b_full = bnb_in_pool(p, V, full, s, node_limit)
    if proved:
        return full, float(v_full), b_full, None
    pool = pool_for(p, V, s, pool_mass, pool_error, max_subsets)
    value, best = best_in_pool(p, V, pool, s)
    return pool, value, best, (b_full if v_full < value else None)


def pool_best(p, V, s: int, pool_mass: int = 12, pool_error: int = 8,
              max_subsets: int = MAX_SUBSETS, node_limit: int = POOL_NODE_LIMIT) -> tuple[float, np.ndarray]:
    """``ES_pool`` of a row at budget s and the set achieving it: ``(value, best_set)``.

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : 1 <= s <= N.
    pool_mass, pool_error, max_subsets, node_limit : the pool (``pool_optimum``), as in
        ``CertifyOptions``.
    """
    _, value, best, _ = pool_optimum(p, V, s, pool_mass, pool_error, max_subsets, node_limit)
    return value, best


__all__ = ["MAX_SUBSETS", "POOL_NODE_LIMIT", "best_in_pool", "bnb_in_pool", "candidate_pool", "pool_best",
           "pool_for", "pool_optimum", "pool_search"]
