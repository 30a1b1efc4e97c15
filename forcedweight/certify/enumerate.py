"""Exact enumeration of every s-subset of a pool of keys (docs/enumerate.md).

The pool itself (which keys, and how it shrinks) is ``forcedweight.certify.pool``.

``enumerate_best`` walks the s-subsets of a pool in lexicographic order with the Gram trick: with
``a_i = p_i (v_i - mu)`` (rows of ``A``), ``G = A_pool A_pool^T``, a partial set ``T`` carries
``n2 = ||y_T||^2``, ``w = p(T)`` and ``c_k = <y_T, a_k>`` for every later pool key ``k``, so the
last element of each subset costs O(1)::

    ||y_T + a_k||^2 = n2 + 2 c_k + G_kk,      w_{T+k} = w + p_k.

The combination space is cut into equal rank ranges (unranked starts), scanned in parallel with
Numba. Float cancellation is guarded: every subset's squared error is computed with a rigorous
rounding margin ``kappa * b^2 / w^2``, ``b >= sum_{i in S} ||a_i||``; the few subsets whose lower end is
small are re-evaluated directly (``||sum_S a_i|| / p(S)``, float64), and any chunk that might
hide further candidates is re-scanned with direct evaluation. The returned value is recomputed
with ``operator.forced_error`` on the returned set.
"""

from __future__ import annotations

import math
from itertools import combinations

import numba
import numpy as np
from numba import njit, prange

from forcedweight.core import operator as op

_EPS = float(np.finfo(np.float64).eps)
TIE_REL = 1e-12  # sets within this relative error of the minimum are ties (lexicographic winner)
_TOPK = 8  # candidates kept per chunk by their rounding-safe lower end
_CHUNK = 16384  # subsets per chunk (about); chunks never depend on the thread count
_MIN_CHUNKS = 64  # ... but at least this many (of >= 2048 subsets) for parallelism
_PARALLEL_MIN = 1 << 17  # below this many subsets the scan runs on the calling thread


def brute_force_best(p, V, s: int, chunk: int = 8192) -> tuple[float, np.ndarray]:
    """Vectorised NumPy reference: E of every s-subset of all N keys (small N only).

    Returns ``(value, best_set)``; the set is the lexicographically first one whose value is
    within ``TIE_REL`` of the minimum, and ``value = operator.forced_error(p, V, best_set)``.
    """
    p, V = op.as_row(p, V, s)
    n = p.shape[0]
    A = op.centred_contributions(p, V)
    # one common rescaling of contributions and masses (as in ``enumerate_best``): same order of E,
    # no under/overflow in the squares
    a_max = float(np.abs(A).max())
    As = A / a_max if 0.0 < a_max < np.inf else A
    ps = p / p.max() if p.max() > 0 else p
    vals, sets = [], []
    it = combinations(range(n), s)
    while True:
        block = np.fromiter((i for c in _take(it, chunk) for i in c), dtype=np.int64)
        if block.size == 0:
            break
        block = block.reshape(-1, s)
        Y = As[block[:, 0]].copy()
        W = ps[block[:, 0]].copy()
        for j in range(1, s):  # (chunk, d) temporaries only
            Y += As[block[:, j]]
            W += ps[block[:, j]]
        # each sum's norm at its own scale: a sum of keys whose masses are ~1e-200 of the largest would
        # square to 0 and pass for E = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            E = np.where(W > 0, op.row_norms(Y) / W, np.inf)
        vals.append(E)
        sets.append(block)
    E = np.concatenate(vals)
    S = np.concatenate(sets)
    m = E.min()
    j = int(np.flatnonzero(E <= m * (1 + TIE_REL))[0])
    best = S[j].copy()
    return op.forced_error(p, V, best, A), best


def _take(it, k):
    for _ in range(k):
        try:
            yield next(it)
        except StopIteration:
            return


# ---------------------------------------------------------------------------------------------
# Numba kernels


@njit(cache=True)
def _unrank(rank, P, s, binom, out):
    """Lexicographic unranking: the ``rank``-th s-combination of range(P) into ``out``."""
    x = 0
    for i in range(s):
        while True:
            c = binom[P - x - 1, s - i - 1]
            if rank < c:
                break
            rank -= c
            x += 1
        out[i] = x
        x += 1


