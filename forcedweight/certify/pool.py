"""THE candidate pool and ``ES_pool`` (SPEC §5), used by ``certify_row`` and group voting.

The pool is the top ``s + pool_mass`` keys by mass joined with the top ``pool_error`` keys by
single-key error (``candidate_pool``). When it has more than ``max_subsets`` subsets of size s,
``pool_mass`` / ``pool_error`` are lowered one at a time (the larger first; ``pool_mass`` on a
tie) until ``C(pool, s) <= max_subsets`` or both are 0 (``pool_for``). ``ES_pool`` is the exact
minimum of E over the s-subsets of that pool (``enumerate.enumerate_best``; ``pool_best``).
"""

from __future__ import annotations

import math

import numpy as np

from forcedweight.certify.enumerate import enumerate_best
from forcedweight.core import operator as op

#: default cap on C(pool, s) (``--max-subsets``)
MAX_SUBSETS = 4_000_000


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


def pool_best(p, V, s: int, pool_mass: int = 12, pool_error: int = 8,
              max_subsets: int = MAX_SUBSETS) -> tuple[float, np.ndarray]:
    """``ES_pool`` of a row at budget s and the set achieving it: ``(value, best_set)``.

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : 1 <= s <= N.
    pool_mass, pool_error, max_subsets : the pool (``pool_for``), as in ``CertifyOptions``.
    """
    return best_in_pool(p, V, pool_for(p, V, s, pool_mass, pool_error, max_subsets), s)


__all__ = ["MAX_SUBSETS", "best_in_pool", "candidate_pool", "pool_best", "pool_for"]
