"""Proved lower bounds over the open frontier of a stopped branch and bound (issue 15), in Numba.

A stopped depth-first search leaves open: every first-level node ``T = {k}`` after the current
first key (the level-0 exclusion branch; level 0 itself, ``T`` empty, has no projection bound),
and the nodes of the current path. Each open node gets the larger of its tests' bound
(``node_tests._node_value``: bisection on ``lam``) and the relaxation's (``bounds.relax_bound``),
and the frontier bound is their minimum.

That minimum is then raised by best-first refinement (``_refine``), within a work budget: the
node with the smallest bound is, in turn, (1) given its full bound (bisection capped at the
incumbent instead of a running minimum, and the full relaxation), then (2) split into its
children ``T + {j}`` (j >= its next key; the rest from keys > j), each bounded by the same tests
and the quick relaxation, and never below its parent's bound (a child's sets are the parent's).
Children proved >= the incumbent are dropped. A node with one key to go is split into its leaves,
whose values are exact (rounded down). A node of bound 0 is *peeled* instead: a bisection over the
keys finds the first ``cut`` whose rest (T, keys >= cut) the test refutes at the smallest bound above
0 in the frontier; only the children ``T + {j}``, j < cut, are made (tested at the running minimum, not
first at the incumbent), and the rest stays one node at that bound (dropped when the bound is the
incumbent). A child its tests leave at 0 caps none of its siblings (the running minimum is over bounds
above 0, as in the first-level pass), and without relaxation steps it is final (state 1): its full bound
at the incumbent would run the same bisection and rescue tests again. On four N ~ 4,000 rows the cut
came after a median 12-19 % of a zero node's keys (at most 30 %), the same with targets 1,000x lower, so
such a split costs about a seventh of a full one.
Every step keeps the frontier a cover of the open sets, so its minimum stays a proof whatever the
budget. The minimum can rise above 0 only once every node of bound 0 has been processed, so the
refinement stops as soon as the budget left cannot pay for that (``_least_work``): the result is the
whole budget's (0), without spending it. Among nodes of bound 0 it
gives full bounds before it splits (a full bound is cheap, a split dear), which shows that sooner.
Costs are counted in key-steps (``N - k`` for one test over the keys of a node, ``2 d (N - k)`` for one
FISTA step), so a run is deterministic. On rows
of ``LONG_ROWS`` keys or more the bound runs without the relaxation (``bnb.bound_relax_iters``):
at N ~ 4,000 and d = 64 one node's full relaxation costs a third of the default budget, and
splitting nodes instead raises the bound further.

Frontier arrays (capacity M; ``_refine`` doubles it when full, up to ``frontier_bytes(N)``, which
``CertifyOptions.memory_problem`` counts): ``keys`` (M, s) int32 (row j of a node: its ``tt[j]`` fixed keys),
``tt`` (M,) level, ``kn`` (M,) next key, ``val`` (M,) bound, ``state`` (M,) int64:
0 = bound capped by a running minimum or quick only, 1 = full bound, 2 = exact (a leaf), -1 = split.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit, objmode

from forcedweight.certify.solvers.bounds import RELAX_QUICK, relax_bound
from forcedweight.certify.solvers.lp_bound import NODE_LPS, TAIL_LPS, choose_tail, node_bound
from forcedweight.certify.solvers.node_tests import (_EPS, _node_lb_ok, _node_value, DECAY, LONG_ROWS, NREF,
                                                     RESCUE_STEPS, THETA, node_scratch)

REFINE_WORK = 5e8  # default key-steps of the best-first refinement (0 = off; ~1 s per open row at N = 256-1024, one core; 2e9: ~6-7 s)
POP_RELAX = 150  # FISTA steps of the relaxation of a refined node (RELAX_QUICK or less: the quick one only)
STOP_BELOW = 0.02  # a first-level bound below this share of the incumbent calls for an LP direction
LP_KEYS = 24_000  # budget of those LPs per stopped search, in keys (an LP over N - k keys costs N - k)
FRONTIER_GRAM_SHARE = 2  # the node store grows (doubling) to at most this many times the Gram matrix's bytes
FRONTIER_MAX_BYTES = 256 * 2**20  # ... and at most this (a 600 s bound on a flat N = 3,431 row kept 1.7M nodes)
REFINE_STATS = ("full_bounds", "splits", "children_tested", "children_kept", "key_steps", "frontier_full",
                "tail_from", "zero_stop", "deadline", "peels")


@njit(cache=True)
def _clock():
    """``time.perf_counter()`` from inside Numba (about 1 us a call): the bound's deadline checks."""
    with objmode(t="float64"):
        t = time.perf_counter()
    return t


