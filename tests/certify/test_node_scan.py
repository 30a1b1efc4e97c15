"""The projection test's early-stopped scans (``node_tests._node_lb_ok``) against a full NumPy scan.

The Numba test stops reading the keys once no later one can enter the r smallest and fills the
supergradient sums ``h`` only as far as it reads, by position in the candidate list, from Gram rows it
keeps compacted to those positions (the step loop). The reference below computes every quantity over
all of R, in the same floating-point order, so the two must agree bit for bit: the verdict and the
r smallest (values and keys) of the last scan, on range nodes and on thinned candidate lists.
"""

import numpy as np
import pytest

from forcedweight.certify.solvers.node_tests import (DECAY, DIRN, NREF, SCAN_BLOCK, THETA, _EPS, _node_lb_ok,
                                                     mass_tops, key_table, node_scratch, suffix_max)
from forcedweight.certify.solvers.search_row import prepare, search_order
from forcedweight.core import operator as op


def _reference(t, R, s, pw, wtop, nrm, G, ys, ws, bs, cs, lam, gamma, nref):
    """Verdict and last r smallest of the mass and projection tests, every key of R (sorted) read."""
    N = pw.shape[0]
    r = s - t
    k = R[0]
    if R.size < r or ws[t] + wtop[k, r] <= 0.0:
        return False, None
    ny2 = 0.0
    for q in range(ys.shape[1]):
        ny2 += ys[t, q] * ys[t, q]
    ny = np.sqrt(ny2)
    if t == 0 or not ny > 0.0:
        return True, None

    def smallest(g):
        z = R[np.argsort(g[R], kind="stable")[:r]]  # ties to the lower key, as the insertion does
        acc = 0.0
        for x in g[z]:
            acc += x
        return z, acc

    err = (gamma + 2.0 * _EPS) * bs[t] / ny
    g = np.full(N, np.nan)
    g[R] = (cs[t, R] * (1.0 / ny) - err * nrm[R]) - lam * pw[R]
    z, acc = smallest(g)
    if ny - lam * ws[t] + acc >= 0.0:
        return False, (g[z], z)
    alpha, nz = 1.0 / ny, 0
    vv = ny2 * alpha * alpha
    vy = ny2 * alpha
    bz = alpha * bs[t]
    h = np.zeros(N)
    for step in range(nref):
        vg, yg, gg = vy, ny2, ny2
        for zi in z:
            vg += alpha * cs[t, zi] + h[zi]
            yg += cs[t, zi]
            gg += 2.0 * cs[t, zi]
            for z2 in z:
                gg += G[zi, z2]
        if not gg > 0.0:
            break
        eta = THETA / ((step + 1.0) ** DECAY * np.sqrt(gg))
        vv += 2.0 * eta * vg + eta * eta * gg
        vy += eta * yg
        alpha += eta
        bz += eta * bs[t]
        for zi in z:
            bz += eta * nrm[zi]
            h[R] += eta * G[zi, R]
        nz += r
        kap2 = 4.0 * (ys.shape[1] + nz + 2 * s + 8) * _EPS
        nv = np.sqrt(max(vv, 0.0) + kap2 * bz * bz)
        if not nv > 0.0:
            break
        dot = vy - kap2 * bz * bs[t]
        err = (gamma + 2.0 * (nz + 3) * _EPS) * bz / nv
        g[R] = ((alpha * cs[t, R] + h[R]) * (1.0 / nv) - err * nrm[R]) - lam * pw[R]
        z, acc = smallest(g)
        if dot / nv - lam * ws[t] + acc >= 0.0:
            return False, (g[z], z)
    return True, (g[z], z)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("order_by", ["search", "mass"])
@pytest.mark.parametrize("layout", ["range", "list"])
def test_early_stopped_scans_equal_the_full_scan(seed, order_by, layout):
    """Heavy-tailed masses (most keys light, as on long real rows): the scans stop early (the
    untouched tail of h shows it), and verdicts and r smallest equal the full reference exactly.
    ``range``: the node R = k..N-1 of ``keys = arange(N)``; ``list``: R a thinned sorted subset of the
    keys from k on, placed after other keys in its list (as the search's levels are after exclusion),
    so positions and keys differ; the compacted Gram rows' scratch is reused from trial to trial."""
    compared, stopped, _ = _compare_scans(seed, order_by, layout, 400, 60)
    assert compared >= 30
    assert stopped >= 10  # the early stop happened (h left untouched beyond the last key read)


