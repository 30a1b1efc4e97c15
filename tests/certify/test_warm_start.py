"""Warm-started node tests (``node_tests._node_lb_ok(..., nwarm, wst)``): a test that starts from the direction
its level's previous test ended with, against the brute force over completions, and the search with warm starts
against the brute-force optimum.

The tests of a level's successive nodes share ``T``; on long rows the search keeps each level's last direction
(``node_tests.warm_scratch``) and its sums by position, moved with their keys when the exclusion compacts the
list. Any direction gives a valid test, so what can go wrong is bookkeeping: sums that no longer belong to
their positions or to the kept direction. Both are checked directly here.
"""

from itertools import combinations

import numpy as np
import pytest

from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.solvers import node_tests as nt
from forcedweight.certify.solvers.bnb import REL_TOL, solve_bnb
from forcedweight.certify.solvers.search_row import prepare
from forcedweight.core import operator as op

from tests.certify.test_exclusion import _level, _row
from tests.certify.test_solvers import check_result


def _completions(A, pw, ys, ws, t, R, r):
    comps = list(combinations(R, r))
    E = np.array([np.linalg.norm(ys[t] + A[list(Z)].sum(0)) / (ws[t] + pw[list(Z)].sum()) for Z in comps])
    return comps, E


def _check_sums(h, L, p0, hv, zs, zc, G, nrm, nz):
    """The kept sums ``h[p0:hv]`` are the kept direction's ``sum_z c_z G[z, L[i]]`` to within the rounding the
    test allows them (``2 (nz + 3) eps bz ||a_k||``, bz the coefficients' norm sum; node_tests' err)."""
    keys = L[p0:hv]
    exact = zc @ G[np.ix_(zs, keys)]
    tol = 2.0 * (nz + 3) * nt._EPS * (zc @ nrm[zs]) * nrm[keys]
    assert np.all(np.abs(h[p0:hv] - exact) <= tol)


def _sibling_chain(seed):
    """One level's successive nodes, as the search meets them: the tests of positions 0, 1, 2, ... of one
    candidate list, warm-started, with the exclusion after each that passes. Every prune and every dropped
    key is checked against the brute force; after each passing test the kept sums ``h`` are checked against
    the kept direction's Gram sums, position by position. Returns (warm tests, prunes, keys dropped)."""
    rng = np.random.default_rng(2000 + seed)
    n, d, s = 24, int(rng.integers(2, 6)), int(rng.integers(4, 7))
    p, V = _row(seed, n, d, rng.choice([0.3, 1.0, 2.5]), distinct=(None if seed % 2 else 6))
    A0 = op.centred_contributions(p, V)
    A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A0, p, s)[:10]
    kt, buf, bidx, _, _, _, _, dirn, gc, gk = nt.node_scratch(nrm, pw, wtop, s, nt.NREF_LONG)
    wh, wz, wc, wst = nt.warm_scratch(n, s)
    t = int(rng.integers(1, s - 1))  # r = s - t >= 2
    r = s - t
    T = np.sort(rng.choice(6, size=t, replace=False))
    R = np.arange(T[-1] + 1, n)
    ys, ws, bs, cs = _level(A, pw, nrm, G, T, s)
    L = np.concatenate([R, np.full(n - R.size, -1)]).astype(np.int64)
    cs_at = np.where(L >= 0, cs[:, L], np.nan)  # by position in L, as the search keeps them
    ln = R.size
    warm = prunes = dropped = 0
    for p0 in range(n):
        if ln - p0 < r:
            break
        comps, E = _completions(A, pw, ys, ws, t, L[p0:ln].tolist(), r)
        lam = float(E.min() * rng.choice([0.7, 0.97, 1.03, 1.3]))
        warm += wst[t, 0] > 0
        ok = nt._node_lb_ok(t, L, p0, ln, s, A, pw, nrm, G, ys, ws, bs, cs_at, lo, hi, use_box, lam, gamma, kt,
                            wtop, buf, bidx, wh[t], wz[t], wc[t], nt.NREF_LONG, nt.THETA_LONG, nt.DECAY_LONG, dirn,
                            gc, gk, nt.WARM_STEPS, wst[t])
        if wst[t, 0] > 0:  # a direction kept (a pruned test keeps its level's only where it ran no step)
            # the kept direction: v - alpha y_T = sum_z c_z a_z, and the sums h[i] = <v - alpha y_T, a_L[i]>
            alpha, bz, nz, nu, hv = wst[t, 1], wst[t, 4], int(wst[t, 5]), int(wst[t, 6]), int(wst[t, 7])
            zs, zc = wz[t, :nu], wc[t, :nu]
            assert np.unique(zs).size == nu and np.all(zc > 0)  # one coefficient a key
            _check_sums(wh[t], L, p0, hv, zs, zc, G, nrm, nz)
            # ||v||^2 within the margin the test adds (kap2 bz^2, node_tests)
            v = alpha * ys[t] + zc @ A[zs]
            assert abs(wst[t, 2] - v @ v) <= 4.0 * (d + nz + 2 * s + 8) * nt._EPS * bz * bz
        if not ok:
            assert E.min() >= lam * (1 - 1e-12)  # a pruned node holds no set below lam
            prunes += 1
            continue
        if dirn[0] != 1.0:
            continue
        assert wst[t, 0] == 1  # a test that passed after its steps keeps its direction
        end = nt._exclude(t, L, p0, ln, s, ws, cs_at, lam, kt, buf, bidx, wh[t], dirn, gc, wst[t])
        kept = set(L[p0:end].tolist())
        for Z, e in zip(comps, E):
            if e < lam * (1 - 1e-12):  # every key of a set below lam stays
                assert set(Z) <= kept
        np.testing.assert_array_equal(cs_at[t, p0:end], cs[t, L[p0:end]])  # the sums moved with their keys
        hv = int(wst[t, 7])  # ... and the step sums too
        assert p0 <= hv <= end
        _check_sums(wh[t], L, p0, hv, wz[t, :nu], wc[t, :nu], G, nrm, nz)
        dropped += ln - end
        ln = end
    return warm, prunes, dropped