@njit(cache=True)
def _past(deadline):
    """Whether ``deadline`` (``perf_counter`` seconds; ``inf`` = none, and no clock is read) has passed."""
    return deadline < np.inf and _clock() >= deadline


@njit(cache=True)
def _relaxed(yT, wT, A, pw, nrm, k, r, top, relax_iters):
    """The relaxation bound, progressively: RELAX_QUICK steps first, then ``relax_iters`` steps
    and one re-aimed phase only when the quick bound is below ``top`` (the running minimum)."""
    v = relax_bound(yT, wT, A, pw, nrm, k, r, top, min(RELAX_QUICK, relax_iters), 0)
    if v < top and relax_iters > RELAX_QUICK:
        v = max(v, relax_bound(yT, wT, A, pw, nrm, k, r, top, relax_iters, 1))
    return v


@njit(cache=True)
def _relax_left(relax_iters, deadline):
    """The relaxation steps a path node of the open frontier gets: ``relax_iters``, or only the quick
    ones (``RELAX_QUICK``, as the first-level pass gives every node) once ``deadline`` has passed."""
    if _past(deadline):
        return min(RELAX_QUICK, relax_iters)
    return relax_iters


@njit(cache=True)
def _level(A, pw, nrm, G, T, t, ys, ws, bs, cs):
    """Fill level ``t`` of ys/ws/bs/cs from the keys ``T[:t]`` (sums of rows, Gram rows)."""
    N, d = A.shape
    for q in range(d):
        ys[t, q] = 0.0
    ws[t] = 0.0
    bs[t] = 0.0
    for kk in range(N):
        cs[t, kk] = 0.0
    for i in range(t):
        key = T[i]
        for q in range(d):
            ys[t, q] += A[key, q]
        ws[t] += pw[key]
        bs[t] += nrm[key]
        for kk in range(N):
            cs[t, kk] += G[key, kk]


@njit(cache=True)
def _leaf_lower(ys, t, A, pw, nrm, bs, ws, j, d, s):
    """E of the set (level-t keys) + {j}, rounded down (float64 sums, margin on the norm)."""
    w = ws[t] + pw[j]
    if not w > 0.0:
        return np.inf
    acc = 0.0
    for q in range(d):
        y = ys[t, q] + A[j, q]
        acc += y * y
    ny = np.sqrt(acc) - 4.0 * (d + s + 4) * _EPS * (bs[t] + nrm[j])
    return max(ny, 0.0) / (w * (1.0 + 4.0 * (s + 2) * _EPS))