@pytest.mark.parametrize("seed,layout", [(0, "range"), (1, "list")])
def test_scans_by_blocks_equal_the_full_scan_on_long_lists(seed, layout):
    """N = 3,000 with masses less heavy-tailed (log-normal, sigma 1): the step scans read several SCAN_BLOCK
    blocks and stop inside one (the stop is checked at each block's start, so a block reads keys past it);
    verdicts and r smallest still equal the key-by-key reference bit for bit."""
    compared, stopped, long_scans = _compare_scans(seed, "search", layout, 3000, 30, spread=1.0)
    assert compared >= 15 and stopped >= 5
    assert long_scans >= 5  # scans that read more than two blocks


def _compare_scans(seed, order_by, layout, N, trials, spread=3.0):
    """Random nodes of a row of N keys with log-normal masses (sigma ``spread``: 3 is heavy-tailed, most scans
    stop within a block; 1 makes them read several) against ``_reference``; returns (nodes compared, scans that
    stopped early, scans that read more than 2 SCAN_BLOCK positions)."""
    rng = np.random.default_rng(seed)
    d, s = 6, 6
    p = np.exp(spread * rng.normal(size=N))
    p /= p.sum()
    V = rng.normal(size=(N, d))
    A0 = op.centred_contributions(p, V)
    order = None if order_by == "search" else op.rank_order(p)  # search or mass order: the scans are order-free
    A, pw, nrm, G, lo, hi, _, _, gamma, wtop = prepare(A0, p, s, order)[:10]
    *_, gc, gk = node_scratch(nrm, pw, wtop, s, NREF)  # the search's scratch layout, reused (stale) between trials
    gc[:] = np.nan
    stopped = compared = long_scans = 0
    for trial in range(trials):
        t = int(rng.integers(1, s))
        T = np.sort(rng.choice(40, size=t, replace=False))
        k = int(rng.integers(T[-1] + 1, 60))
        if layout == "range":
            L, p0, R = np.arange(N), k, np.arange(k, N)
        else:
            R = np.flatnonzero(rng.random(N - k) < rng.choice([0.1, 0.5, 0.9])) + k
            if R.size == 0:
                R = np.array([k])
            before = np.sort(rng.choice(np.arange(R[0]), size=min(int(rng.integers(0, 30)), R[0]), replace=False))
            L = np.concatenate([before, R, np.full(N, -1)]).astype(np.int64)
            p0 = before.size
        ys = np.zeros((s + 1, d))
        ws, bs, cs = np.zeros(s + 1), np.zeros(s + 1), np.zeros((s + 1, N))
        for j in T:  # level t in the search's order of sums
            ys[t] += A[j]
            ws[t] += pw[j]
            bs[t] += nrm[j]
            cs[t] += G[j]
        e_T = np.linalg.norm(ys[t]) / ws[t]
        lam = e_T * rng.choice([0.05, 0.3, 0.8, 1.5])
        nref = int(rng.choice([0, 1, NREF]))
        buf, bidx = np.full(s, np.nan), np.zeros(s, np.int64)
        h = np.full(N, np.nan)
        zs, zc = np.zeros(NREF * s, np.int64), np.zeros(NREF * s)
        cs_at = np.where(L >= 0, cs[:, L], np.nan)  # the search keeps cs by position in L
        ok = _node_lb_ok(t, L, p0, p0 + R.size, s, A, pw, nrm, G, ys, ws, bs, cs_at, lo, hi, False, lam, gamma,
                         key_table(nrm, pw, wtop), wtop, buf, bidx, h, zs, zc, nref, THETA, DECAY,
                         np.zeros(DIRN), gc, gk)
        ref_ok, last = _reference(t, R, s, pw, wtop, nrm, G, ys, ws, bs, cs, lam, gamma, nref)
        assert ok == ref_ok
        if last is not None:
            r = s - t
            np.testing.assert_array_equal(buf[:r], last[0])  # bit for bit
            np.testing.assert_array_equal(L[bidx[:r]], last[1])  # bidx: positions in L
            compared += 1
        stopped += bool(np.isnan(h[p0:p0 + R.size]).any())
        long_scans += int(np.count_nonzero(~np.isnan(h[p0:p0 + R.size])) > 2 * SCAN_BLOCK)
    return compared, stopped, long_scans


def test_suffix_max():
    nrm = np.array([3.0, 1.0, 2.0, 0.5])
    np.testing.assert_array_equal(suffix_max(nrm), [3.0, 2.0, 2.0, 0.5, 0.0])


