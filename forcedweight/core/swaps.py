"""THE 1-swap search (docs/concepts.md): best-improving 1-swaps from any start set until none improves.

Used by balancing (start = top-mass), the warm-start polish of the branch and bound and the SCIP
rounds (start = the incumbent). With ``a_i = p_i (v_i - mu)``, ``y = sum_S a_i`` and ``w = p(S)``,
the error is ``E = ||y|| / w``. Swapping kept key ``i`` out and candidate ``j`` in gives, with
``r_i = y - a_i`` (the kept set less ``i``, summed directly) and ``w_i = w - p_i``,

    ||y'||^2 = ||r_i||^2 + 2 r_i.a_j + ||a_j||^2,   w' = w_i + p_j,

so every pair costs one O(d) inner product (a Gram block ``R A_C^T``), vectorised; unlike the
expansion around ``y``, nothing cancels unless the swapped set itself is nearly exact. The chosen
swap (ties within a relative ``1e-12``: the first pair in index order) is re-checked by recomputing
E on the new set; if round-off misled the expansion, every swap is valued directly. The loop stops
when no swap lowers E by more than a relative ``1e-12`` (guards against round-off cycles).
"""

from __future__ import annotations

import numpy as np

from forcedweight.core import operator as op

REL_TOL = 1e-12


def swap_search(p: np.ndarray, V: np.ndarray, start, candidates=None, max_swaps: int | None = None,
                A: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Best-improvement 1-swaps from ``start`` until no swap lowers E (or ``max_swaps`` is hit).

    Parameters
    ----------
    p : (N,) float64 weights summing to 1.
    V : (N, d) float64 values.
    start : (s,) unique key indices, the start set (1 <= s <= N).
    candidates : optional index array: keys allowed to swap in (e.g. the candidate pool);
        ``None`` = all N keys.
    max_swaps : optional cap (default 10 N); E strictly decreases so the loop ends anyway.
    A : optional (N, d) ``operator.centred_contributions(p, V)``.

    Returns
    -------
    kept : (s,) sorted int64 indices; ``E(kept) <= E(start)``.
    swaps : int, the number of swaps applied.
    """
    p = np.asarray(p, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    n = p.shape[0]
    S = op.as_index(start, n)
    if S.size == n:
        return S, 0
    if A is None:
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
        Ak, pk = A[kept], p[kept]
        if kept.size <= 256:  # the kept set minus one key, summed directly (no cancellation)
            others = 1.0 - np.eye(kept.size)
            R, w_rest = others @ Ak, others @ pk
        else:
            R, w_rest = Ak.sum(axis=0)[None, :] - Ak, pk.sum() - pk
        # ||r_i + a_j||^2 with r_i = y - a_i: cancels only where the swapped set is nearly exact
        sq = (np.einsum("ij,ij->i", R, R)[:, None] + norms2[cand][None, :]
              + 2.0 * (R @ A[cand].T))
        new_w = w_rest[:, None] + p[cand][None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            e_new = np.where(new_w > 0, np.sqrt(np.maximum(sq, 0.0)) / new_w, np.inf)
        best = float(e_new.min())
        if not best < e_cur * (1.0 - REL_TOL):
            break
        # ties (within REL_TOL) go to the first pair in (kept, candidate) index order
        flat = int(np.flatnonzero(e_new.ravel() <= best * (1.0 + REL_TOL))[0])
        i, j = kept[flat // cand.size], cand[flat % cand.size]
        trial = in_set.copy()
        trial[i], trial[j] = False, True
        e_trial = op.forced_error(p, V, np.flatnonzero(trial), A=A)
        if not e_trial < e_cur * (1.0 - REL_TOL):
            # round-off misled the expanded form: value every swap directly, keep the best
            i, j, e_trial = _best_swap_direct(p, A, R, w_rest, kept, cand)
            if not e_trial < e_cur * (1.0 - REL_TOL):
                break
            trial = in_set.copy()
            trial[i], trial[j] = False, True
            e_trial = op.forced_error(p, V, np.flatnonzero(trial), A=A)
            if not e_trial < e_cur * (1.0 - REL_TOL):
                break
        in_set, e_cur = trial, e_trial
        swaps += 1
    return np.flatnonzero(in_set).astype(np.int64), swaps


def _best_swap_direct(p, A, R, w_rest, kept, cand):
    """The best swap by direct evaluation ``||r_i + a_j|| / (w - p_i + p_j)``; O(s |C| d)."""
    best = (np.inf, -1, -1)
    Ac, pc = A[cand], p[cand]
    for t in range(kept.size):
        Y = R[t][None, :] + Ac
        m = np.abs(Y).max(axis=1)
        Z = Y / np.where(m > 0, m, 1.0)[:, None]
        wv = w_rest[t] + pc
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(wv > 0, m * np.sqrt(np.einsum("ij,ij->i", Z, Z)) / wv, np.inf)
        c = int(np.argmin(e))
        if e[c] < best[0] * (1.0 - REL_TOL):
            best = (float(e[c]), int(kept[t]), int(cand[c]))
    return best[1], best[2], best[0]


__all__ = ["REL_TOL", "swap_search"]