@njit(cache=True)
def _first_level_vals(A, pw, wtop, nrm, G, lo, hi, use_box, s, k_from, top, gamma, iters, relax_iters,
                      vals, state, k_to, cur0, stop_below, out, deadline=np.inf):
    """Bounds of the first-level nodes ``{k}``, k_from <= k < k_to, into vals[k] (state[k] as above).

    Visited from the last k down (the smallest norms first: their bounds are usually the smallest), each
    bisection capped at the running minimum of the bounds above 0 (which starts at ``min(top, cur0)``; a node
    left at 0 would cap every later one at 0, and the refinement can raise it), with the rescue tests of
    ``_node_value`` (``top`` is the incumbent) and the quick relaxation below it (the full bound and
    relaxation of the smallest ones come from ``_refine``, within its budget). Past ``deadline``
    (``perf_counter`` seconds) a node at 0 caps the rest at 0 (no refinement will start to raise it), so
    the pass ends cheaply (a layer-0 row's thousands of cancelling nodes, each with its failed rescues,
    took 2-14 s more otherwise); until then it bounds every node as the pass without a deadline would.
    Stops after the first node whose bound is below ``stop_below`` and sets ``out[0]`` to its k (-1 when the
    pass completed). Returns the key-steps spent.
    """
    N, d = A.shape
    ys1 = np.zeros((2, d))
    ws1 = np.zeros(2)
    bs1 = np.zeros(2)
    cs1 = np.zeros((2, N))
    kt, buf, bidx, h, zs, zc, keys_all, dirn, gc, gk = node_scratch(nrm, pw, wtop, s, RESCUE_STEPS)
    cur = min(top, cur0)
    work = 0.0
    out[0] = -1
    for k in range(min(N - s, N - 1, k_to - 1), k_from - 1, -1):
        for q in range(d):
            ys1[1, q] = A[k, q]
        ws1[1] = pw[k]
        bs1[1] = nrm[k]
        if s == 1:
            ys1[0, :] = 0.0
            vals[k] = _leaf_lower(ys1, 0, A, pw, nrm, bs1 * 0.0, ws1 * 0.0, k, d, s)
            state[k] = 2
            cur = min(cur, vals[k])
            continue
        for kk in range(k + 1, N):
            cs1[1, kk] = G[k, kk]
        late = _past(deadline)
        v = _node_value(1, keys_all, k + 1, N, s, A, pw, nrm, G, ys1, ws1, bs1, cs1, lo, hi, use_box, cur,
                        gamma, kt, wtop, buf, bidx, h, zs, zc, dirn, iters, gc, gk, top)
        work += (N - k) * (iters + 1 if v < cur else 1)
        if v < cur and relax_iters > 0:
            v = max(v, relax_bound(ys1[1], ws1[1], A, pw, nrm, k + 1, s - 1, cur,
                                   min(RELAX_QUICK, relax_iters), 0))
            work += (N - k) * min(RELAX_QUICK, relax_iters)
        vals[k] = v
        state[k] = 1 if v >= top else 0
        if v > 0.0 or late:  # a node left at 0 does not cap the others (the refinement splits it)
            cur = min(cur, v)
        if v < stop_below:
            out[0] = k
            break
    return work


