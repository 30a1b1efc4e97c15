"""The prune tests of a branch-and-bound node (docs/enumerate.md), in Numba: mass, box and projection,
and the key exclusion they allow.

A node is a partial set ``T`` (``y_T = sum_T a_i``, ``w_T = p(T)``; level ``t = |T|``) plus its
candidate keys ``R = L[p0:ln]`` (increasing indices: the search's order, ``search_row.search_order``), from
which ``r = s - t`` keys remain to be chosen. ``_node_lb_ok(lam)`` is False when no completion ``S`` can
have ``E(S) = ||y_S|| / w_S < lam`` (the tests are described in ``bnb``'s docstring);
``_node_value`` turns it into a proved lower bound by bisection on ``lam``; ``_step_scan`` is one
supergradient step's scan of ``_node_lb_ok``; ``_exclude`` drops the candidates that no completion with
``E < lam`` can hold (reduced-cost fixing with the test's direction). Arrays: ``A`` (N, d) contributions
in the search's order and basis, ``pw`` (N,) masses, ``nrm`` (N,) row norms, ``G`` (N, N) Gram matrix,
``lo``/``hi`` box tables, ``ys`` (levels, d), ``ws``/``bs`` (levels,), ``cs`` (levels, N)
(``cs[t, i] = <y_T, a_L[i]>`` by position i in level t's candidate list ``L``, from Gram rows), ``wtop``
(N + 1, s + 1) suffix mass tops (``mass_tops``; ``wtop[j, 1]`` is the largest mass from key j on), ``kt`` (N, 4)
each key's ``mx[k]`` (``suffix_max`` of ``nrm``), ``wtop[k, 1]``, ``nrm[k]`` and ``pw[k]`` in one row
(``key_table``: what the scans, the exclusion and the leaves read of a key); ``kt`` and the scratch ``buf``,
``bidx``, ``h``, ``zs``, ``zc``, ``dirn``, ``gc``, ``gk`` come from ``node_scratch``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

_EPS = float(np.finfo(np.float64).eps)
NREF = 8  # supergradient steps on the direction u per node (projection test)
NREF_LONG = 16  # ... in the search on rows of LONG_ROWS keys or more, where early-stopped scans are cheap
LONG_ROWS = 2048  # (N ~ 4,096: 16 steps proved 6 rows a median 1.4x faster than 8 (0.96-2.5x), 32 no faster; N <= 1,024: 8 as fast)
THETA = 1.0  # step j (1-based) has length THETA / j**DECAY relative to ||v||, ||supergradient||
DECAY = 0.5  # NREF, THETA, DECAY: measured on real SmolLM2 rows (BENCHMARKS.md, enumeration and exact solvers)
THETA_LONG = 1.4  # ... and with the NREF_LONG steps of the search on long rows (built-in N ~ 4,096 rows 23 and 49
DECAY_LONG = 0.9  # from their optima, one thread: 0.80x and 0.93x the time of 1.0 / 0.5; BENCHMARKS.md, issue 15)


def search_steps(N: int) -> tuple:
    """``(nref, theta, decay, nwarm)``: the search's supergradient steps per node test and their lengths on a
    row of ``N`` keys, and the steps of a test that starts from its level's last direction (0: every test
    starts cold); the long rows' ones from ``LONG_ROWS`` keys on."""
    return (NREF_LONG, THETA_LONG, DECAY_LONG, WARM_STEPS) if N >= LONG_ROWS else (NREF, THETA, DECAY, 0)


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


SAFE = 1e-6  # relative margin of the early-stop bounds (far above any float64 rounding here)


@njit(cache=True)
def suffix_max(nrm):
    """(N + 1,) array: ``mx[j] = max(nrm[j:])`` (``mx[N] = 0``), the early-stop bound of a scan."""
    N = nrm.shape[0]
    mx = np.zeros(N + 1)
    for j in range(N - 1, -1, -1):
        mx[j] = max(mx[j + 1], nrm[j])
    return mx