@njit(cache=True, inline="always")
def _push(l, idx, G, gd, pw, nrm, c2, n2, w, b):
    """Append idx[l] to the prefix: c2[l+1] = c2[l] + 2 G[idx[l]] (keys after it only; the scaling by 2
    is exact)."""
    i = idx[l]
    n2[l + 1] = n2[l] + c2[l, i] + gd[i]
    w[l + 1] = w[l] + pw[i]
    b[l + 1] = b[l] + nrm[i]
    P = G.shape[0]
    for k in range(i + 1, P):
        c2[l + 1, k] = c2[l, k] + 2.0 * G[i, k]


@njit(cache=True)
def _direct(Ap, pw, idx, last):
    """Direct float64 ``||sum a||^2 / w^2`` of idx[:-1] + [last] (the reference evaluation)."""
    d = Ap.shape[1]
    s = idx.shape[0]
    wsum = 0.0
    for t in range(s - 1):
        wsum += pw[idx[t]]
    wsum += pw[last]
    acc = 0.0
    for j in range(d):
        y = 0.0
        for t in range(s - 1):
            y += Ap[idx[t], j]
        y += Ap[last, j]
        acc += y * y
    return acc / (wsum * wsum)


@njit(cache=True)
def _offer(mode, lo, w2, thr, idx, s, k1, k2, Ap, pw, topL, topS, state, bests):
    """Handle one subset ``idx[:s-2] + [k1, k2]`` whose lower end passed the filter."""
    if w2 <= 0.0:
        return
    K = topL.shape[0]
    if mode == 0:
        filled = int(state[0])
        worst = int(state[1])
        slot = filled if filled < K else worst
        topL[slot] = lo / w2
        for t in range(s - 2):
            topS[slot, t] = idx[t]
        topS[slot, s - 2] = k1
        topS[slot, s - 1] = k2
        if filled < K:
            filled += 1
        if filled == K:
            worst = 0
            for q in range(1, K):
                if topL[q] > topL[worst]:
                    worst = q
            state[2] = topL[worst]
        state[0] = filled
        state[1] = worst
    else:
        if lo > thr * w2:
            return
        idx[s - 2] = k1
        e2 = _direct(Ap, pw, idx, k2)
        # lexicographic order within a chunk: a later set must win by more than the tie band
        if e2 < state[2] * (1.0 - 2.0 * TIE_REL):
            state[2] = e2
            for t in range(s - 2):
                bests[t] = idx[t]
            bests[s - 2] = k1
            bests[s - 1] = k2


