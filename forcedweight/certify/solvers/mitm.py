"""Exact ES(s) for uniform masses and 1-D integer values, by meet-in-the-middle over subset sums.

With ``p_i = 1/N`` and 1-D values ``a_i`` (T their total), the forced output of a kept set S of
size s is its mean, so ``E(S) = |sum_S a / s - T / N| = |N sum_S a - s T| / (N s)``. Minimising
it is a subset-sum problem with a size constraint: split the keys into two halves; for every k,
sort the sums of the k-subsets of the first half, and for every (s - k)-subset of the second half
binary-search the sum closest to the target. All arithmetic is exact (int64); the value returned
is then recomputed with ``operator.forced_error`` on the kept set found.

Time and memory grow as ``2**(N/2)``: a fraction of a second at N = 40, refused above N = 48.
"""

from __future__ import annotations

import time

import numpy as np

from forcedweight.core import operator
from forcedweight.certify.solvers.result import SolverResult

#: Values and every partial sum must stay below this to be exact in float64 and int64.
FLOAT_EXACT = 2**53
#: Largest half enumerated (2**24 int64 sums = 128 MiB); beyond it the solver gives up at once.
MAX_HALF = 24
#: Relative spread of the masses accepted as "uniform".
UNIFORM_RTOL = 1e-12


def _as_column(V: np.ndarray) -> np.ndarray | None:
    V = np.asarray(V, dtype=np.float64)
    if V.ndim == 1:
        return V
    if V.ndim == 2 and V.shape[1] == 1:
        return V[:, 0]
    return None


