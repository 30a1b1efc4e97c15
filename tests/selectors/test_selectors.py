"""Selectors (SPEC §4): each against its definition, written out directly (loops, pinv, brute force)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forcedweight.core import operator as op
from forcedweight.core.swaps import swap_search
from forcedweight import selectors as sel


def _row(seed, n=40, d=6, dk=5, peak=2.0):
    rng = np.random.default_rng(seed)
    p = np.exp(peak * rng.normal(size=n))
    p /= p.sum()
    return sel.RowView(p, rng.normal(size=(n, d)), rng.normal(size=(n, dk)), rng.normal(size=dk), row_id=seed)


ALL = [sel.TopMass(), sel.TOVA(), sel.Balancing(), sel.Geometric(), sel.FreeGeometry(), sel.Leverage(), sel.Leverage(on="keys"),
       sel.Random(3), sel.StreamingLLM(), sel.KNorm(), sel.Quest(), sel.TopMass(sinks=2, recent=3)]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), data=st.data())
def test_every_selector_returns_s_sorted_unique_indices(seed, n, data):
    s = data.draw(st.integers(1, n))
    row = _row(seed, n=n)
    for selector in ALL:
        kept = selector.select(row, s)
        assert kept.dtype == np.int64
        assert kept.shape == (s,)
        assert np.all(np.diff(kept) > 0), selector.name
        assert kept[0] >= 0 and kept[-1] < n


def test_top_mass_and_tova_match_operator_with_ties():
    p = np.array([0.1, 0.3, 0.1, 0.3, 0.2])
    row = (p, np.ones((5, 2)))
    for s in range(1, 6):
        assert sel.TopMass().select(row, s).tolist() == op.top_mass_set(p, s).tolist()
        assert sel.TOVA().select(row, s).tolist() == op.top_mass_set(p, s).tolist()
    assert sel.TopMass().select(row, 3).tolist() == [1, 3, 4]  # ties 0 vs 2: lower index first
    assert sel.TopMass().select(row, 4).tolist() == [0, 1, 3, 4]


def test_sinks_and_recent_are_padded_scores():
    row = _row(1, n=30)
    kept = sel.TopMass(sinks=2, recent=3).select(row, 10)
    assert {0, 1, 27, 28, 29} <= set(kept.tolist())
    rest = [i for i in range(2, 27)]
    top_rest = sorted(rest, key=lambda i: (-row.p[i], i))[:5]
    assert sorted(set(kept.tolist()) - {0, 1, 27, 28, 29}) == sorted(top_rest)


def test_streaming_llm_keeps_sinks_and_recent():
    row = _row(2, n=20)
    for s in range(1, 21):
        kept = sel.StreamingLLM().select(row, s).tolist()
        if s <= 4:
            assert kept == list(range(s))
        else:
            assert kept == [0, 1, 2, 3] + list(range(20 - (s - 4), 20))


def test_knorm_keeps_smallest_key_norms():
    row = _row(3, n=33)
    norms = np.linalg.norm(row.keys, axis=1)
    for s in (1, 5, 17, 33):
        kept = sel.KNorm().select(row, s)
        assert sorted(kept.tolist()) == sorted(np.argsort(norms)[:s].tolist())


def test_quest_page_bounds_and_selection_against_a_loop():
    row = _row(4, n=45, dk=3)  # 3 pages: 16, 16, 13 keys
    K, q = row.keys, row.query
    bounds = sel.quest_page_bounds(K, q, 16)
    for g in range(3):
        page = K[16 * g : 16 * (g + 1)]
        lo, hi = page.min(axis=0), page.max(axis=0)
        # the bound is the max of q.k over the box: the best of its 2^3 corners
        corners = [np.where(np.array(c, bool), hi, lo) for c in itertools.product([0, 1], repeat=3)]
        assert bounds[g] == pytest.approx(max(q @ c for c in corners), rel=1e-12)  # float64 sums of 3 terms
        assert bounds[g] >= (page @ q).max() - 1e-12  # an upper bound on every key of the page
    order = sorted(range(3), key=lambda g: (-bounds[g], g))
    for s in (1, 10, 16, 20, 40, 45):
        want, left = [], s
        for g in order:
            idx = list(range(16 * g, min(45, 16 * (g + 1))))
            idx.sort(key=lambda i: (-(K[i] @ q), i))
            want += idx[: min(left, len(idx))]
            left -= min(left, len(idx))
        assert sel.Quest().select(row, s).tolist() == sorted(want)


def test_leverage_matches_hat_matrix_diagonal():
    for n, d in ((30, 5), (8, 12), (25, 1)):
        rng = np.random.default_rng(n)
        V = rng.normal(size=(n, d))
        X = V - V.mean(axis=0)
        H = X @ np.linalg.pinv(X)
        # tolerance: SVD vs pinv, both backward stable on well-conditioned X
        np.testing.assert_allclose(sel.leverage_scores(V), np.diag(H), rtol=0, atol=1e-10)
        kept = sel.Leverage().select((np.full(n, 1 / n), V), 4)
        h = np.diag(H)
        assert h[kept].min() >= np.delete(h, kept).max() - 1e-10


def test_geometric_is_farthest_point_from_the_mean():
    rng = np.random.default_rng(5)
    V = rng.normal(size=(25, 3))
    order = sel.farthest_point_order(V, 10)
    assert order[0] == np.argmax(np.linalg.norm(V - V.mean(axis=0), axis=1))
    for t in range(1, 10):
        # naive: distance of every point to its nearest chosen point, recomputed from scratch
        dmin = np.array([min(np.linalg.norm(V[i] - V[j]) for j in order[:t]) for i in range(25)])
        dmin[order[:t]] = -1
        assert order[t] == np.argmax(dmin)
    kept = sel.Geometric().select((np.full(25, 0.04), V), 6)
    assert kept.tolist() == sorted(order[:6].tolist())


def test_random_is_seeded_per_row():
    row = _row(6, n=50)
    a = sel.Random(7).select(row, 10)
    assert np.array_equal(a, sel.Random(7).select(row, 10))
    assert not np.array_equal(a, sel.Random(8).select(row, 10))


def test_missing_keys_is_reported():
    row = (np.full(5, 0.2), np.ones((5, 2)))
    with pytest.raises(sel.MissingInput, match="knorm needs keys"):
        sel.KNorm().select(row, 2)
    with pytest.raises(sel.MissingInput):
        sel.Quest().select(row, 2)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 14), d=st.integers(1, 4), data=st.data())
def test_balancing_never_worse_than_top_mass_and_is_a_local_optimum(seed, n, d, data):
    s = data.draw(st.integers(1, n))
    rng = np.random.default_rng(seed)
    p = rng.random(n) ** 4 + 1e-3
    p /= p.sum()
    V = rng.normal(size=(n, d))
    kept, swaps = sel.balancing(p, V, s)
    top = op.top_mass_set(p, s)
    e_bal, e_top = op.forced_error(p, V, kept), op.forced_error(p, V, top)
    assert e_bal <= e_top
    assert (swaps == 0) == np.array_equal(kept, top)
    assert len(set(kept.tolist()) - set(top.tolist())) <= swaps
    # local optimality by brute force over every 1-swap (relative 1e-9: the loop's stop rule is
    # 1e-12 relative, and the Gram expansion can lose a few digits on near-ties)
    for i in kept:
        for j in np.setdiff1d(np.arange(n), kept):
            S = np.sort(np.append(kept[kept != i], j))
            assert op.forced_error(p, V, S) >= e_bal * (1 - 1e-9) - 1e-15


def test_balancing_with_candidates_only_swaps_those_in():
    rng = np.random.default_rng(9)
    n = 60
    p = rng.random(n) ** 6
    p /= p.sum()
    V = rng.normal(size=(n, 4))
    top = op.top_mass_set(p, 6)
    cand = np.union1d(top, [0, 1, 2, 3])
    kept, _ = sel.balancing(p, V, 6, candidates=cand)
    assert set(kept.tolist()) <= set(cand.tolist())
    full, _ = sel.balancing(p, V, 6)
    assert op.forced_error(p, V, full) <= op.forced_error(p, V, top)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 14), d=st.integers(1, 4), data=st.data())
def test_swap_search_from_any_start_reaches_a_local_optimum(seed, n, d, data):
    # core.swaps.swap_search (balancing's search, also the solvers' polish) from a random start,
    # over every key or a candidate subset: never worse than the start, and no allowed swap improves
    s = data.draw(st.integers(1, n - 1))
    rng = np.random.default_rng(seed)
    p = rng.random(n) ** 4 + 1e-3
    p /= p.sum()
    V = rng.normal(size=(n, d))
    start = np.sort(rng.choice(n, size=s, replace=False))
    cand = None if data.draw(st.booleans()) else np.union1d(start, rng.choice(n, size=n // 2, replace=False))
    kept, swaps = swap_search(p, V, start, candidates=cand)
    assert kept.shape == (s,) and np.all(np.diff(kept) > 0)
    allowed = np.arange(n) if cand is None else cand
    assert set(kept.tolist()) <= set(start.tolist()) | set(allowed.tolist())
    e = op.forced_error(p, V, kept)
    assert e <= op.forced_error(p, V, start) and (swaps == 0) == np.array_equal(kept, start)
    # relative 1e-9: the stop rule is 1e-12 relative, the expansion can lose digits on near-ties
    for i in kept:
        for j in np.setdiff1d(allowed, kept):
            S = np.sort(np.append(kept[kept != i], j))
            assert op.forced_error(p, V, S) >= e * (1 - 1e-9) - 1e-15
    capped, one = swap_search(p, V, start, candidates=cand, max_swaps=1)
    assert one == min(swaps, 1) and op.forced_error(p, V, capped) >= e * (1 - 1e-12)


def test_balancing_single_key_budget_reaches_the_best_key_on_peaked_rows():
    # regression: the swap gain was expanded around y = a_top, cancelling at eps ||a_top||^2,
    # which buried the gain of small-mass keys: balancing stopped at top-mass (0 swaps).
    # With s = 1 and every key a candidate, one best-improving swap reaches the best single key.
    from forcedweight.certify.enumerate import brute_force_best

    rng = np.random.default_rng(29)
    for _ in range(40):
        n = int(rng.integers(4, 13))
        p = rng.random(n) ** 12
        p /= p.sum()
        V = rng.normal(size=(n, 2)) * 1e-3
        kept, swaps = sel.balancing(p, V, 1)
        best, _ = brute_force_best(p, V, 1)
        # relative 1e-9: float64 round-off of E
        assert op.forced_error(p, V, kept) <= best * (1 + 1e-9)
        assert swaps == (0 if op.forced_error(p, V, op.top_mass_set(p, 1)) <= best * (1 + 1e-9) else 1)


# ---------------------------------------------------------------- free-weight geometry


def _fw_row(seed, n=40, d=5):
    rng = np.random.default_rng(seed)
    p = np.exp(2 * rng.normal(size=n))
    return p / p.sum(), rng.normal(size=(n, d))


@pytest.mark.parametrize("seed", range(5))
def test_free_geometry_first_picks_follow_the_definition(seed):
    """Picks 1-3 recomputed in closed form: nearest value to mu; then the Frank-Wolfe vertex for the
    residual v_1 - mu; then for the residual of the nearest point of the segment [v_1, v_2]."""
    from forcedweight.selectors.free_geometry import free_geometry_order

    p, V = _fw_row(seed)
    mu = p @ V
    order = free_geometry_order(p, V, 3)
    Y = V - mu
    j1 = int(np.argmin(np.linalg.norm(Y, axis=1)))
    g = Y @ Y[j1]
    g[j1] = np.inf
    j2 = int(np.argmin(g))
    a, b = Y[j1], Y[j2]  # nearest point of the segment to the origin: t in [0, 1]
    t = float(np.clip(-(a @ (b - a)) / ((b - a) @ (b - a)), 0.0, 1.0))
    r = a + t * (b - a)
    g = Y @ r
    g[[j1, j2]] = np.inf
    assert order.tolist() == [j1, j2, int(np.argmin(g))]


def test_free_geometry_lowers_ef_and_fills_by_mass_once_mu_is_reached():
    from forcedweight.selectors.free_geometry import free_geometry_order

    free, geo = [], []
    for seed in range(12):
        p, V = _fw_row(seed, n=60, d=8)
        order = free_geometry_order(p, V, 8)
        ef = [op.free_weight_error(p, V, order[:k]) for k in range(1, 9)]
        assert all(b <= a + 1e-12 for a, b in zip(ef, ef[1:]))  # EF never rises as keys are added
        free.append(ef[-1])
        geo.append(op.free_weight_error(p, V, sel.Geometric().select((p, V), 8)))
    assert np.median(free) < 0.5 * np.median(geo)  # the rule targets EF; farthest points do not
    # a key whose value is mu: picked first, EF = 0 at once, then the largest masses
    p, V = _fw_row(3, n=10, d=2)
    V[7] = 0.0
    mu0 = p @ V  # with v_7 = mu0 / (1 - p_7), mu = mu0 + p_7 v_7 = v_7
    V[7] = mu0 / (1 - p[7])
    mu = p @ V
    assert np.allclose(V[7], mu, atol=1e-12)
    order = free_geometry_order(p, V, 4)
    by_mass = [int(i) for i in np.argsort(-p, kind="stable") if i != 7][:3]
    assert order.tolist() == [7, *by_mass]
    kept = sel.FreeGeometry().select((p, V), 4)
    assert kept.tolist() == sorted(order.tolist())