def mass_tops(pw, s):
    """(N + 1, s + 1) array: ``wtop[j, r]`` = the sum of the r largest masses among keys ``j..N-1``
    (fewer when fewer are left; row N and column 0 are 0): the box tables' upper sums of the one
    column ``pw``. It bounds the kept mass of a node's completions (the mass test) and, with
    ``r = 1``, the mass of any later key (the early stops), in any key order."""
    N = pw.shape[0]
    lo = np.zeros((N + 1, s + 1, 1))
    hi = np.zeros((N + 1, s + 1, 1))
    _box_tables(np.ascontiguousarray(pw, dtype=np.float64).reshape(N, 1), s, lo, hi)
    return np.ascontiguousarray(hi[:, :, 0])


DIRN = 6  # the direction state a passing projection test leaves for _exclude (node_scratch's dirn)
SCAN_BLOCK = 64  # keys a step scan values in one vectorised pass before it inserts them (_step_scan)
WARM_STEPS = 4  # the search's steps on long rows when a test starts from its level's last direction (warm start)
WARM_RESTART = 4.0  # ... whose step lengths go on as from step WARM_RESTART + 1 (at most the steps done)
# (dall4096 rows 23 / 49 from their optima, one thread, beside another run: cold 2.85 / 13.56 s; 4 warm steps
# from step 5 2.45 / 8.99 s, from step 1 2.41 / 9.71, from step 9 2.71 / 9.71, going on from the steps done
# 2.69 / 13.57 (alone); 2 warm steps 2.37 / 8.95, 8 3.48 / 14.79; BENCHMARKS.md, issue 15)
WARM_FIELDS = 9  # a level's kept direction: valid, alpha, vv, vy, bz, nz, keys, hv, steps done (warm_scratch)
WARM_KEYS = 64  # a level's direction keeps at most WARM_KEYS * s keys (then a test starts cold)
ROW_SLOTS = 64  # Gram rows a projection test keeps compacted to its candidate positions (node_scratch's gc)


@njit(cache=True)
def key_table(nrm, pw, wtop):
    """(N, 4) array: each key's ``(mx[k], wtop[k, 1], nrm[k], pw[k])`` (``mx = suffix_max(nrm)``) in one row:
    what a scan (its stop bound and reduced cost), ``_exclude`` and the leaves read of a key, in one cache line
    instead of four arrays' (N ~ 4,000: the scans' keys are scattered over the row). The same values, so the
    search is the same bit for bit; proofs from the optimum on one thread took 0.95-0.98x the time (built-in
    rows 49, 283, 421; BENCHMARKS.md)."""
    N = nrm.shape[0]
    mx = suffix_max(nrm)
    kt = np.empty((N, 4))
    for k in range(N):
        kt[k, 0] = mx[k]
        kt[k, 1] = wtop[k, 1]
        kt[k, 2] = nrm[k]
        kt[k, 3] = pw[k]
    return kt


@njit(cache=True)
def node_scratch(nrm, pw, wtop, s, nref):
    """The node tests' arrays for one search or frontier pass over ``nrm`` (N,) norms, ``pw`` (N,) masses and
    ``wtop`` (``mass_tops``), ``nref`` steps: ``(kt, buf, bidx, h, zs, zc, keys, dirn, gc, gk)`` (``kt =
    key_table(nrm, pw, wtop)``, ``keys = arange(N)``, the candidate list of a range node ``R = k..N-1``; the
    rest scratch: ``gc`` (ROW_SLOTS + 4, N) holds the compacted Gram rows of ``_node_lb_ok``'s steps, then a
    scan's reduced costs, the keys its steps proved excluded, and each position's norm and mass (copies of
    ``kt``'s, so the scans read them contiguously), by position; ``gk`` (3, max(ROW_SLOTS, s)) is
    the rows' slot table)."""
    N = nrm.shape[0]
    return (key_table(nrm, pw, wtop), np.empty(s), np.zeros(s, np.int64), np.zeros(N),
            np.zeros(nref * s, np.int64), np.zeros(nref * s), np.arange(N), np.zeros(DIRN),
            np.empty((ROW_SLOTS + 4, N)), np.zeros((3, max(ROW_SLOTS, s)), np.int64))


def warm_scratch(N: int, s: int):
    """Each level's direction kept between its tests (the search's ``_node_lb_ok(..., wst)``): ``(wh, wz, wc,
    wst)``, the step sums ``h`` by position (s + 1, N), the direction's keys and coefficients (s + 1,
    WARM_KEYS * s), and its scalars (s + 1, WARM_FIELDS; ``wst[t, 0] = 0``: none)."""
    return (np.zeros((s + 1, N)), np.zeros((s + 1, WARM_KEYS * s), np.int64), np.zeros((s + 1, WARM_KEYS * s)),
            np.zeros((s + 1, WARM_FIELDS)))


