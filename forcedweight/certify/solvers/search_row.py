"""One row in the branch and bound's key order: the arrays its search, its bounds and the benchmarks read.

``prepare(A_keys, p, s)`` is the one place a row is put in the search's order (``search_order``), rotated to
principal axes and given its Gram matrix, box tables and suffix mass tops; ``solve_bnb``, ``root_bound``, the
benchmarks that look inside a proof and the tests of the node tests all start from it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from forcedweight.certify.solvers.node_tests import _EPS, _box_tables, mass_tops
from forcedweight.core import operator as op

BOX_MAX = 2.5e7  # largest (N+1)(s+1)d table of box sums kept; beyond it the box bound is off


class SearchRow(NamedTuple):
    """A row's search arrays, position i holding the key ``order[i]``.

    Attributes
    ----------
    A : (N, d) float64, the contributions ``a_i = p_i (v_i - mu)`` in the search order, in principal axes
        (a fixed rotation: norms, inner products and every E unchanged; it tightens the box bound).
    pw : (N,) float64, the masses in the search order.
    nrm : (N,) float64, ``||A[i]||``.
    G : (N, N) float64, the Gram matrix ``A A^T``.
    lo, hi : (N + 1, s + 1, d) float64, sums of the r smallest / largest ``A[k, q]`` over ``k >= j``
        (row N zero); (1, 1, 1) zeros when ``use_box`` is False.
    use_box : whether the box tables fit (``(N + 1)(s + 1) d <= BOX_MAX``).
    kappa : rounding margin (relative) of Gram-based squared norms.
    gamma : rounding margin (relative) of Gram-based inner products.
    wtop : (N + 1, s + 1) float64, ``node_tests.mass_tops(pw, s)``.
    order : (N,) int64, the row's key at each position.
    rank : (N,) int64, each key's position (``rank[order] = arange(N)``).
    """

    A: np.ndarray
    pw: np.ndarray
    nrm: np.ndarray
    G: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    use_box: bool
    kappa: float
    gamma: float
    wtop: np.ndarray
    order: np.ndarray
    rank: np.ndarray

    @property
    def search_arrays(self) -> tuple:
        """``(A, pw, wtop, nrm, G, lo, hi, use_box)``: the row's arguments of ``bnb._search`` and
        ``subtrees.search_subtrees``, in their order."""
        return self.A, self.pw, self.wtop, self.nrm, self.G, self.lo, self.hi, self.use_box


def contributions(p, V, s: int, A=None):
    """``(p, V, A_keys)``: the row's masses (N,) and values (N, d) as float64 and its contributions
    ``A_keys`` (N, d), ``operator.centred_contributions(p, V)``, or ``A`` when given (a pool's rows with the
    full row's mean; V is then returned as given, unused). Raises ValueError unless ``1 <= s <= N``."""
    if A is None:
        p, V = op.as_row(p, V, s)
        return p, V, op.centred_contributions(p, V)
    p = np.asarray(p, dtype=np.float64)
    if not 1 <= s <= p.shape[0]:
        raise ValueError(f"s = {s} outside [1, {p.shape[0]}]")
    return p, V, np.ascontiguousarray(np.asarray(A, dtype=np.float64).reshape(p.shape[0], -1))


def search_order(A_keys, p) -> np.ndarray:
    """(N,) int64: the keys by contribution norm ``||a_i||`` (A_keys (N, d)), descending; ties by
    mass ``p`` (N,), descending, then by the lower index. The branch and bound's key order."""
    nrm = np.sqrt(np.einsum("ij,ij->i", A_keys, A_keys))
    return np.lexsort((np.arange(p.shape[0]), -p, -nrm)).astype(np.int64)


def prepare(A_keys, p, s: int, order=None) -> SearchRow:
    """The row's ``SearchRow`` for budget ``s``.

    Parameters
    ----------
    A_keys : (N, d) float64 contributions, in the row's key order.
    p : (N,) float64 masses.
    s : the kept-set size (the box tables' and mass tops' depth).
    order : optional (N,) permutation to use instead of ``search_order(A_keys, p)`` (the node tests
        are valid in any order; tests use others).
    """
    N = p.shape[0]
    order = search_order(A_keys, p) if order is None else np.asarray(order, dtype=np.int64)
    rank = np.empty(N, dtype=np.int64)
    rank[order] = np.arange(N)
    A0 = A_keys[order]
    _, Q = np.linalg.eigh(A0.T @ A0)
    A = np.ascontiguousarray(A0 @ Q[:, ::-1])
    d = A.shape[1]
    pw = np.ascontiguousarray(p[order])
    nrm = np.sqrt(np.einsum("ij,ij->i", A, A))
    G = A @ A.T
    kappa = 2.0 * (d + 2 * s + 4) * _EPS
    gamma = 2.0 * (d + s + 4) * _EPS
    use_box = (N + 1) * (s + 1) * d <= BOX_MAX
    shape = (N + 1, s + 1, d) if use_box else (1, 1, 1)
    lo = np.zeros(shape)
    hi = np.zeros(shape)
    if use_box:
        _box_tables(A, s, lo, hi)
        lo[N] = 0.0
        hi[N] = 0.0
    return SearchRow(A, pw, nrm, G, lo, hi, use_box, kappa, gamma, mass_tops(pw, s), order, rank)


__all__ = ["BOX_MAX", "SearchRow", "contributions", "prepare", "search_order"]