@pytest.mark.parametrize("seed", range(4))
def test_mass_tops_against_sorting(seed):
    """wtop[j, r] = the sum of the r largest masses from key j on (fewer when fewer are left)."""
    rng = np.random.default_rng(seed)
    N, s = int(rng.integers(1, 30)), int(rng.integers(1, 9))
    pw = rng.choice([0.0, 0.1, 0.25, 0.5], size=N) if seed % 2 else rng.random(N)  # ties, zeros
    wtop = mass_tops(pw, s)
    assert wtop.shape == (N + 1, s + 1)
    for j in range(N + 1):
        desc = np.sort(pw[j:])[::-1]
        for r in range(s + 1):
            assert wtop[j, r] == pytest.approx(desc[:r].sum(), rel=1e-15, abs=0.0)


def test_search_order_is_by_norm_then_mass_then_index():
    A = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    p = np.array([0.1, 0.2, 0.3, 0.1, 0.3])
    assert search_order(A, p).tolist() == [1, 2, 0, 3, 4]


@pytest.mark.parametrize("seed", range(4))
def test_search_row_is_the_row_in_search_order(seed):
    """``prepare`` puts key ``order[i]`` at position i (``rank`` its inverse), rotates without changing
    norms or inner products, and its box tables are the sums of the r smallest / largest coordinates
    from each position on; ``search_arrays`` are ``_search``'s row arguments in their order."""
    import inspect

    from forcedweight.certify.solvers.bnb import _search

    rng = np.random.default_rng(seed)
    N, d, s = int(rng.integers(2, 25)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
    s = min(s, N)
    p = rng.dirichlet(np.ones(N))
    A_keys = op.centred_contributions(p, rng.normal(size=(N, d)))
    order = None if seed % 2 else rng.permutation(N)
    row = prepare(A_keys, p, s, order)
    want = search_order(A_keys, p) if order is None else order
    np.testing.assert_array_equal(row.order, want)
    np.testing.assert_array_equal(row.rank[row.order], np.arange(N))
    np.testing.assert_array_equal(row.pw, p[want])
    B = A_keys[want]
    scale = float(np.abs(B).max()) ** 2 * d
    # a rotation in float64: inner products agree to a few ulps of the largest (tolerance 1e-13 of it)
    np.testing.assert_allclose(row.G, B @ B.T, rtol=0.0, atol=1e-13 * scale)
    np.testing.assert_allclose(row.nrm ** 2, np.einsum("ij,ij->i", B, B), rtol=0.0, atol=1e-13 * scale)
    assert row.use_box and row.lo.shape == (N + 1, s + 1, d)
    for j in range(N + 1):
        for q in range(d):
            col = np.sort(row.A[j:, q])
            for r in range(s + 1):
                # sums of at most 6 terms, accumulated in another order: 1e-14 of the column's scale
                tol = 1e-14 * (float(np.abs(row.A[:, q]).max()) + 1e-300) * (r + 1)
                assert abs(row.lo[j, r, q] - col[:r].sum()) <= tol
                assert abs(row.hi[j, r, q] - col[::-1][:r].sum()) <= tol
    np.testing.assert_array_equal(row.wtop, mass_tops(row.pw, s))
    names = list(inspect.signature(_search.py_func).parameters)[:8]
    assert names == ["A", "pw", "wtop", "nrm", "G", "lo", "hi", "use_box"]
    assert all(x is y for x, y in zip(row.search_arrays, (row.A, row.pw, row.wtop, row.nrm, row.G, row.lo, row.hi,
                                                           row.use_box)))


def test_contributions_from_values_or_given_and_the_budget_checked():
    """``contributions``: the centred contributions of (p, V), or the given A reshaped to (N, d); either way
    a budget outside [1, N] is a ValueError (root_bound and solve_bnb share it)."""
    from forcedweight.certify.solvers.bnb import root_bound
    from forcedweight.certify.solvers.search_row import contributions

    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(9))
    V = rng.normal(size=(9, 3))
    p2, V2, A = contributions(list(p), V.tolist(), 4)
    assert p2.dtype == np.float64 and V2.shape == (9, 3)
    np.testing.assert_array_equal(A, op.centred_contributions(p, V))
    _, _, A_given = contributions(p, None, 4, A.ravel())
    np.testing.assert_array_equal(A_given, A)
    for s in (0, 10):
        with pytest.raises(ValueError, match="outside"):
            contributions(p, V, s)
        with pytest.raises(ValueError, match="outside"):
            root_bound(p, None, s, A=A)