@njit(cache=True)
def _insert(x, kk, n, r, buf, bidx):
    """Insert value x (key kk) into the ascending list buf[:n] of the r smallest; returns the new n."""
    if n < r:
        pos = n
        n += 1
    elif x < buf[r - 1]:
        pos = r - 1
    else:
        return n
    while pos > 0 and buf[pos - 1] > x:
        buf[pos] = buf[pos - 1]
        bidx[pos] = bidx[pos - 1]
        pos -= 1
    buf[pos] = x
    bidx[pos] = kk
    return n


@njit(cache=True)
def _sum_r(buf, r):
    acc = 0.0
    for i in range(r):
        acc += buf[i]
    return acc


@njit(cache=True)
def _h_at(kk, G, zs, zc, nzl):
    """The steps' sum for key kk, sum_j zc[j] G[zs[j], kk], in list order (as the steps would have added it)."""
    acc = 0.0
    uk = uint64(kk)
    for j in range(nzl):
        acc += zc[j] * G[uint64(zs[j]), uk]
    return acc


@njit(cache=True)
def _step_scan(L, p0, ln, r, cst, h, mk, xs, kt, G, zs, zc, nz, alpha, inv, err, c, lp, lam, hv,
               marking, buf, bidx, nrp, pwp):
    """One supergradient step's scan of ``_node_lb_ok``: the r smallest ``g`` over ``L[p0:ln]`` into
    ``buf``/``bidx`` (early-stopped as the test's first scan), filling the step sums ``h`` of the positions
    read for the first time (from ``hv`` on) and, when ``marking``, the reduced costs ``xs``. Returns
    ``(hv, iend, xmax)``: how far ``h`` is filled, the end of the positions read, their largest ``g``
    (marking scans). Two loops, the positions already filled and then the new ones, so that the first (most
    of a scan) holds few values and keeps them in registers. The first goes by blocks of SCAN_BLOCK positions:
    it values a block into ``xs`` in one pass (contiguous reads of ``cst``, ``h`` and the position copies
    ``nrp``/``pwp`` of the norms and masses: it vectorises), then inserts; the early stop is checked at each
    block's start, so a block may read keys past the stop, which cannot enter the r smallest (the same bound),
    and the r smallest are those of the key-by-key scan bit for bit (``iend`` and the marked keys may reach
    further: marks with this scan's own values, as valid). ``inv = 1 / ||v||`` (the caller checks ``||v|| > 0``;
    a product, not a division a key, with 2 eps more in ``err``). The loops' shared body is written out twice on
    purpose: as a Numba ``inline="always"`` helper it made the search 5-6x slower (row 49 from its optimum:
    72-81 s against 12.3-12.8 s; BENCHMARKS.md, issue 15)."""
    n = 0
    worst = np.inf
    xmax = -np.inf
    stop = min(hv, ln)
    i = p0
    while i < stop:
        ui = uint64(i)
        uk = uint64(L[ui])
        if worst <= -(c * kt[uk, 0] + lp * kt[uk, 1]):
            return hv, i, xmax
        e = min(i + SCAN_BLOCK, stop)
        for j in range(i, e):
            uj = uint64(j)
            xs[uj] = ((alpha * cst[uj] + h[uj]) * inv - err * nrp[uj]) - lam * pwp[uj]
        for j in range(i, e):
            uj = uint64(j)
            x = xs[uj]
            if marking:
                xmax = max(xmax, x)
            if x < worst or n < r:
                n = _insert(x, j, n, r, buf, bidx)
                if n == r:
                    worst = buf[r - 1]
        i = e
    for i in range(stop, ln):
        ui = uint64(i)
        kk = L[ui]
        uk = uint64(kk)
        if worst <= -(c * kt[uk, 0] + lp * kt[uk, 1]):
            return hv, i, xmax
        h[ui] = _h_at(kk, G, zs, zc, nz)
        mk[ui] = 0.0
        nrp[ui] = kt[uk, 2]
        pwp[ui] = kt[uk, 3]
        hv = i + 1
        x = ((alpha * cst[ui] + h[ui]) * inv - err * kt[uk, 2]) - lam * kt[uk, 3]
        if marking:
            xs[ui] = x
            xmax = max(xmax, x)
        if n < r or x < worst:
            n = _insert(x, i, n, r, buf, bidx)
            if n == r:
                worst = buf[r - 1]
    return hv, ln, xmax