def test_warm_started_tests_prune_and_exclude_only_what_they_may():
    totals = np.array([_sibling_chain(seed) for seed in range(24)])
    warm, prunes, dropped = totals.sum(axis=0)
    assert warm >= 50 and prunes >= 10 and dropped >= 20  # the chains exercised all three


@pytest.mark.parametrize("distinct", [None, 5])
def test_bnb_with_warm_starts_matches_brute_force(monkeypatch, distinct):
    # every row a long row (LONG_ROWS = 10): the search's tests start from their level's last direction,
    # with WARM_STEPS steps; with warm starts off (WARM_STEPS = 0) the same optimum, and the node counts
    # differ on some row (the warm starts ran)
    monkeypatch.setattr(nt, "LONG_ROWS", 10)  # (node_tests.search_steps)
    differ = 0
    steps = nt.WARM_STEPS
    for seed in range(4):
        p, V = _row(70 + seed, 26, 4, (0.4, 1.0, 2.0, 3.0)[seed], distinct=distinct)
        for s in (3, 5, 6):
            ref, _ = brute_force_best(p, V, s)
            nodes = []
            for nwarm in (steps, 0):
                monkeypatch.setattr(nt, "WARM_STEPS", nwarm)
                res = solve_bnb(p, V, s, time_limit=60)
                check_result(res, p, V, s, ref, 2 * REL_TOL)
                nodes.append(res.info["nodes"])
            differ += nodes[0] != nodes[1]
    assert differ >= 1


def test_node_limited_runs_with_warm_starts_are_identical(monkeypatch):
    # the levels' directions live in the search's state, not in a batch: two node-limited runs (whose batches
    # end where the clock says) give the same sets, bounds and node counts
    monkeypatch.setattr(nt, "LONG_ROWS", 10)
    p, V = _row(91, 90, 6, 0.5)
    runs = [solve_bnb(p, V, 6, node_limit=3_000, time_limit=600) for _ in range(2)]
    assert not runs[0].proved  # stopped by the node limit, inside the search
    a, b = runs
    np.testing.assert_array_equal(a.best_set, b.best_set)
    assert (a.value, a.lower_bound, a.info["nodes"], a.info["level_nodes"]) == \
        (b.value, b.lower_bound, b.info["nodes"], b.info["level_nodes"])
