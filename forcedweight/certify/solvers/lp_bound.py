"""Node bounds whose direction comes from a linear program: low first-level nodes, the tail (issue 15).

A stopped search leaves open every set whose first key (rank in the search order) is ``>= k_from``. The frontier
covers them by the first-level nodes ``{k}``, one bound each; on spread rows hundreds of those are
near 0 and the minimum stays 0. But all the sets whose keys are all ``>= k`` form one node, the
*tail* ``(T = {}, R = k..N-1)``, and its continuous relaxation ``min_X ||sum_R x_j a_j||`` over
``X = {x in [0, 1]^R, sum x = s}`` is > 0 as soon as 0 is outside the s-subset polytope of ``R``
(measured on open real rows: from k ~ 1-400 on, while the first-level nodes below are bounded
one by one).

The tail's direction comes from a linear program (HiGHS through ``scipy.optimize.linprog``):
``max_u  sum of the s smallest (<u, a_j> - lam p_j) over R``, ``u`` in the box ``[-1, 1]^d``
(``s tau - sum z_j`` with ``z_j >= tau - <u, a_j> + lam p_j``, ``z >= 0``). Its optimum is > 0
exactly when the relaxation at ``lam`` is. The bound is then the projection test along that
``u`` (``bounds._bound_along``: float64 with rounding margins, bisection on lam), so it is a proof
whatever the LP returns; two Dinkelbach rounds re-solve the LP at the bound found.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix, hstack, identity

from forcedweight.certify.solvers.bounds import _bound_along

NODE_LPS = 24  # most low first-level nodes given an LP direction per stopped search
TAIL_LPS = 12  # most tail starts tried per stopped search (each up to two LPs over the N - k keys)
ROUNDS = 2  # Dinkelbach rounds of the LP direction


def lp_direction(A, pw, k: int, r: int, lam: float, yT=None, wT: float = 0.0):
    """The direction ``u`` (d,) maximising the projection test of the node (fixed sum ``yT`` and
    mass ``wT``, default none; r more keys among ``k..N-1``) at ``lam``, over the box ``[-1, 1]^d``:
    ``max <u, yT> - lam wT + (sum of the r smallest <u, a_j> - lam p_j)``. None when the LP fails
    or its optimum is not > 0."""
    R = A[k:]
    m, d = R.shape
    if m < r or m == 0:
        return None
    scale = float(np.abs(R).max())
    if yT is not None:
        scale = max(scale, float(np.abs(yT).max()))
    if not scale > 0.0:
        return None
    Rs = R / scale  # the LP in units of the largest entry (the direction's scale does not matter)
    ps = pw[k:] * (lam / scale)
    yc = np.zeros(d) if yT is None else np.asarray(yT, dtype=np.float64) / scale
    # variables [u (d), tau, z (m)]; maximise <u, yT> + r tau - sum z  ->  minimise the negative
    c = np.concatenate([-yc, [-float(r)], np.ones(m)])
    # tau - <u, a_j> - z_j <= -lam p_j
    A_ub = hstack([csr_matrix(-Rs), csr_matrix(np.ones((m, 1))), -identity(m, format="csr")], format="csr")
    bounds = [(-1.0, 1.0)] * d + [(None, None)] + [(0.0, None)] * m
    res = linprog(c, A_ub=A_ub, b_ub=-ps, bounds=bounds, method="highs")
    if res.status != 0 or not -res.fun - lam * wT / scale > 0.0:
        return None
    return np.ascontiguousarray(res.x[:d])


def _along_lp(A, pw, nrm, yT, wT: float, k: int, r: int, top: float) -> float:
    """The largest proved ``lam`` in ``[0, top]`` of the node (fixed sum ``yT`` or None for T empty,
    mass ``wT``; r more keys among ``k..N-1``) along LP directions, ``ROUNDS`` Dinkelbach rounds."""
    y = np.zeros(A.shape[1]) if yT is None else yT
    lam = 0.0
    for _ in range(ROUNDS):
        u = lp_direction(A, pw, k, r, lam, yT, wT)
        if u is None:
            break
        lam = max(lam, float(_bound_along(u, y, wT, A, pw, nrm, k, r, top)))
        if not lam < top:
            break
    return lam


def node_bound(A, pw, nrm, k: int, s: int, top: float) -> float:
    """A proved lower bound in ``[0, top]`` on E over the first-level node ``{k}`` (key k and
    ``s - 1`` more among ``k + 1..N-1``), along LP directions."""
    if A.shape[0] - k - 1 < s - 1 or not top > 0.0:
        return 0.0
    return _along_lp(A, pw, nrm, np.ascontiguousarray(A[k]), float(pw[k]), k + 1, s - 1, top)


def tail_bound(A, pw, nrm, k: int, s: int, top: float) -> float:
    """A proved lower bound in ``[0, top]`` on E over every s-subset of the keys ``k..N-1``."""
    if A.shape[0] - k < s or not top > 0.0:
        return 0.0
    return _along_lp(A, pw, nrm, None, 0.0, k, s, top)


def choose_tail(A, pw, nrm, kz: int, k_from: int, s: int, top: float, floor: float, max_lps: int = TAIL_LPS,
                deadline: float = np.inf):
    """Where to start a tail that covers the low first-level node ``{kz}``: ``(k_tail, v_tail, tried)``.

    Starts ``kz, kz - 1, kz - 3, kz - 7, ...`` (down to ``k_from``, at most ``max_lps`` of them) are
    tried; a tail holds more sets the lower it starts, so its bound only falls. The lowest start whose
    bound is at least ``max(floor, b(kz) / 2)`` is returned (``floor``: the node's own bound); with
    ``k_tail = N`` when even ``b(kz) <= floor``. ``tried``: the starts tried (no further one once
    ``time.perf_counter()`` passes ``deadline``).
    """
    N = A.shape[0]
    if max_lps < 1 or N - kz < s:
        return N, np.inf, 0
    b0 = tail_bound(A, pw, nrm, kz, s, top)
    if not b0 > max(floor, 0.0):
        return N, np.inf, 1
    want = max(floor, 0.5 * b0)
    best = (kz, b0)
    tried = 1
    step = 1
    while tried < max_lps and time.perf_counter() < deadline:
        k = kz - step
        if k < k_from:
            break
        b = tail_bound(A, pw, nrm, k, s, top)
        tried += 1
        if b < want:
            break
        best = (k, b)
        step = 2 * step + 1
    return best[0], best[1], tried


__all__ = ["choose_tail", "lp_direction", "node_bound", "tail_bound", "NODE_LPS", "TAIL_LPS"]
