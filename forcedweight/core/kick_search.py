"""Iterated 1-swap search with random kicks and random restarts: a better incumbent for the
exact solvers (issue 15).

The 1-swap search (``core.swaps.swap_search``) stops at the first set no single swap improves.
On rows whose attention is spread over hundreds of keys that local minimum is often far from the
best set (a branch and bound then spends most of its nodes under a loose incumbent). Two ways out,
both deterministic for a seed: ``kick_search``, from the best set found so far, replaces ``kick``
kept keys by random others and runs the 1-swap descent again, keeping the result when it is lower;
``multistart_search`` runs the descent from random s-sets (drawn uniformly from all keys, or from a
window of keys of comparable mass) and keeps the best local minimum. On real spread rows the best
sets are light keys far from the top-mass region the pool and the kicks start from, and the
restarts find them (BENCHMARKS.md, issue 15).

With ``a_i = p_i (v_i - mu)``, ``y = sum_S a_i``, ``w = p(S)`` and ``c_j = <y, a_j>`` (from the
Gram matrix ``G``), swapping kept ``i`` for ``j`` gives
``||y'||^2 = ||y||^2 - 2 c_i + G_ii + 2 (c_j - G_ij) + G_jj`` and ``w' = w - p_i + p_j``: one
O(1) update per pair, O(s N) per scan (a pair is valued only when ``n2 < (E w')^2``, a screen with
no square root or division, so the scan vectorises). The Gram values only steer the search: the set returned
is valued directly (``||sum_S a_i|| / p(S)`` in float64) and is kept only when that is lower
than the start's.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from forcedweight.core.operator import rank_order

KICK_WORK = 5e7  # default budget in pair evaluations (~0.05 s at N ~ 1,000 and 0.06 s at N ~ 4,000, s = 8, one core;
# 0.19 s at N ~ 4,000 before the descents' squared screen; BENCHMARKS.md, issue 15)
KICK_AFTER = 5000  # the branch and bound runs the kicks only when not done after this many nodes
RESTART_AFTER = 20_000  # ... and the random restarts after this many (N ~ 4,096: rows proved in ~7,000 nodes
# paid ~0.3 s for restarts at 5,000 that never helped them; BENCHMARKS.md, issue 15)
RESTART_GROWTH = 8  # ... and again, with seed j, after RESTART_AFTER * RESTART_GROWTH**j nodes (j = 1, 2, ...:
# 160,000 and 1.28 million; at N ~ 4,096 on two threads a 10 s search visits ~700,000: on the 93 built-in rows the
# value fell on 6 of the 13 left open (0.4-11 %) and rows proved past 160,000 nodes took up to 9 % longer; 4 (4**j)
# lowered 7 and slowed them up to 13 %; BENCHMARKS.md, issue 15)
RESTART_PHASES = 6  # restart phases in all (the 6th after 6.6e8 nodes: hours of search)
KICK_SIZE = 2  # kept keys replaced per kick
RESTART_WINDOW = 4  # the windowed restarts draw their starts from RESTART_WINDOW * s keys of comparable mass
REL = 1e-12  # a swap must lower E by this relative amount (guards against round-off cycles)
PRESCREEN = 1e-9  # relative margin of the descents' squared screen (its rounding is a few 1e-16)


@njit(cache=True)
def _value(A, pw, members):
    d = A.shape[1]
    y = np.zeros(d)
    w = 0.0
    for i in members:
        w += pw[i]
        for q in range(d):
            y[q] += A[i, q]
    if not w > 0.0:
        return np.inf
    return np.sqrt(np.sum(y * y)) / w


@njit(cache=True)
def _diagonal(G):
    """(N,) the diagonal of the (N, N) Gram matrix ``G``, contiguous."""
    N = G.shape[0]
    gd = np.empty(N)
    for j in range(N):
        gd[j] = G[j, j]
    return gd


@njit(cache=True)
def _descend(A, pw, G, gd, members, in_set, c, max_work):
    """Best-improvement 1-swaps on ``members`` (in place) until none improves; returns the work.
    ``gd`` (N,) is the Gram diagonal (``_diagonal(G)``, read once per search rather than with a stride of
    N + 1 a scan)."""
    N = pw.shape[0]
    s = members.shape[0]
    work = 0.0
    while work < max_work:
        # c_j = <y, a_j> from the members' Gram rows (recomputed: no drift)
        ny2 = 0.0
        w = 0.0
        for j in range(N):
            c[j] = 0.0
        for i in members:
            w += pw[i]
            for j in range(N):
                c[j] += G[i, j]
        for i in members:
            ny2 += c[i]
        e_cur = np.sqrt(max(ny2, 0.0)) / w if w > 0.0 else np.inf
        best = e_cur * (1.0 - REL)
        # a pair can win only where n2 < (best w')^2: that square (with a margin far above its rounding)
        # screens the pairs, and only the pairs it passes are valued, as before: the same swaps with no
        # square root and division per pair (the scan vectorises: 3x faster at N ~ 4,000)
        screen = best * best * (1.0 + PRESCREEN)
        bi = -1
        bj = -1
        for a in range(s):
            i = members[a]
            base = ny2 - 2.0 * c[i] + G[i, i]
            wi = w - pw[i]
            for j in range(N):
                wn = wi + pw[j]
                n2 = base + 2.0 * (c[j] - G[i, j]) + gd[j]
                if n2 < screen * (wn * wn):
                    if in_set[j] or not wn > 0.0:
                        continue
                    e = np.sqrt(max(n2, 0.0)) / wn
                    if e < best:
                        best = e
                        screen = best * best * (1.0 + PRESCREEN)
                        bi = a
                        bj = j
        work += s * N
        if bi < 0:
            break
        in_set[members[bi]] = False
        in_set[bj] = True
        members[bi] = bj
    return work


@njit(cache=True, nogil=True)  # (bnb runs it on a thread beside the search)
def kick_search(A, pw, G, start, work, kick, seed):
    """The best set found by kicks and 1-swap descents from ``start``.

    Parameters
    ----------
    A : (N, d) float64 contributions ``a_i = p_i (v_i - mu)`` (any order and rotation).
    pw : (N,) float64 masses; G : (N, N) float64 ``A A^T``.
    start : (s,) int64 distinct key indices, 1 <= s < N.
    work : budget in pair evaluations (one scan of the swap neighbourhood costs s N).
    kick : kept keys replaced at random per kick (at most s).
    seed : int, the random stream (``np.random.seed`` inside Numba).

    Returns
    -------
    (s,) int64 sorted indices with directly computed E no greater than E(start).
    """
    N = pw.shape[0]
    s = start.shape[0]
    np.random.seed(seed)
    best = start.copy()
    e_best = _value(A, pw, best)
    cur = best.copy()
    in_set = np.zeros(N, np.bool_)
    c = np.empty(N)
    gd = _diagonal(G)
    spent = 0.0
    kick = max(1, min(kick, s))
    first = True
    while spent < work:
        for i in range(N):
            in_set[i] = False
        for a in range(s):
            cur[a] = best[a]
            in_set[cur[a]] = True
        if not first:
            for _ in range(kick):
                a = np.random.randint(0, s)
                j = np.random.randint(0, N)
                while in_set[j]:
                    j = np.random.randint(0, N)
                in_set[cur[a]] = False
                in_set[j] = True
                cur[a] = j
        first = False
        spent += _descend(A, pw, G, gd, cur, in_set, c, work - spent) + N
        e = _value(A, pw, cur)
        if e < e_best:
            e_best = e
            best[:] = cur
    return np.sort(best)


def multistart_search(A, pw, G, s, work, seed, window=0):
    """The best local minimum of 1-swap descents from random s-sets, within ``work``.

    Parameters
    ----------
    A : (N, d) float64 contributions; pw : (N,) float64 masses; G : (N, N) float64 ``A A^T``.
    s : kept-set size, 1 <= s < N.
    work : budget in pair evaluations (one scan of the swap neighbourhood costs s N); at least one
        start is descended, and a descent is cut where the budget ends.
    seed : int, the random stream (``np.random.seed`` inside Numba).
    window : 0 (default) draws each start uniformly from all keys; ``window = W > 0`` draws it from
        W consecutive keys of the mass order (``operator.rank_order(pw)``: descending, ties to the
        lower index), the window's place drawn uniformly for each start (``W`` is raised to s and
        capped at N). The descents always swap over all keys.

    Returns
    -------
    (s,) int64 sorted indices (the start with the lowest directly computed E).

    Why windows: ``E(S)`` is the distance between the mean of ``S``'s values weighted by their
    masses and the row's mean, so a set of comparable masses can cancel, while a uniformly drawn set
    is ruled by its heaviest key and descends towards the heavy keys. On 7 real N ~ 4,000 rows
    (5 seeds each, 5e7 pair evaluations) uniform starts then windows of 4 s keys reached the best
    known set in 15 of 35 runs, uniform starts alone in 6; on row 39 the uniform ones ended 54-57 %
    above it, the windowed ones within 0.4 % (BENCHMARKS.md, issue 15).
    """
    N = pw.shape[0]
    if window <= 0 or window >= N:
        return _multistart(A, pw, G, s, work, seed, np.arange(N, dtype=np.int64), N)
    return _multistart(A, pw, G, s, work, seed, rank_order(pw).astype(np.int64), max(int(window), s))


@njit(cache=True, nogil=True)  # (bnb runs it on a thread beside the search)
def _multistart(A, pw, G, s, work, seed, keys, W):
    """``multistart_search`` with each start drawn from ``W`` consecutive entries of ``keys`` (N,)
    (all of them when ``W = N``: the uniform draw, one random number per key drawn)."""
    N = pw.shape[0]
    np.random.seed(seed)
    in_set = np.zeros(N, np.bool_)
    c = np.empty(N)
    gd = _diagonal(G)
    best = np.zeros(s, np.int64)
    e_best = np.inf
    cur = np.zeros(s, np.int64)
    spent = 0.0
    first = True
    while True:
        for i in range(N):
            in_set[i] = False
        lo = 0 if W == N else np.random.randint(0, N - W + 1)
        a = 0
        while a < s:
            j = keys[lo + np.random.randint(0, W)]
            if not in_set[j]:
                in_set[j] = True
                cur[a] = j
                a += 1
        spent += _descend(A, pw, G, gd, cur, in_set, c, max(work - spent, 1.0)) + N
        e = _value(A, pw, cur)
        if first or e < e_best:
            e_best = e
            best[:] = cur
            first = False
        if spent >= work:
            break
    return np.sort(best)


__all__ = ["KICK_AFTER", "KICK_SIZE", "KICK_WORK", "RESTART_AFTER", "RESTART_WINDOW", "kick_search",
           "multistart_search"]