@njit(cache=True)
def _scan(G, R, gd, pw, nrm, Ap, s, kappa, rank0, count, binom, mode, thr,
          topL, topS, bestv, bests):
    """Scan ``count`` subsets (s >= 2) from lexicographic rank ``rank0``.

    The prefix ``idx[:s-2]`` advances in lexicographic order; the last two elements (k1, k2)
    run in a double loop where each subset costs O(1):
    ``n2 = n2_T + (c2[k1] + G_k1k1) + c2[k2] + (G_k2k2 + 2 G_k1k2)`` with ``c2 = 2 <y_T, a_k>``;
    the last bracket is the prefix-independent table ``R`` (P, P) (``pair_table``, built once per
    pool by the caller: built here, in every chunk, it made a pool of 1,200 keys at s = 3 take 53 s).

    mode 0: keep the ``topL.shape[0]`` subsets with the smallest rounding-safe lower end
    ``(n2 - kappa b^2) / w^2`` in ``topL``/``topS`` (unused slots stay inf).
    mode 1: evaluate directly every subset whose lower end is <= ``thr``; keep the smallest
    (earliest in lexicographic order among values within TIE_REL) in ``bestv[0]``/``bests``.
    """
    P = G.shape[0]
    idx = np.empty(s, np.int64)
    _unrank(rank0, P, s, binom, idx)
    L = s - 2  # prefix length
    c2 = np.zeros((L + 1, P))
    n2 = np.zeros(L + 1)
    w = np.zeros(L + 1)
    b = np.zeros(L + 1)
    sufmax = np.zeros(P + 1)
    for k in range(P - 1, -1, -1):
        sufmax[k] = max(sufmax[k + 1], nrm[k])
    for l in range(L):
        _push(l, idx, G, gd, pw, nrm, c2, n2, w, b)
    state = np.empty(3)
    state[0] = 0.0
    state[1] = 0.0
    state[2] = np.inf
    remaining = count
    while True:
        n2T = n2[L]
        wT = w[L]
        bT = b[L]
        k1 = idx[s - 2]
        k2s = idx[s - 1]
        while k1 < P - 1 and remaining > 0:
            kend = min(P, k2s + remaining)
            wb = wT + pw[k1]
            n21 = n2T + c2[L, k1] + gd[k1]
            b1 = bT + nrm[k1]
            # rounding margin with the largest ||a_k2|| still ahead (suffix max): one constant
            bb = b1 + sufmax[k2s]
            base = n21 - kappa * bb * bb
            thrK = state[2] if mode == 0 else thr
            hit = False
            for k2 in range(k2s, kend):
                lo = base + c2[L, k2] + R[k1, k2]
                wv = wb + pw[k2]
                hit |= lo <= thrK * (wv * wv)
            if hit:
                for k2 in range(k2s, kend):
                    lo = base + c2[L, k2] + R[k1, k2]
                    wv = wb + pw[k2]
                    w2 = wv * wv
                    thrK = state[2] if mode == 0 else thr
                    if lo <= thrK * w2:
                        # the pair's own norm in the margin (a subset of light keys has a small b, which
                        # the suffix maximum overstates: its lower end would pass for any w)
                        bx = b1 + nrm[k2]
                        lo = (n21 - kappa * bx * bx) + c2[L, k2] + R[k1, k2]
                        if lo <= thrK * w2:
                            _offer(mode, lo, w2, thr, idx, s, k1, k2, Ap, pw, topL, topS, state, bests)
            remaining -= kend - k2s
            k1 += 1
            k2s = k1 + 1
        if remaining <= 0:
            break
        l = L - 1
        while l >= 0 and idx[l] == P - s + l:
            l -= 1
        if l < 0:
            break
        idx[l] += 1
        for j in range(l + 1, s):
            idx[j] = idx[j - 1] + 1
        for j in range(l, L):
            _push(j, idx, G, gd, pw, nrm, c2, n2, w, b)
    bestv[0] = state[2] if mode == 1 else np.inf


@njit(cache=True)
def _scan_one(G, R, gd, pw, nrm, Ap, s, kappa, start, count, binom, topL, topS):
    bv = np.empty(1)
    bs = np.empty(s, np.int64)
    _scan(G, R, gd, pw, nrm, Ap, s, kappa, start, count, binom, 0, 0.0, topL, topS, bv, bs)


@njit(parallel=True, cache=True, fastmath=False)
def _scan_all(G, R, gd, pw, nrm, Ap, s, kappa, starts, counts, binom, topL, topS):
    for m in prange(starts.shape[0]):
        _scan_one(G, R, gd, pw, nrm, Ap, s, kappa, starts[m], counts[m], binom, topL[m], topS[m])


@njit(cache=True)
def _scan_all_serial(G, R, gd, pw, nrm, Ap, s, kappa, starts, counts, binom, topL, topS):
    for m in range(starts.shape[0]):
        _scan_one(G, R, gd, pw, nrm, Ap, s, kappa, starts[m], counts[m], binom, topL[m], topS[m])


@njit(cache=True)
def _rescan_one(G, R, gd, pw, nrm, Ap, s, kappa, start, count, binom, thr, bestv, bests):
    tl = np.empty(1)
    ts = np.empty((1, s), np.int64)
    _scan(G, R, gd, pw, nrm, Ap, s, kappa, start, count, binom, 1, thr, tl, ts, bestv, bests)