@njit(cache=True)
def _node_lb_ok(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, lam, gamma, kt, wtop,
                buf, bidx, h, zs, zc, nref, theta, decay, dirn, gc, gk, nwarm=0, wst=None):
    """True when node (T = level t, candidates ``R = L[p0:ln]``) may contain a set with E < lam.

    ``L`` holds key indices in increasing order (the search's order); a range node ``R = k..N-1``
    is ``(keys, k, N)`` with ``keys = arange(N)`` from ``node_scratch``. The box and mass bounds are
    those of all keys ``>= L[p0]`` (a superset of R, so still bounds).

    The r smallest of ``g_kk = <a_kk, u> - lam p_kk`` over R are found by a scan in the search's
    order that stops at the first kk where ``buf[r - 1] <= -(c mx[kk] + lam wtop[kk, 1])``
    (``mx = suffix_max(nrm)``; with ``nrm`` and ``pw``, read from ``kt``, ``key_table``; ``c`` >= 1 + the
    relative error of ``<a_kk, u>``): no later key can
    enter, since ``g >= -||a|| - lam p`` and both maxima are over the keys from kk on. The sum and
    the keys found are those of the full scan, so the test (and the search) is unchanged; in the
    search's order (norms descending) a scan reads a small share of R on long rows.
    Scratch: ``buf``/``bidx`` (s,) (the r smallest and their positions in ``L``), ``h`` (N,) (the
    steps' sums by position in ``L``), ``zs``/``zc`` (nref * s,) (the supergradient steps' keys and
    coefficients, so ``h`` is filled only as far as a scan reads), ``gc``/``gk`` (ROW_SLOTS + 4, N) /
    (3, max(ROW_SLOTS, s)) (the steps' Gram rows compacted to the positions, see the step loop; then the
    marking scans' reduced costs and marks). ``wst`` (WARM_FIELDS,) with ``nwarm > 0`` (the search on long
    rows): ``h``, ``zs``, ``zc`` are then the level's own (``warm_scratch``), the direction's coefficients are kept
    one per key, and the test starts from the direction the level's last test ended with when ``wst[0] == 1``
    (that test passed; the caller sets ``wst[0] = 0`` at a new T), takes ``nwarm`` steps with lengths going on
    as from step WARM_RESTART + 1, and marks in every scan; a test that passes leaves its direction in ``wst``
    (``_exclude`` moves the sums with their keys). When the node passes after the projection test, ``dirn``
    (DIRN,) holds its last direction for ``_exclude`` (``dirn[0] = 1``; 0 when there is none), and
    ``gc[ROW_SLOTS + 1, p0:hv]`` is 1 at the keys the scans of the last half of the steps proved to be in no
    completion with E < lam (their reduced costs, as ``_exclude``'s, with each scan's direction).
    """
    N, d = A.shape
    r = s - t
    dirn[0] = 0.0
    if ln - p0 < r:
        return False
    k = L[p0]
    wmax = ws[t] + wtop[k, r]
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
    if t == 0:
        return True
    ny2 = 0.0
    for q in range(d):
        ny2 += ys[t, q] * ys[t, q]
    ny = np.sqrt(ny2)
    if not ny > 0.0:
        return True
    err = (gamma + 2.0 * _EPS) * bs[t] / ny  # (+ 2 eps: the product by 1 / ny rounds twice)
    inv = 1.0 / ny
    c = 1.0 + 2.0 * err + SAFE
    lp = lam * (1.0 + SAFE)
    # The scans index with unsigned integers (no negative-index wrap: fewer instructions a key)
    # and keep buf[r - 1] as ``worst`` (inf until r keys are in): a key that cannot enter the r
    # smallest is not passed to _insert, which would return it unchanged.
    cst = cs[t]
    xs = gc[ROW_SLOTS]  # a step scan's reduced costs, by position (read after a marking scan)
    mk = gc[ROW_SLOTS + 1]  # 1 where a scan proved the key excluded (valid for L[p0:hv])
    nrp = gc[ROW_SLOTS + 2]  # each position's norm and mass (kt[L[i], 2:4]), filled as far as h (the
    pwp = gc[ROW_SLOTS + 3]  # step scans' first loop reads them contiguously: it vectorises)
    kept = dirn  # the level's kept direction (wst; typed as an array where wst is None, then unused)
    merge = False
    if wst is not None:
        kept = wst
        merge = nwarm > 0
    warm = merge and kept[0] > 0.0 and kept[6] + nwarm * r <= zs.shape[0]
    if merge:
        kept[0] = 0.0  # valid again only where this test passes (its steps change h, zs and zc)
    n = 0
    if warm:
        # the direction the last test at this level ended with (same T), and its sums h by position
        alpha = kept[1]
        vv = kept[2]
        vy = kept[3]
        bz = kept[4]
        nz = int(kept[5])
        nu = int(kept[6])
        hv = max(int(kept[7]), p0)
        j0 = min(kept[8], WARM_RESTART)
        for i in range(p0, hv):
            ui = uint64(i)
            uk = uint64(L[ui])
            mk[ui] = 0.0
            nrp[ui] = kt[uk, 2]
            pwp[ui] = kt[uk, 3]
        nv = 1.0  # (nv and dot: from the kept scalars, at step -1)
        dot = 0.0
        first = -1  # step -1: the first scan, with the kept direction as it stands
        nsteps = nwarm
    else:
        worst = np.inf
        hv = p0  # h (the steps' sums, 0 before the first) is filled for the keys L[p0:hv]
        for i in range(p0, ln):
            ui = uint64(i)
            kk = L[ui]
            uk = uint64(kk)
            if worst <= -(c * kt[uk, 0] + lp * kt[uk, 1]):
                break
            x = (cst[ui] * inv - err * kt[uk, 2]) - lam * kt[uk, 3]
            if n < r or x < worst:
                n = _insert(x, i, n, r, buf, bidx)
                if n == r:
                    worst = buf[r - 1]
            h[ui] = 0.0
            mk[ui] = 0.0
            nrp[ui] = kt[uk, 2]
            pwp[ui] = kt[uk, 3]
            hv = i + 1
        tot = ny - lam * ws[t] + _sum_r(buf, r)
        if tot >= 0.0:
            return False
        # supergradient ascent on u: the test value is concave in u and its supergradient at u
        # is g = y_T + sum_Z a_z (Z the minimising completion). The direction is kept as
        # v = alpha y_T + sum_j c_j a_{z_j}, and h[i] = sum_j c_j <a_{z_j}, a_L[i]> (from the
        # Gram matrix) is accumulated step by step, so a step costs r (keys read) + r^2, with no
        # d-vector: ||v||^2 and <v, y_T> are updated from Gram entries too.
        # Rounding: bz >= sum |coefficients| * ||a|| bounds every Gram-based quantity, so
        # |error of ||v||^2| <= kap2 bz^2 and |error of <v, y_T>| <= kap2 bz ||y_T||_1-ish
        # (bz bs[t]); <v, a_kk> is off by at most (gamma + 2 (nz + 2) eps) bz ||a_kk||, and its
        # product by inv = fl(1 / nv) by 2 eps more of bz ||a_kk|| / nv (hence nz + 3 in err).
        # Using nv = sqrt(vv + kap2 bz^2) >= ||v|| and dot = vy - kap2 bz bs[t] <= <v, y_T>
        # keeps <y_S, v> / nv <= ||y_S||, so the test stays a proof.
        alpha = 1.0 / ny
        vv = ny2 * alpha * alpha
        vy = ny2 * alpha
        bz = alpha * bs[t]
        nz = 0
        nv = 1.0
        dot = ny
        nu = 0
        j0 = 0.0
        first = 0
        nsteps = nref
    nslot = 0
    for step in range(first, nsteps):
        if step >= 0:  # (step -1, a warm start's first scan, takes no step before it)
            vg = vy
            yg = ny2
            gg = ny2
            for i in range(r):
                zi = bidx[i]
                z = L[zi]
                vg += alpha * cst[zi] + h[zi]
                yg += cst[zi]
                gg += 2.0 * cst[zi]
                for i2 in range(r):
                    gg += G[z, L[bidx[i2]]]
            if not gg > 0.0:
                break
            eta = theta / ((j0 + step + 1.0) ** decay * np.sqrt(gg))
            vv += 2.0 * eta * vg + eta * eta * gg
            vy += eta * yg
            alpha += eta
            bz += eta * bs[t]
            # h[p0:hv] += eta G[z, L[p0:hv]] for each key z of the completion, in bidx order. z's Gram
            # row is kept compacted to these positions (gc[slot, :hv - p0]; gk[0, slot] = z,
            # gk[1, slot] = how far it is filled; gk[2, i] = the slot of the completion's i-th key), so
            # a later step of this test that meets z again adds a contiguous row instead of gathering
            # G[z, L[i]] again; the rows of a step are added in one pass for up to four keys. The same
            # additions in the same order, bit for bit. With every slot taken, a row is gathered as
            # before. Written here, not in a function: a call counts references to its arrays (20 M
            # calls on a hard row). Unsigned indices: no negative-index wrap, so the loops vectorise.
            m = hv - p0
            u0 = uint64(p0)
            for i in range(r):
                z = L[bidx[i]]
                bz += eta * nrm[z]
                if merge:  # one coefficient a key (the direction outlives the test: a new position's sum reads
                    # nu <= nz terms; a merged coefficient's rounding is at most its terms' count of eps, so the
                    # sums stay within the 2 (nz + 2) eps of err, nz counting every step length added)
                    jz = -1
                    for j in range(nu):
                        if zs[j] == z:
                            jz = j
                            break
                    if jz < 0:
                        zs[nu] = z
                        zc[nu] = eta
                        nu += 1
                    else:
                        zc[jz] += eta
                else:
                    zs[nz + i] = z
                    zc[nz + i] = eta
                sl = -1
                for j in range(nslot):
                    if gk[0, j] == z:
                        sl = j
                        break
                if sl < 0 and nslot < ROW_SLOTS:
                    sl = nslot
                    nslot += 1
                    gk[0, sl] = z
                    gk[1, sl] = 0
                gk[2, i] = sl
                if sl >= 0:
                    for ii in range(gk[1, sl], m):
                        gc[sl, uint64(ii)] = G[z, uint64(L[u0 + uint64(ii)])]
                    if m > gk[1, sl]:
                        gk[1, sl] = m
            i = 0
            while i < r:
                sa = gk[2, i]
                if sa < 0:
                    z = L[bidx[i]]
                    for ii in range(p0, hv):
                        h[ii] += eta * G[z, L[ii]]
                    i += 1
                elif i + 3 < r and gk[2, i + 1] >= 0 and gk[2, i + 2] >= 0 and gk[2, i + 3] >= 0:
                    sb = gk[2, i + 1]
                    sc = gk[2, i + 2]
                    sd = gk[2, i + 3]
                    for ii in range(m):
                        ui = uint64(ii)
                        h[u0 + ui] = (((h[u0 + ui] + eta * gc[sa, ui]) + eta * gc[sb, ui]) + eta * gc[sc, ui]) \
                            + eta * gc[sd, ui]
                    i += 4
                elif i + 1 < r and gk[2, i + 1] >= 0:
                    sb = gk[2, i + 1]
                    for ii in range(m):
                        ui = uint64(ii)
                        h[u0 + ui] = (h[u0 + ui] + eta * gc[sa, ui]) + eta * gc[sb, ui]
                    i += 2
                else:
                    for ii in range(m):
                        ui = uint64(ii)
                        h[u0 + ui] += eta * gc[sa, ui]
                    i += 1
            nz += r
        kap2 = 4.0 * (d + nz + 2 * s + 8) * _EPS
        nv = np.sqrt(max(vv, 0.0) + kap2 * bz * bz)
        if not nv > 0.0:
            return True  # (no direction left for _exclude)
        dot = vy - kap2 * bz * bs[t]
        err = (gamma + 2.0 * (nz + 3) * _EPS) * bz / nv
        inv = 1.0 / nv
        c = 1.0 + 2.0 * err + SAFE
        # the scans of the last half of the steps mark the keys they exclude, for _exclude (dall4096 rows 23
        # and 49 from their optima, one thread: the last half 2.38-2.42 s and 13.7-13.9 s, every scan
        # 2.39-2.50 and 14.3-14.8, from step 5 of 16 2.45-2.58 and 13.7-13.8, none 2.64-2.85 and 14.2-14.3;
        # BENCHMARKS.md, issue 15)
        marking = r >= 2 and (warm or step >= nref // 2)
        hv, iend, xmax = _step_scan(L, p0, ln, r, cst, h, mk, xs, kt, G, zs, zc, nu if merge else nz, alpha, inv,
                                    err, c, lp, lam, hv, marking, buf, bidx, nrp, pwp)
        tot = dot / nv - lam * ws[t] + _sum_r(buf, r)
        if tot >= 0.0:
            return False
        # this scan's reduced costs (as _exclude's, with this direction): a key j it read with
        # base + x_j >= 0 (base = tot less the r-th smallest) is in no completion with E < lam
        if marking and tot - buf[r - 1] + xmax >= 0.0:
            base = tot - buf[r - 1]
            for i in range(p0, iend):
                if base + xs[uint64(i)] >= 0.0:
                    mk[uint64(i)] = 1.0
    if merge:  # kept for the next test at this level (same T)
        kept[0] = 1.0
        kept[1] = alpha
        kept[2] = vv
        kept[3] = vy
        kept[4] = bz
        kept[5] = nz
        kept[6] = nu
        kept[7] = hv
        kept[8] = j0 + nsteps
    # the last direction (the one buf/bidx were scanned with), for _exclude
    dirn[0] = 1.0
    dirn[1] = alpha
    dirn[2] = nv
    dirn[3] = dot
    dirn[4] = err
    dirn[5] = hv
    return True


@njit(cache=True)
def _among(i, bidx, m):
    """Whether position ``i`` is one of ``bidx[:m]`` (the positions of the m smallest a scan kept)."""
    for j in range(m):
        if bidx[j] == i:
            return True
    return False


@njit(cache=True)
def _exclude(t, L, p0, ln, s, ws, cs, lam, kt, buf, bidx, h, dirn, gc, wst=None):
    """Drop from ``L[p0:ln]`` (in place, order kept, with their ``cs[t]`` entries) every key in no
    completion with E < lam; returns the new end. Valid after ``_node_lb_ok`` passed this node with
    ``dirn[0] == 1``. With ``wst`` (the level's kept direction, ``_node_lb_ok``'s), the step sums ``h`` move with
    their keys and ``wst[7]`` is set to where they end.

    Reduced-cost fixing with the test's last direction u: for a completion Z (r keys of R) that
    holds key j, ``<y_T + y_Z, u> - lam w(T + Z) >= <y_T, u> - lam w_T + g_j + (sum of the r - 1
    smallest g over R)``, with ``g`` the lower ends the scans use (``buf`` holds the r smallest).
    Where that is >= 0, ``||y_S|| >= <y_S, u> >= lam w_S`` for every such S: j is dropped (for this
    node's subtree and every later sibling, whose candidates are a subset). Only the keys the scans
    read are evaluated (their sums ``h`` are at hand; on long rows the rest are light keys, whose
    evaluation cost more than it saved); from the first key where
    ``base >= c mx[kk] + lam wtop[kk, 1]`` (``g >= -||a|| - lam p``) on, none can stay but the
    r - 1 smallest. Every earlier direction proves the same for the keys its scan read: the scans of the
    test's last half of steps marked those they proved (``gc[ROW_SLOTS + 1]``), and these go too (on real
    rows 7-20 % fewer nodes than with the last direction alone; BENCHMARKS.md, issue 15).
    """
    r = s - t
    if dirn[0] != 1.0 or r < 2:
        return ln
    alpha = dirn[1]
    nv = dirn[2]
    err = dirn[4]
    hv = int(dirn[5])
    base = dirn[3] / nv - lam * ws[t]
    inv = 1.0 / nv
    for i in range(r - 1):
        base += buf[i]
    c = 1.0 + 2.0 * err + SAFE
    lp = lam * (1.0 + SAFE)
    cst = cs[t]
    mk = gc[ROW_SLOTS + 1]
    j = p0
    moveh = wst is not None
    hnew = p0  # where h ends after the compaction (its sums move with their keys, for the next test's start)
    for i in range(p0, ln):
        ui = uint64(i)  # unsigned indices: no negative-index wrap
        kk = L[ui]
        uk = uint64(kk)
        if base >= c * kt[uk, 0] + lp * kt[uk, 1]:  # no key from here on can stay
            for i2 in range(i, ln):
                if _among(i2, bidx, r - 1):
                    L[j] = L[i2]
                    cst[j] = cst[i2]
                    if moveh and i2 < hv:
                        h[j] = h[i2]
                        hnew = j + 1
                    j += 1
            if wst is not None:
                wst[7] = hnew
            return j
        if i >= hv:  # a key no scan read (on long rows most are light): kept, not evaluated
            L[j] = kk
            cst[j] = cst[ui]
            j += 1
            continue
        g = ((alpha * cst[ui] + h[ui]) * inv - err * kt[uk, 2]) - lam * kt[uk, 3]
        if mk[ui] == 0.0 and (base + g < 0.0 or _among(i, bidx, r - 1)):
            L[j] = kk
            cst[j] = cst[ui]
            if moveh:
                h[j] = h[ui]
            j += 1
            hnew = j
    if wst is not None:
        wst[7] = hnew
    return j


RESCUE_STEPS = 128  # supergradient steps of a rescue test (node_scratch must get at least this many)
RESCUE_SHARES = (2.0 ** -2, 2.0 ** -4, 2.0 ** -8, 2.0 ** -12)  # its lams, as shares of the incumbent, tried in turn
# (on 13 open N ~ 4,096 rows outside layer 0, of the first-level nodes an 8-step test at 2**-12 of the value left
# at 0, 12-1,490 a row, 128 steps left none on 3 rows and 1-83 on the others, in 0.03-0.4 s a row; 512 or 2,048
# steps leave about half of those; on layer-0 rows 236-758 of ~3,000; BENCHMARKS.md, issue 15)


@njit(cache=True)
def _node_value(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, kt, wtop,
                buf, bidx, h, zs, zc, dirn, iters, gc, gk, incumbent=0.0):
    """A proved lower bound on E over node (level t, candidates ``L[p0:ln]``), capped at ``top``.

    ``_node_lb_ok(lam) == False`` proves every completion has ``E >= lam``; the largest such lam
    on a bisection of ``[0, top]`` (``iters`` halvings, NREF steps a test) is returned (``top`` itself
    when proved there). When it proves nothing and ``incumbent`` > 0, rescue tests with RESCUE_STEPS
    steps (the long rows' step lengths) try ``lam = share * incumbent`` for each of RESCUE_SHARES below
    ``top``, largest first, and return the first proved (0 when none is): the 8 steps of the bisection's
    tests often stop short of a direction that exists. Lams relative to the incumbent, not to ``top``,
    so that a running minimum passed as ``top`` does not shrink geometrically from node to node; and a cap
    at most the second share (a running minimum a rescue set) gets a rescue test at ``top`` itself first,
    before the bisection.
    ``zs``/``zc`` must hold ``RESCUE_STEPS * s`` entries then (``node_scratch(..., RESCUE_STEPS)``).
    """
    if not top > 0.0:  # (a cap at 0: nothing to prove; the tests would only confirm E >= 0)
        return 0.0
    if not _node_lb_ok(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, kt,
                       wtop, buf, bidx, h, zs, zc, NREF, THETA, DECAY, dirn, gc, gk):
        return top
    if incumbent > 0.0 and top <= RESCUE_SHARES[1] * incumbent:
        # a cap at or below the first rescue's lam (a running minimum that a rescue set): that test first
        if not _node_lb_ok(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, kt,
                           wtop, buf, bidx, h, zs, zc, RESCUE_STEPS, THETA_LONG, DECAY_LONG, dirn, gc, gk):
            return top
    lo_l = 0.0
    hi_l = top
    for _ in range(iters):
        mid = 0.5 * (lo_l + hi_l)
        if _node_lb_ok(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, mid, gamma, kt,
                       wtop, buf, bidx, h, zs, zc, NREF, THETA, DECAY, dirn, gc, gk):
            hi_l = mid
        else:
            lo_l = mid
    if lo_l == 0.0 and incumbent > 0.0:
        for share in RESCUE_SHARES:
            lam = share * incumbent
            if lam >= top:
                continue
            if not _node_lb_ok(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, lam, gamma, kt,
                               wtop, buf, bidx, h, zs, zc, RESCUE_STEPS, THETA_LONG, DECAY_LONG, dirn, gc, gk):
                return lam
    return lo_l