@njit(cache=True)
def _refine(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, m, top, gamma, iters,
            relax_iters, budget, stats, deadline=np.inf):
    """Raise the minimum of the frontier ``[0, m)`` by best-first refinement (module docstring).

    ``stats`` (len(REFINE_STATS),) int64 is incremented: nodes given their full bound, nodes split,
    children tested, children kept, key-steps spent (rounded), 1 if the frontier filled up (its arrays are
    replaced by larger ones, doubling, up to ``frontier_bytes(N)``; then it stops); ``stats[7]``
    = 1 when it stopped because the budget left cannot process every node of bound 0 (``_least_work``:
    the minimum would stay 0, so the result is the one the whole budget gives); ``stats[8]`` = 1 when it
    stopped at ``deadline`` (``perf_counter`` seconds; checked before each node); ``stats[9]``: nodes peeled
    (splits of nodes of bound 0; each probe of their bisection counts ``N - mid`` key-steps, a test's).

    Returns the frontier's minimum bound, capped at ``top`` and >= 0 (a proof: every open set lies
    in a live node, and each live node's bound is proved).
    """
    N, d = A.shape
    M = keys.shape[0]
    cap = max(M, frontier_bytes(N) // node_bytes(s))  # the most nodes the store may grow to
    ys = np.zeros((s + 1, d))
    ws = np.zeros(s + 1)
    bs = np.zeros(s + 1)
    cs = np.zeros((s + 1, N))
    kt, buf, bidx, h, zs, zc, keys_all, dirn, gc, gk = node_scratch(nrm, pw, wtop, s, RESCUE_STEPS)
    rq = min(RELAX_QUICK, relax_iters)
    spent = 0.0
    while True:
        i = -1
        need = 0.0  # the least work that raises every node of bound 0, and the largest such share
        most = 0.0
        pos_min = top  # the smallest bound above 0 (where a peeled node's rest is tested)
        for j in range(m):
            if state[j] >= 0:
                if val[j] > 0.0:
                    pos_min = min(pos_min, val[j])
                if i < 0 or val[j] < val[i] or (val[j] == val[i] == 0.0 and state[j] == 0 and state[i] == 1):
                    i = j  # (among nodes of bound 0, full bounds before splits: they show sooner what is hopeless)
                if state[j] < 2 and not val[j] > 0.0:
                    c = _least_work(N, d, s, tt[j], kn[j], state[j], iters)
                    need += c
                    most = max(most, c)
        if i < 0 or not val[i] < top or state[i] == 2 or spent >= budget:
            break
        if _past(deadline):
            stats[8] = 1
            break
        if spent + need - most >= budget:
            # the minimum stays 0 whatever is refined: every node of bound 0 must be processed, and the
            # last one to start would start at spent >= budget. Stop now: the same result, less time.
            stats[7] = 1
            break
        stats[0] += state[i] == 0
        stats[1] += state[i] == 1
        t = tt[i]
        k = kn[i]
        _level(A, pw, nrm, G, keys[i], t, ys, ws, bs, cs)
        if state[i] == 0:
            # (1) its own full bound
            v = _node_value(t, keys_all, k, N, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, kt, wtop,
                            buf, bidx, h, zs, zc, dirn, iters, gc, gk, top)
            spent += (N - k) * (iters + 1) + N * t
            if v < top and relax_iters > 0 and N - k >= s - t:
                ri = min(relax_iters, POP_RELAX)
                v = max(v, _relaxed(ys[t], ws[t], A, pw, nrm, k, s - t, top, ri))
                spent += (N - k) * (rq + (2 * ri if ri > RELAX_QUICK else 0)) * 2 * d
            val[i] = max(val[i], v)
            state[i] = 1
            continue
        # (2) split into the children T + {j}
        if m + (N - k) + 1 > M:  # full: drop the split nodes, then grow the store if that is not enough
            m = _compact(keys, tt, kn, val, state, m)
            want = m + (N - k) + 1
            if want > M:
                size = 2 * M
                while size < want:
                    size *= 2
                if size > cap:
                    stats[5] = 1
                    break
                keys, tt, kn, val, state = _grown(keys, tt, kn, val, state, m, size)
                M = size
            continue  # look again (the compaction moved the indices)
        parent = val[i]
        state[i] = -1
        cur = top
        last = N - (s - t)  # the last child's key
        cut = last + 1  # children T + {j}, k <= j < cut; the rest (T, keys >= cut) stays one node
        peeled = False  # (a rest was cut off: the children skip the test at top)
        if t + 1 < s and not parent > 0.0 and last > k:
            # peel: the smallest cut whose rest is refuted at the smallest bound above 0 (bisection; b is
            # always refuted or past the last key, so the rest's bound holds whatever the tests' order)
            a = k
            b = last + 1
            while b - a > 1:
                mid = (a + b) // 2
                spent += N - mid
                if _node_lb_ok(t, keys_all, mid, N, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, pos_min,
                               gamma, kt, wtop, buf, bidx, h, zs, zc, NREF, THETA, DECAY, dirn, gc, gk):
                    a = mid
                else:
                    b = mid
            cut = b
            peeled = cut <= last
            stats[9] += 1
            if peeled and pos_min < top:
                keys[m, :t] = keys[i, :t]
                tt[m] = t
                kn[m] = cut
                val[m] = pos_min
                state[m] = 0
                m += 1
        for j in range(cut - 1, k - 1, -1):
            keys[m, :t] = keys[i, :t]
            keys[m, t] = j
            if t + 1 == s:  # a leaf: its exact value
                v = max(parent, _leaf_lower(ys, t, A, pw, nrm, bs, ws, j, d, s))
                spent += d
                if v < top:
                    tt[m] = s
                    kn[m] = N
                    val[m] = v
                    state[m] = 2
                    m += 1
                continue
            for q in range(d):
                ys[t + 1, q] = ys[t, q] + A[j, q]
            ws[t + 1] = ws[t] + pw[j]
            bs[t + 1] = bs[t] + nrm[j]
            for kk in range(j + 1, N):
                cs[t + 1, kk] = cs[t, kk] + G[j, kk]
            spent += N - j
            stats[2] += 1
            # dropped when proved at top (one test; a peeled node's children skip it: their first test is at the
            # running minimum, and one proved there is kept at it); otherwise bounded, capped at the running minimum
            if not peeled and not _node_lb_ok(t + 1, keys_all, j + 1, N, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi,
                                              use_box, top, gamma, kt, wtop, buf, bidx, h, zs, zc, NREF, THETA, DECAY,
                                              dirn, gc, gk):
                continue
            v = _node_value(t + 1, keys_all, j + 1, N, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, cur,
                            gamma, kt, wtop, buf, bidx, h, zs, zc, dirn, iters, gc, gk, top)
            spent += (N - j) * (iters + 1 if v < cur else 1)
            if v < cur and rq > 0:
                v = max(v, relax_bound(ys[t + 1], ws[t + 1], A, pw, nrm, j + 1, s - t - 1, cur, rq, 0))
                spent += (N - j) * rq * 2 * d
            v = max(v, parent)
            if v < top:
                stats[3] += 1
                tt[m] = t + 1
                kn[m] = j + 1
                val[m] = v
                # (a child left at 0 caps no sibling; without relaxation it is final: a full bound would
                # rerun its tests, at the incumbent instead of a cap above 0)
                state[m] = 1 if not v > 0.0 and relax_iters == 0 else 0
                m += 1
                if v > 0.0:
                    cur = min(cur, v)
    stats[4] += int(spent)
    out = top
    for j in range(m):
        if state[j] >= 0:
            out = min(out, val[j])
    return max(out, 0.0)


@njit(cache=True)
def _least_work(N, d, s, t, k, state, iters):
    """The fewest key-steps ``_refine`` counts for processing a frontier node of bound 0 once (level t, next
    key k): its full bound (state 0), or its split (state 1: ``d`` per leaf; a peel's first probe and its
    first child's Gram sums). Every node of bound 0 must be processed before the frontier's minimum can
    rise above 0."""
    if state == 0:
        return float((N - k) * (iters + 1) + N * t)
    hi = N - (s - t)  # the last child's key
    if hi < k:
        return 0.0
    if t + 1 == s:
        return float(d * (hi - k + 1))
    if hi > k:  # (a node of bound 0 is peeled: at least its first probe and its first child)
        return float(N - (k + hi + 1) // 2) + float(N - k)
    return float(N - k)


@njit(cache=True)
def _compact(keys, tt, kn, val, state, m):
    """Drop the split nodes (state -1) from the frontier arrays; returns the new size."""
    n = 0
    for j in range(m):
        if state[j] >= 0:
            if n != j:
                keys[n] = keys[j]
                tt[n] = tt[j]
                kn[n] = kn[j]
                val[n] = val[j]
                state[n] = state[j]
            n += 1
    return n


@njit(cache=True)
def frontier_bytes(N):
    """The most bytes the refinement's node store grows to on a row of N keys, beyond its first size
    (``_frontier``): ``FRONTIER_GRAM_SHARE`` times the Gram matrix's, at most ``FRONTIER_MAX_BYTES``."""
    return min(FRONTIER_GRAM_SHARE * 8 * N * N, FRONTIER_MAX_BYTES)


@njit(cache=True)
def node_bytes(s):
    """Bytes of one frontier node at budget s: s int32 keys, level, next key, bound and state."""
    return 4 * s + 32


@njit(cache=True)
def _store(M, s):
    """Empty frontier arrays for M nodes at budget s (``keys, tt, kn, val, state``; ``node_bytes(s)`` a node)."""
    return (np.zeros((M, s), np.int32), np.zeros(M, np.int64), np.zeros(M, np.int64), np.zeros(M),
            np.zeros(M, np.int64))


@njit(cache=True)
def _grown(keys, tt, kn, val, state, m, size):
    """The frontier's arrays with room for ``size`` nodes, the first m copied."""
    k2, t2, n2, v2, st2 = _store(size, keys.shape[1])
    k2[:m] = keys[:m]
    t2[:m] = tt[:m]
    n2[:m] = kn[:m]
    v2[:m] = val[:m]
    st2[:m] = state[:m]
    return k2, t2, n2, v2, st2


@njit(cache=True)
def _frontier(N, s):
    return _store(min(max(64 * N, 1 << 14), 1 << 18), s)  # first size: at most 2**18 nodes (``_refine`` grows it)


@njit(cache=True)
def _add_first_level(vals, fstate, k_from, top, keys, tt, kn, val, state, m):
    N = vals.shape[0]
    for k in range(k_from, N):
        if vals[k] < top and m < keys.shape[0]:
            keys[m, 0] = k
            tt[m] = 1
            kn[m] = k + 1
            val[m] = vals[k]
            state[m] = fstate[k]
            m += 1
    return m


@njit(cache=True)
def first_level_bound(A, pw, wtop, nrm, G, lo, hi, use_box, s, k_from, top, gamma, iters, relax_iters,
                      budget, stats):
    """A proved bound (in [0, top]) over every set whose first key (rank in the search order) is >= k_from:
    the first-level nodes' bounds (relaxation ``relax_iters``), then ``budget`` key-steps of refinement
    (0 = none; the same relaxation steps, see ``open_bound``)."""
    N = A.shape[0]
    vals = np.full(N, np.inf)
    fstate = np.zeros(N, np.int64)
    _first_level_vals(A, pw, wtop, nrm, G, lo, hi, use_box, s, k_from, top, gamma, iters, relax_iters,
                      vals, fstate, N, np.inf, -1.0, np.zeros(1, np.int64))
    keys, tt, kn, val, state = _frontier(N, s)
    m = _add_first_level(vals, fstate, k_from, top, keys, tt, kn, val, state, 0)
    if s == 1 or budget <= 0.0:
        out = top
        for j in range(m):
            out = min(out, val[j])
        return max(out, 0.0)
    return _refine(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, m, top, gamma, iters,
                   relax_iters, budget, stats)


@njit(cache=True)
def _open_frontier(A, pw, wtop, nrm, G, lo, hi, use_box, s, idx, t_cur, ys, ws, bs, cs, best, gamma, iters,
                   relax_iters, vals, fstate, k_from, deadline=np.inf):
    """The open frontier of a stopped search, each node bounded (arrays as ``_frontier``, size m),
    from the first-level bounds ``vals`` (N,; ``inf`` = not a node: covered elsewhere) and the path.

    The open frontier of the depth-first search is the current node (t_cur, idx[t_cur]) and, for
    each level t < t_cur, the exclusion branch (t, idx[t] + 1). Level 0 is covered by its
    first-level children ``{k}``, k > idx[0] (k >= idx[0] when t_cur = 0); every deeper open node
    lies inside the first-level node ``{idx[0]}``, so its bound is the larger of its own and that
    node's. After ``deadline`` (``perf_counter`` seconds) the relaxations are the quick ones only.
    """
    N, d = A.shape
    keys, tt, kn, val, state = _frontier(N, s)
    m = _add_first_level(vals, fstate, k_from, best, keys, tt, kn, val, state, 0)
    if t_cur > 0:
        kt, buf, bidx, h, zs, zc, keys_all, dirn, gc, gk = node_scratch(nrm, pw, wtop, s, RESCUE_STEPS)
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
        first = _node_value(1, keys_all, k0 + 1, N, s, A, pw, nrm, G, ys1, ws1, bs1, cs1, lo, hi, use_box, best,
                            gamma, kt, wtop, buf, bidx, h, zs, zc, dirn, iters, gc, gk, best)
        if first < best and relax_iters > 0 and N - k0 - 1 >= s - 1:
            first = max(first, _relaxed(ys1[1], ws1[1], A, pw, nrm, k0 + 1, s - 1, best,
                                        _relax_left(relax_iters, deadline)))
        for t in range(1, t_cur + 1):
            k = idx[t] + (1 if t < t_cur else 0)
            v = _node_value(t, keys_all, k, N, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, best, gamma, kt, wtop,
                            buf, bidx, h, zs, zc, dirn, iters, gc, gk, best)
            if v < best and relax_iters > 0 and N - k >= s - t:
                v = max(v, _relaxed(ys[t], ws[t], A, pw, nrm, k, s - t, best, _relax_left(relax_iters, deadline)))
            v = max(v, first)
            if v < best and m < keys.shape[0]:
                keys[m, :t] = idx[:t]
                tt[m] = t
                kn[m] = k
                val[m] = v
                state[m] = 1
                m += 1
    return keys, tt, kn, val, state, m


def open_bound(A, pw, wtop, nrm, G, lo, hi, use_box, s, idx, t_cur, ys, ws, bs, cs, best, gamma, iters,
               relax_iters, budget, stats, tail_lps=TAIL_LPS, deadline=np.inf):
    """Proved lower bound on E over the unexplored part of a stopped search (in [0, best]).

    The first-level pass runs from the last key of the search order down; when a node's bound falls below
    ``STOP_BELOW * best`` (on spread rows: a node the quick tests cannot bound), it is bounded
    along a direction from a linear program (``lp_bound.node_bound``, at most ``NODE_LPS`` per
    search, and LPs over ``LP_KEYS`` keys in all, tails included; deterministic); if still low,
    the sets of all the keys from a start at or above it are covered instead by one tail node
    bounded by a linear program (``lp_bound.choose_tail``; at most ``tail_lps`` tail starts in all;
    ``tail_lps = 0`` turns off the node LPs too; ``stats[6]`` = the tail's first key, -1 for
    none), and the pass goes on below the tail, moving the tail's start down again at the next
    such node (no LP on rows of ``LONG_ROWS`` keys or more: there the nodes' rescue tests, ``_node_value``,
    bound them in a fraction of an LP's time). Then the open frontier
    (``_open_frontier``) and ``budget`` key-steps of best-first refinement (``_refine``). ``relax_iters`` is
    the relaxation steps of all of it, the pass, the path nodes and the refinement (0 = nodes are only tested
    and split; ``bnb.bound_relax_iters`` gives 0 on long rows).

    ``deadline`` (``time.perf_counter`` seconds; ``inf`` = none, the deterministic bound) ends the optional
    work where it stands: no LP, no full relaxation of a path node and no refinement step is started after
    it (``stats[8] = 1``). The first-level pass always completes, so the bound is never below the pass's
    minimum (> 0 wherever ``bnb.root_bound``'s pass is); only how far above it depends on time.
    """
    N = A.shape[0]
    k_from = int(idx[0] if t_cur == 0 else idx[0] + 1)
    vals = np.full(N, np.inf)
    fstate = np.zeros(N, np.int64)
    out = np.full(1, -1, np.int64)
    if N >= LONG_ROWS:  # no LP on long rows: the rescue tests bound their nodes, and the time goes to the refinement
        tail_lps = 0  # (at N ~ 4,096 six LPs took the whole deadline; at 8,192 each took ~2 s; BENCHMARKS.md)
    use_tail = tail_lps > 0 and 1 < s < N
    stop = STOP_BELOW * best if use_tail else -1.0
    k_tail, v_tail = N, np.inf
    stats[6] = -1
    k_to, cur0, lps, nlps = N, np.inf, int(tail_lps), NODE_LPS if tail_lps > 0 else 0
    lp_keys = LP_KEYS  # the LPs' sizes (keys) in all: about NODE_LPS LPs at N ~ 1,000, 6 at 4,096
    left_low = np.zeros(N, dtype=np.bool_)
    while True:
        _first_level_vals(A, pw, wtop, nrm, G, lo, hi, use_box, s, k_from, best, gamma, iters, relax_iters,
                          vals, fstate, k_to, cur0, stop if lps + nlps > 0 else -1.0, out, deadline)
        if out[0] < 0:
            break
        if time.perf_counter() >= deadline:  # no LP after the deadline (the pass goes on without them)
            nlps = lps = 0
            stats[8] = 1
        kz = int(out[0])
        if nlps > 0 and lp_keys >= N - kz:  # first its own bound along an LP direction
            nlps -= 1
            lp_keys -= N - kz
            vals[kz] = max(vals[kz], node_bound(A, pw, nrm, kz, s, float(best)))
            fstate[kz] = 1 if vals[kz] >= best else 0
        kt = N
        starts = min(lps, lp_keys // (N - kz))
        if vals[kz] < stop and starts > 0:  # then a tail from kz or below, if it bounds the node better
            kt, vt, used = choose_tail(A, pw, nrm, kz, k_from, s, float(best), float(vals[kz]), starts, deadline)
            lps -= used
            lp_keys -= used * (N - kz)
        if lp_keys < N - kz:
            nlps = lps = 0
        if kt <= kz:  # the tail (all sets of the keys >= kt) replaces the first-level nodes from kt on
            k_tail, v_tail = kt, vt
            vals[kt:] = np.inf
            fstate[kt:] = 0
            stats[6] = kt
            k_to, cur0 = kt, vt
        else:  # the pass goes on from the node below; nodes left low do not cap the others'
            # bisections (they are split first by the refinement; the others keep their own bounds)
            if vals[kz] < stop:
                left_low[kz] = True
            rest = vals[kz:][~left_low[kz:]]
            k_to, cur0 = kz, min(float(rest.min()) if rest.size else np.inf, v_tail)
    keys, tt, kn, val, state, m = _open_frontier(A, pw, wtop, nrm, G, lo, hi, use_box, s, idx, t_cur, ys, ws,
                                                 bs, cs, best, gamma, iters, relax_iters, vals, fstate, k_from,
                                                 deadline)
    if k_tail < N and v_tail < best and m < keys.shape[0]:
        keys[m] = 0
        tt[m] = 0
        kn[m] = k_tail
        val[m] = v_tail
        state[m] = 1  # final; when it is again the smallest, _refine splits it into {k}, k >= k_tail
        m += 1
    if budget <= 0.0 or s == 1:
        live = val[:m][state[:m] >= 0]
        return max(min(float(best), float(live.min()) if live.size else np.inf), 0.0)
    return _refine(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, m, best, gamma, iters,
                   int(relax_iters), budget, stats, deadline)


__all__ = ["FRONTIER_GRAM_SHARE", "FRONTIER_MAX_BYTES", "first_level_bound", "frontier_bytes", "node_bytes", "open_bound",
           "REFINE_STATS", "REFINE_WORK"]