@njit(parallel=True, cache=True, fastmath=False)
def _rescan(G, R, gd, pw, nrm, Ap, s, kappa, starts, counts, binom, thr, bestv, bests):
    for m in prange(starts.shape[0]):
        _rescan_one(G, R, gd, pw, nrm, Ap, s, kappa, starts[m], counts[m], binom, thr, bestv[m],
                    bests[m])


@njit(cache=True)
def _rescan_serial(G, R, gd, pw, nrm, Ap, s, kappa, starts, counts, binom, thr, bestv, bests):
    for m in range(starts.shape[0]):
        _rescan_one(G, R, gd, pw, nrm, Ap, s, kappa, starts[m], counts[m], binom, thr, bestv[m],
                    bests[m])


@njit(cache=True)
def _direct_many(Ap, pw, sets, out):
    s = sets.shape[1]
    for m in range(sets.shape[0]):
        out[m] = _direct(Ap, pw, sets[m], sets[m, s - 1])


def pair_table(G, gd):
    """(P, P) ``R[k1, k2] = 2 G[k1, k2] + G[k2, k2]``: what adding the last pair (k1, k2) of a subset adds to
    ``||y||^2`` besides the prefix's terms (``_scan``), from the pool's Gram matrix ``G`` (P, P) and its
    diagonal ``gd`` (P,). Built in place (no third P x P array: ``enumerate_bytes``)."""
    R = np.multiply(G, 2.0)
    R += gd.reshape(1, -1)
    return R


