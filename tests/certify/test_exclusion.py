"""Reduced-cost key exclusion (``node_tests._exclude``) against the brute force over completions.

At a node the projection test cannot prune, the keys ``_exclude`` drops must be in no completion
with ``E < lam``: checked here by enumerating every completion of random nodes of small rows
(repeated values, as layer-0 rows have, and spread or peaked masses), then the whole search with
exclusion against the brute-force optimum.
"""

from itertools import combinations

import numpy as np
import pytest

from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.solvers.bnb import REL_TOL, solve_bnb
from forcedweight.certify.solvers.node_tests import (DECAY, NREF, ROW_SLOTS, THETA, _exclude, _node_lb_ok,
                                                     node_scratch)
from forcedweight.certify.solvers.search_row import prepare
from forcedweight.core import operator as op


def _row(seed, n, d, sigma, distinct=None):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n) * sigma
    p = np.exp(z - z.max())
    p /= p.sum()
    if distinct is None:
        return p, rng.normal(size=(n, d))
    U = rng.normal(size=(distinct, d))
    return p, U[rng.integers(0, distinct, size=n)]  # repeated values (layer 0: one per token)


def _level(A, pw, nrm, G, T, s):
    """ys/ws/bs/cs arrays with level len(T) filled from the keys T (the search's sums)."""
    N, d = A.shape
    ys, ws, bs, cs = np.zeros((s + 1, d)), np.zeros(s + 1), np.zeros(s + 1), np.zeros((s + 1, N))
    for i, j in enumerate(T):
        ys[i + 1] = ys[i] + A[j]
        ws[i + 1] = ws[i] + pw[j]
        bs[i + 1] = bs[i] + nrm[j]
        cs[i + 1] = cs[i] + G[j]
    return ys, ws, bs, cs


def _check_exclusion(seed):
    """Random nodes of a small row: every key ``_exclude`` drops is in no completion below lam (brute force over
    the completions). Returns how many keys the steps' marks dropped beyond the last direction's."""
    rng = np.random.default_rng(1000 + seed)
    n, d, s = 22, int(rng.integers(2, 6)), int(rng.integers(4, 7))
    p, V = _row(seed, n, d, rng.choice([0.3, 1.0, 2.5]), distinct=(None if seed % 2 else 6))
    A0 = op.centred_contributions(p, V)
    order = None if seed % 4 < 2 else op.rank_order(p)  # the search order or mass order: the tests are order-free
    A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A0, p, s, order)[:10]
    kt, buf, bidx, h, zs, zc, _, dirn, gc, gk = node_scratch(nrm, pw, wtop, s, NREF)
    dropped = checked = by_marks = 0
    for trial in range(40):
        t = int(rng.integers(1, s - 1))  # r = s - t >= 2
        T = np.sort(rng.choice(8, size=t, replace=False))
        rest = np.arange(T[-1] + 1, n)
        R = np.sort(rng.choice(rest, size=int(rng.integers(s - t, rest.size + 1)), replace=False))
        ys, ws, bs, cs = _level(A, pw, nrm, G, T, s)
        r = s - t
        comps = list(combinations(R.tolist(), r))
        E = np.array([np.linalg.norm(ys[t] + A[list(Z)].sum(0)) / (ws[t] + pw[list(Z)].sum()) for Z in comps])
        lam = float(E.min() * rng.choice([0.6, 0.95, 1.05, 1.4]))  # some nodes hold sets below lam
        L = np.concatenate([R, np.full(n - R.size, -1)]).astype(np.int64)
        nref = int(rng.choice([0, 2, NREF]))
        cs_at = np.where(L >= 0, cs[:, L], np.nan)  # the search keeps cs by position in L
        ok = _node_lb_ok(t, L, 0, R.size, s, A, pw, nrm, G, ys, ws, bs, cs_at, lo, hi, use_box, lam, gamma, kt,
                         wtop, buf, bidx, h, zs, zc, nref, THETA, DECAY, dirn, gc, gk)
        if not ok:
            assert E.min() >= lam * (1 - 1e-12)  # a pruned node holds no set below lam
            continue
        # the last direction alone (the steps' marks cleared), then with the marks
        L1, cs1, unmarked = L.copy(), cs_at.copy(), gc.copy()
        unmarked[ROW_SLOTS + 1] = 0.0
        end1 = _exclude(t, L1, 0, R.size, s, ws, cs1, lam, kt, buf, bidx, h, dirn, unmarked)
        end = _exclude(t, L, 0, R.size, s, ws, cs_at, lam, kt, buf, bidx, h, dirn, gc)
        assert set(L[:end].tolist()) <= set(L1[:end1].tolist())
        by_marks += end1 - end
        kept = set(L[:end].tolist())
        np.testing.assert_array_equal(cs_at[t, :end], cs[t, L[:end]])  # the sums moved with their keys
        assert kept <= set(R.tolist()) and np.all(np.diff(L[:end]) > 0)  # a subset, order kept
        for Z, e in zip(comps, E):
            if e < lam * (1 - 1e-12):  # every key of a set below lam stays
                assert set(Z) <= kept
        dropped += R.size - end
        checked += 1
    assert checked >= 10
    assert dropped > 0  # the exclusion did something on these rows
    return by_marks


@pytest.mark.parametrize("seed", range(8))
def test_excluded_keys_are_in_no_completion_below_lam(seed):
    _check_exclusion(seed)


def test_the_steps_marks_exclude_more_than_the_last_direction():
    """Over the rows above, the keys the earlier steps' scans marked drop some keys the last direction keeps
    (each drop checked against the brute force)."""
    assert sum(_check_exclusion(seed) for seed in range(8)) > 0


@pytest.mark.parametrize("distinct", [None, 4, 7])
def test_bnb_with_exclusion_matches_brute_force(distinct):
    for seed in range(3):
        p, V = _row(50 + seed, 24, 4, 1.0, distinct=distinct)
        for s in (3, 5, 6):
            ref, _ = brute_force_best(p, V, s)
            on = solve_bnb(p, V, s, time_limit=60)
            off = solve_bnb(p, V, s, time_limit=60, exclude=False)
            for res in (on, off):
                assert res.proved
                assert ref - 1e-13 <= res.value <= ref * (1 + 2 * REL_TOL) + 1e-13
                assert res.value == op.forced_error(p, V, res.best_set)
            # exclusion only removes nodes: never more than the plain search
            assert on.info["nodes"] <= off.info["nodes"]
