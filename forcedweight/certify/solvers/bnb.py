"""Exact depth-first branch and bound over all N keys (SPEC §5), in Numba.

Keys are sorted by mass (descending). A node is a partial set ``T`` (``y_T = sum_T a_i``,
``w_T = p(T)``) plus the keys ``R`` after the last decided position, from which ``r = s - |T|``
keys remain to be chosen. With ``lam = best * (1 - rel_tol)`` a node is pruned when no completion
``S`` can have ``E(S) = ||y_S|| / w_S < lam``, by any of:

* mass: ``w_S <= w_max = w_T + (the r largest masses in R)``; if ``w_max = 0`` every completion
  has ``E = inf``.
* box: in a fixed orthonormal basis (principal axes of ``A``), coordinate j of ``y_S`` lies in
  ``[y_Tj + (sum of the r smallest a_kj in R), y_Tj + (sum of the r largest)]``, so
  ``||y_S|| >= dist(0, box)`` and ``E(S) >= dist(0, box) / w_max``.
* projection (a linear test, exact for the ratio): for the unit vector ``u = y_T / ||y_T||``,
  ``||y_S|| >= <y_S, u>``, so ``E(S) >= lam`` for every completion when
  ``<y_T, u> - lam w_T + (sum of the r smallest (<a_k, u> - lam p_k) over R) >= 0``.
  This is the SPEC bound ``||y_S|| >= ||y_T|| + (sum of the r smallest <y_T, a_k>) / ||y_T||``
  with the mass folded into the same sum, hence never weaker than dividing by ``w_max``.
  The test is valid for *any* unit vector u, and its value is concave in u with supergradient
  ``y_T + sum_Z a_z`` (Z the minimising completion). When it fails, up to ``NREF = 8``
  supergradient steps (lengths THETA / sqrt(j)) improve u; u stays a combination of ``y_T`` and
  the ``a_z`` met so far, ``sum_z c_z <a_z, a_k>`` is accumulated from Gram rows step by step and
  ``||v||``, ``<v, y_T>`` come from Gram entries with a rounding margin (a step costs
  r |R| + r^2, no d-vector). On real SmolLM2 rows this cut the nodes 2-9x against 2 steps and
  the wall time 1.3-3x on hard rows (the first pruning success ends the steps).

Before the search the incumbent is polished by best-improvement 1-swaps over all keys
(``core.swaps.swap_search``; only the incumbent moves: no proof depends on it).

All three bounds only grow as ``R`` shrinks, so once the node "next key = k" is pruned, every
later k at that depth is too. Inner products ``<y_T, a_k>`` come from the Gram matrix and are
corrected by a rigorous rounding margin; leaves are checked by a Gram lower end and then evaluated
directly in float64. ``proved`` means: no kept set has ``E < value * (1 - rel_tol)``
(``rel_tol = 1e-9``; ``SolverResult.tolerance = rel_tol * value``).
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from forcedweight.core import operator as op
from forcedweight.core.swaps import swap_search
from forcedweight.certify.solvers.bounds import RELAX_ITERS, RELAX_QUICK, relax_bound
from forcedweight.certify.solvers.result import SolverResult

_EPS = float(np.finfo(np.float64).eps)
REL_TOL = 1e-9
NREF = 8  # supergradient steps on the direction u per node (projection test)
THETA = 1.0  # step j (1-based) has length THETA / j**DECAY relative to ||v||, ||supergradient||
DECAY = 0.5  # NREF, THETA, DECAY: measured on real SmolLM2 rows (BENCHMARKS.md, enumeration and exact solvers)
POLISH_ROUNDS = 50  # most best-improvement 1-swaps on the incumbent
BOUND_ITERS = 30  # bisection steps of an open node's bound (relative precision 2**-30)
_BOX_MAX = 2.5e7  # largest (N+1)(s+1)d table of box sums kept; beyond it the box bound is off
SPLIT_WORK = 2e8  # most key-steps (children x remaining keys) spent splitting first-level nodes


@njit(cache=True)
def _box_tables(A, s, lo, hi):
    """lo[j, r, q] / hi[j, r, q]: sum of the r smallest / largest A[k, q] over k >= j."""
    N, d = A.shape
    small = np.empty(s)
    large = np.empty(s)
    for q in range(d):
        ns = 0
        nl = 0
        for j in range(N - 1, -1, -1):
            x = A[j, q]
            # insert x into the ascending list of the s smallest
            if ns < s:
                pos = ns
                ns += 1
            else:
                pos = s - 1
                if x >= small[pos]:
                    pos = -1
            if pos >= 0:
                while pos > 0 and small[pos - 1] > x:
                    small[pos] = small[pos - 1]
                    pos -= 1
                small[pos] = x
            # the s largest, descending
            if nl < s:
                pos = nl
                nl += 1
            else:
                pos = s - 1
                if x <= large[pos]:
                    pos = -1
            if pos >= 0:
                while pos > 0 and large[pos - 1] < x:
                    large[pos] = large[pos - 1]
                    pos -= 1
                large[pos] = x
            acc_lo = 0.0
            acc_hi = 0.0
            for r in range(1, s + 1):
                if r <= ns:
                    acc_lo += small[r - 1]
                    acc_hi += large[r - 1]
                lo[j, r, q] = acc_lo
                hi[j, r, q] = acc_hi


@njit(cache=True)
def _r_smallest_sum(vals, start, r, buf, bidx):
    """Sum of the r smallest of vals[start:] (r <= len); their indices go to bidx[:r]."""
    n = 0
    for k in range(start, vals.shape[0]):
        x = vals[k]
        if n < r:
            pos = n
            n += 1
        elif x < buf[r - 1]:
            pos = r - 1
        else:
            continue
        while pos > 0 and buf[pos - 1] > x:
            buf[pos] = buf[pos - 1]
            bidx[pos] = bidx[pos - 1]
            pos -= 1
        buf[pos] = x
        bidx[pos] = k
    acc = 0.0
    for i in range(r):
        acc += buf[i]
    return acc


@njit(cache=True)
def _node_lb_ok(t, k, s, A, pw, cum, nrm, G, ys, ws, bs, cs, lo, hi, use_box, lam, gamma, g, buf,
                bidx, yv, gv, h, nref, theta, decay):
    """True when node (T = level t, next key k) may contain a set with E < lam."""
    N, d = A.shape
    r = s - t
    if N - k < r:
        return False
    wmax = ws[t] + (cum[min(N, k + r)] - cum[k])
    if wmax <= 0.0:
        return False
    if use_box:
        dist2 = 0.0
        for q in range(d):
            y = ys[t, q]
            a = y + lo[k, r, q]
            b = y + hi[k, r, q]
            slack = 4.0 * (r + 2) * _EPS * (abs(y) + abs(lo[k, r, q]) + abs(hi[k, r, q]))
            if a - slack > 0.0:
                dist2 += (a - slack) * (a - slack)
            elif b + slack < 0.0:
                dist2 += (b + slack) * (b + slack)
        if dist2 >= (lam * wmax) * (lam * wmax):
            return False
    if t > 0:
        ny2 = 0.0
        for q in range(d):
            ny2 += ys[t, q] * ys[t, q]
        ny = np.sqrt(ny2)
        if ny > 0.0:
            err = gamma * bs[t] / ny
            for kk in range(k, N):
                g[kk] = (cs[t, kk] / ny - err * nrm[kk]) - lam * pw[kk]
            tot = ny - lam * ws[t] + _r_smallest_sum(g, k, r, buf, bidx)
            if tot >= 0.0:
                return False
            # supergradient ascent on u: the test value is concave in u and its supergradient at u
            # is g = y_T + sum_Z a_z (Z the minimising completion). The direction is kept as
            # v = alpha y_T + sum_j c_j a_{z_j}, and h[kk] = sum_j c_j <a_{z_j}, a_kk> (from the
            # Gram matrix) is accumulated step by step, so a step costs r |R| + r^2, with no
            # d-vector: ||v||^2 and <v, y_T> are updated from Gram entries too.
            # Rounding: bz >= sum |coefficients| * ||a|| bounds every Gram-based quantity, so
            # |error of ||v||^2| <= kap2 bz^2 and |error of <v, y_T>| <= kap2 bz ||y_T||_1-ish
            # (bz bs[t]); <v, a_kk> is off by at most (gamma + 2 (nz + 2) eps) bz ||a_kk||.
            # Using nv = sqrt(vv + kap2 bz^2) >= ||v|| and dot = vy - kap2 bz bs[t] <= <v, y_T>
            # keeps <y_S, v> / nv <= ||y_S||, so the test stays a proof.
            alpha = 1.0 / ny
            vv = ny2 * alpha * alpha
            vy = ny2 * alpha
            for kk in range(k, N):
                h[kk] = 0.0
            bz = alpha * bs[t]
            nz = 0
            for step in range(nref):
                vg = vy
                yg = ny2
                gg = ny2
                for i in range(r):
                    z = bidx[i]
                    vg += alpha * cs[t, z] + h[z]
                    yg += cs[t, z]
                    gg += 2.0 * cs[t, z]
                    for i2 in range(r):
                        gg += G[z, bidx[i2]]
                if not gg > 0.0:
                    break
                eta = theta / ((step + 1.0) ** decay * np.sqrt(gg))
                vv += 2.0 * eta * vg + eta * eta * gg
                vy += eta * yg
                alpha += eta
                bz += eta * bs[t]
                for i in range(r):
                    z = bidx[i]
                    bz += eta * nrm[z]
                    for kk in range(k, N):
                        h[kk] += eta * G[z, kk]
                nz += r
                kap2 = 4.0 * (d + nz + 2 * s + 8) * _EPS
                nv = np.sqrt(max(vv, 0.0) + kap2 * bz * bz)
                if not nv > 0.0:
                    break
                dot = vy - kap2 * bz * bs[t]
                err = (gamma + 2.0 * (nz + 2) * _EPS) * bz / nv
                for kk in range(k, N):
                    g[kk] = ((alpha * cs[t, kk] + h[kk]) / nv - err * nrm[kk]) - lam * pw[kk]
                tot = dot / nv - lam * ws[t] + _r_smallest_sum(g, k, r, buf, bidx)
                if tot >= 0.0:
                    return False
    return True


@njit(cache=True)
def _search(A, pw, cum, nrm, G, lo, hi, use_box, s, rel_tol, kappa, gamma,
            idx, state, ys, ws, bs, cs, best, bestset, budget, nref, theta, decay):
    """Resumable DFS. state = [t, done, nodes, leaves]; best = [E_best]. Returns after budget."""
    N, d = A.shape
    g = np.empty(N)
    buf = np.empty(s)
    bidx = np.zeros(s, np.int64)
    yv = np.empty(d)
    gv = np.empty(d)
    h = np.zeros(N)
    t = state[0]
    nodes = 0
    while nodes < budget:
        nodes += 1
        k = idx[t]
        state[4 + t] += 1
        lam = best[0] * (1.0 - rel_tol)
        r = s - t
        ok = _node_lb_ok(t, k, s, A, pw, cum, nrm, G, ys, ws, bs, cs, lo, hi, use_box, lam,
                         gamma, g, buf, bidx, yv, gv, h, nref, theta, decay)
        if ok and r == 1:
            # leaves: every last key in R
            n2T = 0.0
            for q in range(d):
                n2T += ys[t, q] * ys[t, q]
            for kk in range(k, N):
                wv = ws[t] + pw[kk]
                if wv <= 0.0:
                    continue
                bv = bs[t] + nrm[kk]
                lam = best[0] * (1.0 - rel_tol)
                n2 = n2T + 2.0 * cs[t, kk] + G[kk, kk]
                if n2 - kappa * bv * bv < (lam * wv) * (lam * wv):
                    acc = 0.0
                    for q in range(d):
                        y = ys[t, q] + A[kk, q]
                        acc += y * y
                    e = np.sqrt(acc) / wv
                    state[3] += 1
                    if e < best[0]:
                        best[0] = e
                        for i in range(t):
                            bestset[i] = idx[i]
                        bestset[t] = kk
            ok = False
        if ok:
            # include k: push level t + 1
            for q in range(d):
                ys[t + 1, q] = ys[t, q] + A[k, q]
            ws[t + 1] = ws[t] + pw[k]
            bs[t + 1] = bs[t] + nrm[k]
            for kk in range(k + 1, N):
                cs[t + 1, kk] = cs[t, kk] + G[k, kk]
            t += 1
            idx[t] = k + 1
            continue
        # pruned or exhausted: back to the parent's next sibling
        t -= 1
        if t < 0:
            state[1] = 1
            break
        idx[t] += 1
    state[0] = max(t, 0)
    state[2] += nodes


@njit(cache=True)
def _node_value(t, k, s, A, pw, cum, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, g, buf,
                bidx, yv, gv, h, iters):
    """A proved lower bound on E over node (level t, next key k), capped at ``top``.

    ``_node_lb_ok(lam) == False`` proves every completion has ``E >= lam``; the largest such lam
    on a bisection of ``[0, top]`` (``iters`` halvings) is returned (``top`` itself when proved
    there, 0 when nothing is).
    """
    if not _node_lb_ok(t, k, s, A, pw, cum, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, g,
                       buf, bidx, yv, gv, h, NREF, THETA, DECAY):
        return top
    lo_l = 0.0
    hi_l = top
    for _ in range(iters):
        mid = 0.5 * (lo_l + hi_l)
        if _node_lb_ok(t, k, s, A, pw, cum, nrm, G, ys, ws, bs, cs, lo, hi, use_box, mid, gamma, g,
                       buf, bidx, yv, gv, h, NREF, THETA, DECAY):
            hi_l = mid
        else:
            lo_l = mid
    return lo_l


@njit(cache=True)
def _relaxed(yT, wT, A, pw, nrm, k, r, top, relax_iters):
    """The relaxation bound, progressively: RELAX_QUICK steps first, then ``relax_iters`` steps
    and one re-aimed phase only when the quick bound is below ``top`` (the running minimum)."""
    v = relax_bound(yT, wT, A, pw, nrm, k, r, top, min(RELAX_QUICK, relax_iters), 0)
    if v < top and relax_iters > RELAX_QUICK:
        v = max(v, relax_bound(yT, wT, A, pw, nrm, k, r, top, relax_iters, 1))
    return v


@njit(cache=True)
def _children_min(A, pw, cum, nrm, G, lo, hi, use_box, s, k, j_from, top, gamma, iters, relax_quick,
                  ys2, ws2, bs2, cs2, g, buf, bidx, yv, gv, h):
    """min over the children ``T = {k, j}`` (j >= j_from, j > k; the rest from keys > j) of the
    first-level node ``{k}``, capped at ``top``, and the key-steps spent.

    Every completion of ``{k}`` has a second key j > k, so the minimum is a bound over the node
    (over its part with second key >= j_from). Each child gets the bisection of its tests and,
    below the running minimum, the quick relaxation (``relax_quick`` FISTA steps, 0 = off).
    s = 2: the children are the sets ``{k, j}`` themselves (their E, rounded down).
    """
    N, d = A.shape
    cur = top
    work = 0.0
    for j in range(min(N - s + 1, N - 1), max(j_from, k + 1) - 1, -1):
        for q in range(d):
            ys2[2, q] = A[k, q] + A[j, q]
        ws2[2] = pw[k] + pw[j]
        bs2[2] = nrm[k] + nrm[j]
        work += N - j
        if s == 2:
            if ws2[2] > 0.0:
                acc = 0.0
                for q in range(d):
                    acc += ys2[2, q] * ys2[2, q]
                cur = min(cur, np.sqrt(acc) / ws2[2] * (1.0 - 4.0 * (d + 4) * _EPS))
            continue
        for kk in range(j + 1, N):
            cs2[2, kk] = G[k, kk] + G[j, kk]
        v = _node_value(2, j + 1, s, A, pw, cum, nrm, G, ys2, ws2, bs2, cs2, lo, hi, use_box, cur,
                        gamma, g, buf, bidx, yv, gv, h, iters)
        if v < cur and relax_quick > 0:
            v = max(v, relax_bound(ys2[2], ws2[2], A, pw, nrm, j + 1, s - 2, cur, relax_quick, 0))
        cur = min(cur, v)
    return max(cur, 0.0), work


@njit(cache=True)
def _first_level_min(A, pw, cum, nrm, G, lo, hi, use_box, s, k_from, top, gamma, iters,
                     relax_iters, split_work):
    """min over the first-level nodes ``T = {k}`` (k >= k_from, the rest from keys > k) of their
    proved bounds, capped at ``top``: a bound over every set whose first key is >= k_from.

    Visited from the last k down (light keys first: their bounds are usually the smallest, so
    few nodes need a bisection below the running minimum). A node whose tests prove less than
    the running minimum also gets a quick relaxation bound (``bounds.relax_bound``, RELAX_QUICK
    FISTA steps), and keeps the larger. Then, lazily, the node with the smallest bound so far gets
    the full relaxation (``relax_iters`` steps and a re-aimed phase; 0 = off) until the smallest
    bound is one already refined: the minimum is the same as refining every node, at a fraction
    of the cost.
    """
    N, d = A.shape
    ys1 = np.zeros((2, d))
    ws1 = np.zeros(2)
    bs1 = np.zeros(2)
    cs1 = np.zeros((2, N))
    g = np.empty(N)
    buf = np.empty(s)
    bidx = np.zeros(s, np.int64)
    yv = np.empty(d)
    gv = np.empty(d)
    h = np.zeros(N)
    cur = top
    vals = np.full(N, np.inf)
    for k in range(min(N - s, N - 1), k_from - 1, -1):
        for q in range(d):
            ys1[1, q] = A[k, q]
        ws1[1] = pw[k]
        bs1[1] = nrm[k]
        for kk in range(k + 1, N):
            cs1[1, kk] = G[k, kk]
        if s == 1:
            w = pw[k]
            if w > 0.0:
                acc = 0.0
                for q in range(d):
                    acc += A[k, q] * A[k, q]
                cur = min(cur, np.sqrt(acc) / w * (1.0 - 4.0 * (d + 2) * _EPS))
            continue
        v = _node_value(1, k + 1, s, A, pw, cum, nrm, G, ys1, ws1, bs1, cs1, lo, hi, use_box, cur,
                        gamma, g, buf, bidx, yv, gv, h, iters)
        if v < cur and relax_iters > 0:
            v = max(v, relax_bound(ys1[1], ws1[1], A, pw, nrm, k + 1, s - 1, cur,
                                   min(RELAX_QUICK, relax_iters), 0))
        vals[k] = v
        cur = min(cur, v)
    if s == 1:
        return max(cur, 0.0)
    if relax_iters > RELAX_QUICK:
        done = np.zeros(N, np.bool_)
        while True:
            kmin = -1
            for k in range(k_from, N):
                if kmin < 0 or vals[k] < vals[kmin]:
                    kmin = k
            if kmin < 0 or done[kmin] or not vals[kmin] < top:
                break
            done[kmin] = True
            for q in range(d):
                ys1[1, q] = A[kmin, q]
            vals[kmin] = max(vals[kmin], relax_bound(ys1[1], pw[kmin], A, pw, nrm, kmin + 1, s - 1, top,
                                                     relax_iters, 1))
    if split_work > 0.0:
        # lazily split the node with the smallest bound into its children {k, j} (smallest first,
        # until the smallest is one already split or the work budget is spent); a node keeps the
        # larger of its own bound and its children's minimum (both are proofs)
        ys2 = np.zeros((3, d))
        ws2 = np.zeros(3)
        bs2 = np.zeros(3)
        cs2 = np.zeros((3, N))
        split = np.zeros(N, np.bool_)
        spent = 0.0
        rq = min(RELAX_QUICK, relax_iters)
        while spent < split_work:
            kmin = -1
            for k in range(k_from, N):
                if kmin < 0 or vals[k] < vals[kmin]:
                    kmin = k
            if kmin < 0 or split[kmin] or not vals[kmin] < top:
                break
            split[kmin] = True
            v, w = _children_min(A, pw, cum, nrm, G, lo, hi, use_box, s, kmin, kmin + 1, top, gamma,
                                 iters, rq, ys2, ws2, bs2, cs2, g, buf, bidx, yv, gv, h)
            spent += w
            vals[kmin] = max(vals[kmin], v)
    cur = top
    for k in range(k_from, N):
        cur = min(cur, vals[k])
    return max(cur, 0.0)


@njit(cache=True)
def _open_bound(A, pw, cum, nrm, G, lo, hi, use_box, s, idx, t_cur, ys, ws, bs, cs, best, gamma,
                iters, relax_iters, split_work):
    """Proved lower bound on E over the unexplored part of a stopped search (<= best).

    The open frontier of the depth-first search is the current node (t_cur, idx[t_cur]) and, for
    each level t < t_cur, the exclusion branch (t, idx[t] + 1). Level 0 (T empty: no projection
    bound) is covered by its first-level children ``T = {k}``; every deeper open node lies inside
    the first-level node ``{idx[0]}``, so its bound is the larger of its own and that node's.
    Each node's bound is the larger of its tests' and the relaxation's (``relax_iters``, 0 = off).
    """
    N, d = A.shape
    if t_cur == 0:
        return _first_level_min(A, pw, cum, nrm, G, lo, hi, use_box, s, idx[0], best, gamma, iters,
                                relax_iters, split_work)
    rest = _first_level_min(A, pw, cum, nrm, G, lo, hi, use_box, s, idx[0] + 1, best, gamma, iters,
                            relax_iters, split_work)
    g = np.empty(N)
    buf = np.empty(s)
    bidx = np.zeros(s, np.int64)
    yv = np.empty(d)
    gv = np.empty(d)
    h = np.zeros(N)
    path = best
    for t in range(1, t_cur + 1):
        k = idx[t] + (1 if t < t_cur else 0)
        v = _node_value(t, k, s, A, pw, cum, nrm, G, ys, ws, bs, cs, lo, hi, use_box, path, gamma, g,
                        buf, bidx, yv, gv, h, iters)
        if v < path and relax_iters > 0 and N - k >= s - t:
            v = max(v, _relaxed(ys[t], ws[t], A, pw, nrm, k, s - t, path, relax_iters))
        path = min(path, v)
    # the first-level node {idx[0]} holds every deeper open node
    ys1 = np.zeros((2, d))
    ws1 = np.zeros(2)
    bs1 = np.zeros(2)
    cs1 = np.zeros((2, N))
    k0 = idx[0]
    for q in range(d):
        ys1[1, q] = A[k0, q]
    ws1[1] = pw[k0]
    bs1[1] = nrm[k0]
    for kk in range(k0 + 1, N):
        cs1[1, kk] = G[k0, kk]
    first = _node_value(1, k0 + 1, s, A, pw, cum, nrm, G, ys1, ws1, bs1, cs1, lo, hi, use_box, best,
                        gamma, g, buf, bidx, yv, gv, h, iters)
    if first < best and relax_iters > 0 and N - k0 - 1 >= s - 1:
        first = max(first, _relaxed(ys1[1], ws1[1], A, pw, nrm, k0 + 1, s - 1, best, relax_iters))
    deep = max(path, first)
    if deep < best and split_work > 0.0 and s >= 2:
        # the open part of {idx[0]} has second key >= idx[1]: the children from there
        ys2 = np.zeros((3, d))
        ws2 = np.zeros(3)
        bs2 = np.zeros(3)
        cs2 = np.zeros((3, N))
        v, _ = _children_min(A, pw, cum, nrm, G, lo, hi, use_box, s, k0, idx[1], best, gamma, iters,
                             min(RELAX_QUICK, relax_iters), ys2, ws2, bs2, cs2, g, buf, bidx, yv, gv, h)
        deep = max(deep, v)
    return max(min(rest, deep), 0.0)


def solve_bnb(p, V, s: int, incumbent=None, time_limit: float = 10.0,
              rel_tol: float = REL_TOL, polish: bool = True, node_limit: int | None = None,
              A=None, relax_iters: int = RELAX_ITERS, split_work: float = SPLIT_WORK) -> SolverResult:
    """Exact ES(s) over all N keys by depth-first branch and bound.

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : 1 <= s <= N.
    incumbent : optional (s,) key indices of a known good set (warm start; default top-mass).
    time_limit : seconds (checked between batches of nodes).
    rel_tol : a node is pruned when its bound is >= best * (1 - rel_tol).
    polish : first improve the incumbent by best-improvement 1-swaps over all keys.
    node_limit : optional cap on the search nodes (deterministic: the same stop, statuses and
        bounds on any machine, when ``time_limit`` is not reached first).
    A : optional (N, d) centred contributions ``a_i = p_i (v_i - mu)`` to use instead of
        ``operator.centred_contributions(p, V)``: with the rows of a key subset (a pool) and the
        ``mu`` of the FULL row, the search is the exact optimum over that subset
        (``E(S) = ||sum_S a_i|| / p(S)``; ``V`` is then unused and ``value`` is computed from A).
    relax_iters : FISTA steps of the relaxation bound (``bounds.relax_bound``) on the open nodes
        of a stopped search whose tests prove less (0 = off; only the bound changes, not the search).
    split_work : budget (key-steps: children x remaining keys) for splitting the open first-level
        nodes with the smallest bounds into their children ``{k, j}`` (``_children_min``; 0 = off;
        only the bound of a stopped search changes).

    Returns
    -------
    SolverResult(solver="bnb"): ``proved`` when the search completed; otherwise
    ``lower_bound`` is a proved bound over the open frontier (``_open_bound``; <= value), > 0
    wherever the first-level bound (``root_bound``) is.
    """
    t0 = time.perf_counter()
    if node_limit is not None and node_limit < 1:
        raise ValueError(f"node_limit must be >= 1, got {node_limit}")
    p = np.asarray(p, dtype=np.float64)
    external = A is not None
    if not external:
        p, V = op.as_row(p, V, s)
        A_keys = op.centred_contributions(p, V)
    else:
        A_keys = np.ascontiguousarray(np.asarray(A, dtype=np.float64).reshape(p.shape[0], -1))
        if not 1 <= s <= p.shape[0]:
            raise ValueError(f"s = {s} outside [1, {p.shape[0]}]")
    N = p.shape[0]

    def value_of(S):
        w = p[S].sum()
        return float(np.linalg.norm(A_keys[S].sum(axis=0)) / w) if w > 0 else np.inf

    start = op.top_mass_set(p, s) if incumbent is None else op.as_index(incumbent, N)
    if start.size != s:
        raise ValueError(f"incumbent has {start.size} keys, expected s = {s}")
    if s == N:
        S = np.arange(N, dtype=np.int64)
        v = value_of(S) if external else 0.0
        return SolverResult(v, S, v, True, "bnb", time.perf_counter() - t0, 0.0, {"nodes": 0})
    order = op.rank_order(p)  # keys by mass, ties to the lower index
    rank = np.empty(N, dtype=np.int64)
    rank[order] = np.arange(N)
    A, pw, nrm, G, lo, hi, use_box, kappa, gamma, cum = _prepared(A_keys, p, order, s)
    inc = np.sort(rank[start])
    e_start = np.linalg.norm(A[inc].sum(axis=0)) / pw[inc].sum() if pw[inc].sum() > 0 else np.inf
    # (the 1-swap search values sets by complements, exact only for a whole row's contributions)
    if polish and s < N and not external:
        polished, _ = swap_search(p, V, start, max_swaps=POLISH_ROUNDS, A=A_keys)
        inc = np.sort(rank[polished])
    y = A[inc].sum(axis=0)
    w = pw[inc].sum()
    e_inc = np.linalg.norm(y) / w if w > 0 else np.inf
    best = np.array([e_inc])
    bestset = inc.copy()  # the search overwrites it whenever it beats best
    idx = np.zeros(s + 1, dtype=np.int64)
    state = np.zeros(5 + s, dtype=np.int64)  # t, done, nodes, leaf evals, nodes per level
    d = A.shape[1]
    ys = np.zeros((s + 1, d))
    ws = np.zeros(s + 1)
    bs = np.zeros(s + 1)
    cs = np.zeros((s + 1, N))
    budget = 256
    deadline = t0 + time_limit
    while True:
        if node_limit is not None:
            budget = min(budget, node_limit - int(state[2]))
        tb = time.perf_counter()
        _search(A, pw, cum, nrm, G, lo, hi, use_box, s, rel_tol, kappa, gamma,
                idx, state, ys, ws, bs, cs, best, bestset, budget, NREF, THETA, DECAY)
        now = time.perf_counter()
        if state[1] or now >= deadline or (node_limit is not None and state[2] >= node_limit):
            break
        # aim at ~10 ms per batch (the batches only pause the search: the nodes visited, and so
        # a node-limited result, do not depend on them)
        budget = int(min(max(budget * min(2.0, 0.01 / max(now - tb, 1e-4)), 100), 200_000))
    S = np.sort(order[bestset])
    value = value_of(S) if external else op.forced_error(p, V, S)
    proved = bool(state[1])
    if proved:
        lb = value
    else:
        lb = float(_open_bound(A, pw, cum, nrm, G, lo, hi, use_box, s, idx, int(state[0]), ys, ws,
                               bs, cs, best[0], gamma, BOUND_ITERS, int(relax_iters), float(split_work)))
        lb = min(max(lb, 0.0), value)
    info = {"nodes": int(state[2]), "leaf_evals": int(state[3]), "box_bound": bool(use_box),
            "polished": bool(e_inc < e_start), "level_nodes": state[4:].tolist(),
            "stopped_by": None if proved else ("nodes" if node_limit is not None and state[2] >= node_limit else "time")}
    return SolverResult(value, S, lb, proved, "bnb", time.perf_counter() - t0,
                        rel_tol * value, info)


def _prepared(A_keys, p, order, s):
    """The search's arrays: contributions by mass in principal axes, masses, norms, Gram, box."""
    N = p.shape[0]
    A0 = A_keys[order]
    # principal axes: a fixed rotation (norms unchanged) that tightens the box bound
    _, Q = np.linalg.eigh(A0.T @ A0)
    A = np.ascontiguousarray(A0 @ Q[:, ::-1])
    d = A.shape[1]
    pw = np.ascontiguousarray(p[order])
    nrm = np.sqrt(np.einsum("ij,ij->i", A, A))
    G = A @ A.T
    kappa = 2.0 * (d + 2 * s + 4) * _EPS  # rounding margin of Gram-based squared norms
    gamma = 2.0 * (d + s + 4) * _EPS  # rounding margin of Gram-based inner products
    cum = np.concatenate([[0.0], np.cumsum(pw)])
    use_box = (N + 1) * (s + 1) * d <= _BOX_MAX
    shape = (N + 1, s + 1, d) if use_box else (1, 1, 1)
    lo = np.zeros(shape)
    hi = np.zeros(shape)
    if use_box:
        _box_tables(A, s, lo, hi)
        lo[N] = 0.0
        hi[N] = 0.0
    return A, pw, nrm, G, lo, hi, use_box, kappa, gamma, cum


def root_bound(p, V, s: int, A=None, relax_iters: int = RELAX_ITERS, split_work: float = SPLIT_WORK) -> float:
    """The proved bound of the search before any node: min over the first-level nodes ``{k}``.

    ``solve_bnb``'s ``lower_bound`` on a stopped search is never below it. Arrays as in
    ``solve_bnb``; returns a float in ``[0, E(top-mass polished)]`` (capped by the top-mass set).
    """
    p = np.asarray(p, dtype=np.float64)
    A_keys = op.centred_contributions(*op.as_row(p, V, s)) if A is None else np.asarray(A, dtype=np.float64)
    order = op.rank_order(p)
    A_, pw, nrm, G, lo, hi, use_box, _, gamma, cum = _prepared(A_keys, p, order, s)
    top = op.top_mass_set(p, s)
    e_top = float(np.linalg.norm(A_keys[top].sum(axis=0)) / p[top].sum()) if p[top].sum() > 0 else np.inf
    if s == p.shape[0]:
        return e_top
    return float(_first_level_min(A_, pw, cum, nrm, G, lo, hi, use_box, s, 0, e_top, gamma, BOUND_ITERS,
                                  int(relax_iters), float(split_work)))