def _chunk_count(total: int) -> int:
    """How many chunks ``enumerate_best`` cuts ``total`` subsets into (never more than 4,096)."""
    return max(1, min(4096, max(min(_MIN_CHUNKS, total // 2048), -(-total // _CHUNK))))


def enumerate_bytes(n: int, d: int, P: int, s: int) -> int:
    """Estimated peak bytes of ``enumerate_best`` on a row of N = n keys and d value dims, over a pool of
    P keys at size s: the pool's (P, P) float64 Gram matrix and pair table (``pair_table``; none at
    s = 1), eight float64 copies of an (n, d) array (the row and its contributions, as certify's
    ``options.solver_memory`` counts them) and eight copies of the chunks' candidate lists (a call makes
    about four: ``topL``/``topS`` and their selections)."""
    P, s = int(P), int(s)
    if s < 2:
        return 8 * n * d * 8
    chunks = _chunk_count(math.comb(P, s))
    return 16 * P * P + 8 * n * d * 8 + 8 * chunks * _TOPK * (s + 1) * 8


def _binom_table(P: int, s: int) -> np.ndarray:
    t = np.zeros((P + 1, s + 1), dtype=np.int64)
    for n in range(P + 1):
        for k in range(min(n, s) + 1):
            t[n, k] = min(math.comb(n, k), 1 << 62)  # clipped: ranks stay < 2**62
    return t


def _prepare(p, V, pool):
    p = np.asarray(p, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64).reshape(p.shape[0], -1)
    pool = np.unique(np.asarray(pool, dtype=np.int64))
    if pool.size and (pool[0] < 0 or pool[-1] >= p.shape[0]):
        raise ValueError(f"pool has a key outside [0, {p.shape[0]})")
    A = op.centred_contributions(p, V)
    pw = p[pool]
    # E = ||sum a|| / sum p is unchanged in order (scaled by one constant) when the contributions
    # and the masses are rescaled: the kernels see a_i with largest entry 1 and masses at most 1,
    # so the Gram entries neither underflow (tiny values) nor overflow (huge values)
    a_max = float(np.abs(A[pool]).max()) if pool.size else 0.0
    a_max = a_max if 0.0 < a_max < np.inf else 1.0
    p_max = float(pw.max()) if pool.size else 0.0
    p_max = p_max if p_max > 0.0 else 1.0
    Ap = np.ascontiguousarray(A[pool] / a_max)
    pw = np.ascontiguousarray(pw / p_max)
    return p, V, pool, A, Ap, pw


def enumerate_best(p, V, pool, s: int, max_subsets: float = 5e11,
                   parallel: bool | None = None) -> tuple[float, np.ndarray]:
    """Exact minimum of E over every s-subset of ``pool`` (Numba, parallel within the row).

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; pool : (P,) key indices; s : 1 <= s <= P.
    max_subsets : refuse pools with more than this many s-subsets (ValueError).
    parallel : scan chunks on all Numba threads; None (default): when there are at least
        ``_PARALLEL_MIN`` subsets. The result does not depend on it (chunks are fixed).

    Returns
    -------
    (value, best_set): ``value = operator.forced_error(p, V, best_set)``, ``best_set`` (s,)
    int64 sorted global key indices. Ties (values within ``TIE_REL``) go to the
    lexicographically smallest candidate set.
    """
    p, V, pool, A, Ap, pw = _prepare(p, V, pool)
    P = pool.shape[0]
    if not 1 <= s <= P:
        raise ValueError(f"s = {s} outside [1, pool size {P}]")
    total = math.comb(P, s)
    if total > max_subsets:
        raise ValueError(f"pool of {P} keys has {total:.3g} subsets of size {s} (> {max_subsets:.3g})")
    if s == 1:
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(pw > 0, np.array([op._norm(a) for a in Ap]) / pw, np.inf)
        j = int(np.flatnonzero(e <= e.min() * (1.0 + TIE_REL))[0])
        return op.forced_error(p, V, pool[j : j + 1], A), pool[j : j + 1].copy()
    G = Ap @ Ap.T  # (P, P): with R, most of enumerate_bytes
    gd = np.ascontiguousarray(np.diag(G))
    R = pair_table(G, gd)
    nrm = np.sqrt(np.einsum("ij,ij->i", Ap, Ap))
    d = Ap.shape[1]
    # rounding margin of n2 (Gram entries: d-term dots; accumulation: <= 2s+2 terms), doubled
    kappa = 2.0 * (d + 2 * s + 4) * _EPS
    M = _chunk_count(total)
    bounds = np.array([(total * m) // M for m in range(M + 1)], dtype=np.int64)
    starts = bounds[:-1].copy()
    counts = np.diff(bounds)
    binom = _binom_table(P, s)
    if parallel is None:
        parallel = total >= _PARALLEL_MIN
    parallel = bool(parallel) and M > 1
    topL = np.full((M, _TOPK), np.inf)
    topS = np.zeros((M, _TOPK, s), dtype=np.int64)
    scan = _scan_all if parallel else _scan_all_serial
    scan(G, R, gd, pw, nrm, Ap, s, kappa, starts, counts, binom, topL, topS)
    ok = np.isfinite(topL)
    cand = topS[ok]
    exact = np.empty(cand.shape[0])
    _direct_many(Ap, pw, cand, exact)
    U = exact.min() * (1.0 + 4.0 * TIE_REL) if exact.size else np.inf
    # chunks whose list is full and whose worst kept lower end is still <= U may hide candidates
    full = ok.all(axis=1) & (topL.max(axis=1) <= U)
    keep = np.flatnonzero(~full)
    cand_sets = [topS[keep][np.isfinite(topL[keep])]]
    cand_vals = [exact.reshape(-1)[np.isin(np.flatnonzero(ok.reshape(-1)) // _TOPK, keep)]]
    redo = np.flatnonzero(full)
    if redo.size:
        bestv = np.full((redo.size, 1), np.inf)
        bests = np.zeros((redo.size, s), dtype=np.int64)
        rescan = _rescan if parallel and redo.size > 1 else _rescan_serial
        rescan(G, R, gd, pw, nrm, Ap, s, kappa, starts[redo], counts[redo], binom, U, bestv, bests)
        fin = np.isfinite(bestv[:, 0])
        cand_sets.append(bests[fin])
        cand_vals.append(bestv[fin, 0])
    sets = np.concatenate(cand_sets)
    vals = np.concatenate(cand_vals)
    if vals.size == 0:  # every s-subset of the pool has zero mass: E = inf for all of them
        best = pool[:s]
        return op.forced_error(p, V, best, A), best.copy()
    m = vals.min()
    tied = sets[vals <= m * (1.0 + 2.0 * TIE_REL)]
    order = np.lexsort(tied.T[::-1])
    best = pool[tied[order[0]]]
    return op.forced_error(p, V, best, A), np.sort(best)