def integer_values(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """The values of a uniform-mass, 1-D, integer row as int64, or ValueError saying what breaks it.

    Parameters
    ----------
    p : (N,) weights.
    V : (N, 1) or (N,) values.

    Returns
    -------
    a : (N,) int64, exact (every ``|a_i| < 2**53`` and ``N * max|a_i| < 2**53``).
    """
    p = np.asarray(p, dtype=np.float64)
    v = _as_column(V)
    if v is None:
        raise ValueError(f"values are not one-dimensional (value_dim = {np.asarray(V).shape[-1]})")
    if p.size == 0 or v.shape[0] != p.shape[0]:
        raise ValueError("weights and values have different lengths")
    if not np.all(np.isfinite(p)) or p.max() - p.min() > UNIFORM_RTOL * abs(p.max()):
        raise ValueError("masses are not uniform (spread above 1e-12 relative)")
    if not np.all(np.isfinite(v)) or np.any(v != np.round(v)):
        raise ValueError("values are not all integers")
    big = float(np.abs(v).max())
    if big >= FLOAT_EXACT or big * v.size >= FLOAT_EXACT:
        raise ValueError("values too large: N * max|a| must stay below 2**53 for exact sums")
    return v.astype(np.int64)


def matches(p: np.ndarray, V: np.ndarray) -> bool:
    """True when the row has the structure this solver handles exactly: uniform masses, 1-D integers."""
    try:
        integer_values(p, V)
    except ValueError:
        return False
    return True


def _sums_by_size(half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ``2**h`` subset sums (index bit j = element j kept) and their sizes."""
    sums = np.zeros(1, dtype=np.int64)
    size = np.zeros(1, dtype=np.int8)
    for x in half:
        sums = np.concatenate([sums, sums + x])
        size = np.concatenate([size, size + 1])
    return sums, size


def _groups(size: np.ndarray, h: int) -> list[np.ndarray]:
    """For each k in 0..h, the subset masks (indices) of size k, in increasing order."""
    order = np.argsort(size, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(size, minlength=h + 1))])
    return [order[bounds[k]: bounds[k + 1]] for k in range(h + 1)]


def _mask_indices(mask: int, offset: int, width: int) -> list[int]:
    return [offset + j for j in range(width) if mask >> j & 1]


def solve_mitm(p: np.ndarray, V: np.ndarray, s: int, time_limit: float = 10.0) -> SolverResult:
    """Exact ``ES(s)`` over all N keys for a uniform-mass 1-D integer row.

    Parameters
    ----------
    p : (N,) float64 uniform weights.
    V : (N, 1) float64 integer values (see :func:`matches`).
    s : int, 1 <= s <= N.
    time_limit : float, seconds; when it runs out the best set so far comes back with
        ``proved=False`` and ``lower_bound=0``.

    Returns
    -------
    SolverResult
        ``value`` = ``forced_error`` of ``best_set``; ``info["numerator"]`` = the exact minimum of
        ``|N sum_S a - s T|`` (a Python int) so that the exact optimum is ``numerator / (N s)``;
        ``tolerance`` bounds the float64 rounding of ``value``.
    """
    t0 = time.perf_counter()
    a = integer_values(p, V)
    p = np.asarray(p, dtype=np.float64)
    Vc = a.astype(np.float64)[:, None]
    n = a.size
    if not 1 <= s <= n:
        raise ValueError(f"budget s={s} outside [1, {n}]")
    tol = operator.forced_error_rounding(a, s)
    total = int(a.sum())
    q, r = divmod(s * total, n)  # ideal kept sum = q + r/n, 0 <= r < n
    h = n // 2
    left, right = a[:h], a[h:]

    def result(best_set, proved, numerator, reason=None):
        best_set = np.sort(np.asarray(best_set, dtype=np.int64))
        value = operator.forced_error(p, Vc, best_set)
        info = {"numerator": numerator, "exact_value": None if numerator is None else numerator / (n * s)}
        if reason:
            info["reason"] = reason
        return SolverResult(value, best_set, value if proved else 0.0, proved, "mitm",
                            time.perf_counter() - t0, tol, info)

    if max(h, n - h) > MAX_HALF:
        return result(np.arange(s), False, None, f"N = {n} too large for meet-in-the-middle")
    sl, cl = _sums_by_size(left)
    if time.perf_counter() - t0 > time_limit:
        return result(np.arange(s), False, None, "time limit")
    sr, cr = _sums_by_size(right)
    l_groups, r_groups = _groups(cl, left.size), _groups(cr, right.size)
    best = None  # (objective, left_mask, right_mask)
    for k in range(max(0, s - right.size), min(left.size, s) + 1):
        if time.perf_counter() - t0 > time_limit:
            kept = np.arange(s) if best is None else _mask_indices(best[1], 0, h) + _mask_indices(best[2], h, n - h)
            return result(kept, False, None, "time limit")
        il = l_groups[k]
        if 2 * s == n:  # S and its complement have the same error: keep key 0 in S
            il = il[(il & 1) == 1]
        if il.size == 0:
            continue
        order = np.argsort(sl[il], kind="stable")
        Ls, Lmask = sl[il][order], il[order]
        ir = r_groups[s - k]
        R = sr[ir]
        goal = q - R  # kept sum L + R closest to q + r/n  <=>  D = L + R - q closest to r/n in [0, 1)
        pos = np.searchsorted(Ls, goal, side="right")  # Ls[pos-1] <= goal < Ls[pos]
        lo = np.clip(pos - 1, 0, Ls.size - 1)
        hi = np.clip(pos, 0, Ls.size - 1)
        # objective |n D - r| for both neighbours (int64: |D| < 2**55, n <= 48)
        obj_lo = np.abs(n * (Ls[lo] + R - q) - r)
        obj_hi = np.abs(n * (Ls[hi] + R - q) - r)
        take_hi = obj_hi < obj_lo
        obj = np.where(take_hi, obj_hi, obj_lo)
        j = int(np.argmin(obj))
        if best is None or int(obj[j]) < best[0]:
            jl = int(hi[j]) if take_hi[j] else int(lo[j])
            best = (int(obj[j]), int(Lmask[jl]), int(ir[j]))
            if best[0] == 0:
                break
    numerator, lm, rm = best
    return result(_mask_indices(lm, 0, h) + _mask_indices(rm, h, n - h), True, numerator)
