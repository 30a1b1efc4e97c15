"""Balancing: best-improvement 1-swaps from top-mass until none improves (SPEC §4).

With ``a_i = p_i (v_i - mu)``, ``y = sum_S a_i`` and ``w = p(S)``, the error is ``E = ||y|| / w``.
Swapping kept key ``i`` out and candidate ``j`` in gives

    ||y'||^2 = ||y||^2 + ||a_i||^2 + ||a_j||^2 - 2 y.a_i + 2 y.a_j - 2 a_i.a_j,   w' = w - p_i + p_j,

so every pair costs one O(d) inner product ``a_i.a_j`` (a Gram block ``A_S A_C^T``), vectorised.
The chosen swap is re-checked by recomputing E on the new set directly; the loop stops when no
swap lowers E by more than a relative ``1e-12`` (guards against round-off cycles).
"""

from __future__ import annotations

import numpy as np

from forcedweight import operator as op
from forcedweight.selectors.base import RowView, Selector

REL_TOL = 1e-12


def balancing(p: np.ndarray, V: np.ndarray, s: int, candidates=None, max_swaps: int | None = None):
    """Best-improvement 1-swaps from the top-mass set.

    Parameters
    ----------
    p : (N,) float64 weights summing to 1.
    V : (N, d) float64 values.
    s : budget, 1 <= s <= N.
    candidates : optional index array: keys allowed to swap in (e.g. the candidate pool);
        ``None`` = all N keys.
    max_swaps : optional cap (default 10 N); E strictly decreases so the loop ends anyway.

    Returns
    -------
    kept : (s,) sorted int64 indices.
    swaps : int, the number of swaps applied.
    """
    p = np.asarray(p, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    n = p.shape[0]
    S = op.top_mass_set(p, s)
    if s == n:
        return S, 0
    A = op.centred_contributions(p, V)
    norms2 = np.einsum("ij,ij->i", A, A)
    allowed = np.ones(n, dtype=bool) if candidates is None else np.zeros(n, dtype=bool)
    if candidates is not None:
        allowed[op.as_index(candidates, n)] = True
    in_set = np.zeros(n, dtype=bool)
    in_set[S] = True
    e_cur = op.forced_error(p, V, S, A=A)
    cap = 10 * n if max_swaps is None else int(max_swaps)
    swaps = 0
    while swaps < cap and e_cur > 0:
        kept = np.flatnonzero(in_set)
        cand = np.flatnonzero(allowed & ~in_set)
        if cand.size == 0:
            break
        y = A[kept].sum(axis=0)
        w = p[kept].sum()
        ya_k = A[kept] @ y
        ya_c = A[cand] @ y
        gram = A[kept] @ A[cand].T
        sq = (y @ y + norms2[kept][:, None] + norms2[cand][None, :]
              - 2.0 * ya_k[:, None] + 2.0 * ya_c[None, :] - 2.0 * gram)
        new_w = w - p[kept][:, None] + p[cand][None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            e_new = np.where(new_w > 0, np.sqrt(np.maximum(sq, 0.0)) / new_w, np.inf)
        flat = int(np.argmin(e_new))
        if not e_new.flat[flat] < e_cur * (1.0 - REL_TOL):
            break
        i, j = kept[flat // cand.size], cand[flat % cand.size]
        trial = in_set.copy()
        trial[i], trial[j] = False, True
        e_trial = op.forced_error(p, V, np.flatnonzero(trial), A=A)
        if not e_trial < e_cur * (1.0 - REL_TOL):
            break  # the expanded form promised a gain that exact arithmetic does not confirm
        in_set, e_cur = trial, e_trial
        swaps += 1
    return np.flatnonzero(in_set).astype(np.int64), swaps


class Balancing(Selector):
    """Selector wrapper: score 1 on the balanced set, 0 elsewhere (the set depends on s).

    Parameters
    ----------
    candidates : "all" (every key may swap in) or an index array.
    """

    name = "balancing"

    def __init__(self, candidates="all", sinks: int = 0, recent: int = 0):
        super().__init__(sinks, recent)
        self.candidates = None if isinstance(candidates, str) and candidates == "all" else candidates
        self.last_swaps = 0

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        if s is None:
            raise ValueError("balancing needs the budget s")
        kept, self.last_swaps = balancing(row.p, row.V, s, self.candidates)
        sc = np.zeros(row.n_keys)
        sc[kept] = 1.0
        return sc
