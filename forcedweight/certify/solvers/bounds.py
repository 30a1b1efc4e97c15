"""A node bound from the continuous relaxation of the fixed-set problem (issue 15), in Numba.

A node of the branch and bound fixes ``T`` (``y_T = sum_T a_i``, ``w_T = p(T)``) and chooses
``r`` more keys among the rows ``k..N-1`` (``R``). Its completions ``S`` are the 0/1 points of
the capped simplex ``X = {x in [0, 1]^R, sum x = r}``, and ``y(x) = y_T + sum_R x_j a_j``.

The projection test of ``bnb`` proves ``E(S) >= lam`` for every completion when, for a vector
``u``, ``<u, y_T> - lam w_T + (sum of the r smallest <u, a_j> - lam p_j) >= 0`` (times 1/||u||).
Its best value over unit ``u`` is the Lagrangian dual of ``min_X ||y(x)|| - lam w(x)``, so the
test is only as good as ``u``; ``bnb`` improves ``u`` by a few supergradient steps, which on
spread layer-0 rows (hundreds of comparable keys) leave the mid-mass first-level nodes at bound 0
even though ``min_X ||y(x)|| > 0`` there (BENCHMARKS.md, issue 15).

Here ``u = y(x*)`` with ``x*`` an approximate minimiser of ``||y(x)||^2 / 2`` over ``X`` (FISTA
with projections onto ``X``). At the exact minimiser, ``min_X <u, y(x)> = ||y(x*)||`` (KKT), so
the test with this ``u`` reaches the relaxation's value at ``lam = 0`` and stays positive for
small ``lam``. Rigour does not depend on how well ``x*`` is found: the test is evaluated for the
``u`` obtained, directly in float64 (``<u, a_j>`` by d-term dot products, with a rounding margin
``4 (d + 4) eps ||u|| ||a_j||`` each and ``||u||`` rounded up), and the bound is the largest
``lam`` on a bisection of ``[0, top]`` at which it holds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from forcedweight.certify.solvers.node_tests import _EPS, _insert

RELAX_ITERS = 150  # FISTA steps per node (measured on real SmolLM2 rows, BENCHMARKS.md issue 15)
RELAX_QUICK = 20  # steps of the first, cheap try (bnb._relaxed)
LAM_ITERS = 40  # bisection steps on lam


@njit(cache=True)
def _project_capped(v, r, out):
    """out = the Euclidean projection of v onto {x in [0, 1]^m, sum x = r} (bisection on the shift)."""
    m = v.shape[0]
    lo = v.min() - 1.0
    hi = v.max()
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        acc = 0.0
        for j in range(m):
            x = v[j] - mid
            if x > 1.0:
                acc += 1.0
            elif x > 0.0:
                acc += x
        if acc > r:
            lo = mid
        else:
            hi = mid
    tau = 0.5 * (lo + hi)
    for j in range(m):
        x = v[j] - tau
        out[j] = 1.0 if x > 1.0 else (x if x > 0.0 else 0.0)


@njit(cache=True)
def _lipschitz(A, k):
    """An estimate of ||A[k:]||_2^2 (power iteration on A[k:]^T A[k:], times 1.05)."""
    N, d = A.shape
    M = np.zeros((d, d))
    for j in range(k, N):
        for a in range(d):
            x = A[j, a]
            if x != 0.0:
                for b in range(d):
                    M[a, b] += x * A[j, b]
    v = np.ones(d) / np.sqrt(d)
    lam = 0.0
    for _ in range(30):
        w = M @ v
        nw = np.sqrt(np.sum(w * w))
        if not nw > 0.0:
            return 0.0
        lam = nw
        v = w / nw
    tr = 0.0
    for a in range(d):
        tr += M[a, a]
    return min(1.05 * lam + 1e-300, tr + 1e-300)


@njit(cache=True)
def _direction(yT, A, pw, k, r, iters, mu, x):
    """u = y(x) for x ~ argmin_X ||y(x)||^2 / 2 - mu w(x) by ``iters`` FISTA steps from ``x``
    (updated in place; any u is valid)."""
    N, d = A.shape
    m = N - k
    L = _lipschitz(A, k)
    z = x.copy()
    xn = np.empty(m)
    v = np.empty(m)
    y = np.empty(d)
    tk = 1.0
    for _ in range(iters):
        if not L > 0.0:
            break
        for q in range(d):
            y[q] = yT[q]
        for j in range(m):
            zj = z[j]
            if zj != 0.0:
                for q in range(d):
                    y[q] += zj * A[k + j, q]
        for j in range(m):
            g = 0.0
            for q in range(d):
                g += A[k + j, q] * y[q]
            v[j] = z[j] - (g - mu * pw[k + j]) / L
        _project_capped(v, r, xn)
        tn = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * tk * tk))
        c = (tk - 1.0) / tn
        for j in range(m):
            z[j] = xn[j] + c * (xn[j] - x[j])
            x[j] = xn[j]
        tk = tn
    for q in range(d):
        y[q] = yT[q]
    for j in range(m):
        xj = x[j]
        if xj != 0.0:
            for q in range(d):
                y[q] += xj * A[k + j, q]
    return y


@njit(cache=True)
def _test_value(lam, LT, wT, lj, pw, k, r, buf, bidx):
    """LT - lam wT + (sum of the r smallest lj - lam pw over rows >= k), with a rounding margin."""
    N = pw.shape[0]
    n = 0
    for j in range(k, N):
        n = _insert(lj[j] - lam * pw[j], j, n, r, buf, bidx)
    acc = LT - lam * wT
    mag = abs(LT) + lam * wT
    for i in range(r):
        acc += buf[i]
        mag += abs(buf[i])
    return acc - 4.0 * (r + 4) * _EPS * mag


@njit(cache=True)
def relax_bound(yT, wT, A, pw, nrm, k, r, top, iters, phases=0):
    """A proved lower bound in ``[0, top]`` on E over the completions of a node.

    Parameters
    ----------
    yT : (d,) float64, ``sum_T a_i``; wT : float, ``p(T)``.
    A : (N, d) contributions (any fixed order); pw : (N,) masses; nrm : (N,) row norms of A.
    k : the completions take ``r`` more keys among rows ``k..N-1`` (``N - k >= r >= 1``).
    top : cap (e.g. the incumbent's E); iters : FISTA steps for the direction.
    phases : extra FISTA runs (``iters`` steps each, warm-started) re-aimed at the mass term with
        the bound found so far.

    Returns
    -------
    float: the largest ``lam`` found with ``||y_S|| >= lam p(S)`` proved for every completion
    (``top`` when proved there, 0 when nothing is).
    """
    N, d = A.shape
    if N - k < r or r < 1 or not top > 0.0:
        return 0.0
    x = np.full(N - k, r / (N - k))
    u = _direction(yT, A, pw, k, r, iters, 0.0, x)
    lam = _bound_along(u, yT, wT, A, pw, nrm, k, r, top)
    for _ in range(phases):
        if not (0.0 < lam < top):
            break
        # Dinkelbach-like step: the KKT point of min ||y|| - lam w is that of
        # min ||y||^2 / 2 - lam ||y*|| w, so re-aim the direction with mu = lam ||y(x)||
        ny = np.sqrt(np.sum(u * u))
        u = _direction(yT, A, pw, k, r, iters, lam * ny, x)
        lam = max(lam, _bound_along(u, yT, wT, A, pw, nrm, k, r, top))
    return lam


@njit(cache=True)
def _bound_along(u, yT, wT, A, pw, nrm, k, r, top):
    """The largest lam (bisection on [0, top]) at which the projection test along u holds."""
    N, d = A.shape
    nu2 = 0.0
    for q in range(d):
        nu2 += u[q] * u[q]
    if not nu2 > 0.0:
        return 0.0
    nu = np.sqrt(nu2) * (1.0 + 4.0 * (d + 4) * _EPS)  # >= ||u||
    rel = 4.0 * (d + 4) * _EPS * np.sqrt(nu2)
    # lower ends of <u, y_T> / ||u|| and <u, a_j> / ||u||
    acc = 0.0
    ny = 0.0
    for q in range(d):
        acc += u[q] * yT[q]
        ny += yT[q] * yT[q]
    LT = (acc - rel * np.sqrt(ny) * (1.0 + 4.0 * (d + 4) * _EPS)) / nu
    lj = np.zeros(N)
    for j in range(k, N):
        acc = 0.0
        for q in range(d):
            acc += u[q] * A[j, q]
        lj[j] = (acc - rel * nrm[j] * (1.0 + 4.0 * (d + 4) * _EPS)) / nu
    # the lower ends are divided by an upper end of ||u||: <u, y_S> / ||u|| <= ||y_S|| holds only
    # for <u, y_S> >= 0, which is all the test needs (it asserts lam p(S) <= <u, y_S> / nu).
    buf = np.empty(r)
    bidx = np.zeros(r, np.int64)
    if _test_value(top, LT, wT, lj, pw, k, r, buf, bidx) >= 0.0:
        return top
    if not _test_value(0.0, LT, wT, lj, pw, k, r, buf, bidx) >= 0.0:
        return 0.0
    lo = 0.0
    hi = top
    for _ in range(LAM_ITERS):
        mid = 0.5 * (lo + hi)
        if _test_value(mid, LT, wT, lj, pw, k, r, buf, bidx) >= 0.0:
            lo = mid
        else:
            hi = mid
    return lo


__all__ = ["relax_bound", "RELAX_ITERS", "RELAX_QUICK"]
