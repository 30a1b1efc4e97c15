"""forcedweight.core.stats against scipy and brute force on synthetic inputs."""

import math
from itertools import product

import numpy as np
import pytest
from scipy import stats as sps

from forcedweight.core import stats as st


@pytest.mark.parametrize("n,seed", [(2, 0), (7, 1), (57, 2), (400, 3)])
def test_bootstrap_matches_scipy_percentile_exactly(n, seed):
    x = np.random.default_rng(100 + n).lognormal(size=n)
    r = st.bootstrap_median_ci(x, n_boot=999, seed=seed)
    ref = sps.bootstrap(
        (x,), np.median, n_resamples=999, batch=st.bootstrap_batch(n, 999), method="percentile",
        vectorized=True, rng=np.random.default_rng(seed),
    )
    # same resampling stream and same quantile rule: equal up to float round-off
    assert r.lo == pytest.approx(ref.confidence_interval.low, rel=1e-12, abs=1e-15)
    assert r.hi == pytest.approx(ref.confidence_interval.high, rel=1e-12, abs=1e-15)
    assert r.median == np.median(x) and r.n == n and r.note == ""


def test_bootstrap_batched_equals_scipy_batched():
    # batches smaller than n_boot (large samples): scipy with the same batch draws the same indices
    x = np.random.default_rng(5).normal(size=3000)
    old = st.BOOTSTRAP_BATCH_ELEMENTS
    try:
        st.BOOTSTRAP_BATCH_ELEMENTS = 3000 * 64  # forces 64 resamples per batch
        r = st.bootstrap_median_ci(x, n_boot=300, seed=9)
    finally:
        st.BOOTSTRAP_BATCH_ELEMENTS = old
    ref = sps.bootstrap((x,), np.median, n_resamples=300, batch=64, method="percentile",
                        vectorized=True, rng=np.random.default_rng(9))
    assert (r.lo, r.hi) == pytest.approx(tuple(ref.confidence_interval), rel=1e-12)  # same draws


def test_bootstrap_reproducible_and_seed_dependent():
    x = np.random.default_rng(0).exponential(size=101)
    a = st.bootstrap_median_ci(x, n_boot=500, seed=3)
    b = st.bootstrap_median_ci(x, n_boot=500, seed=3)
    c = st.bootstrap_median_ci(x, n_boot=500, seed=4)
    assert a == b
    assert (a.lo, a.hi) != (c.lo, c.hi)
    assert a.lo <= a.median <= a.hi


def test_bootstrap_too_few_and_nonfinite():
    one = st.bootstrap_median_ci([0.3, np.nan])
    assert one.median == 0.3 and np.isnan(one.lo) and np.isnan(one.hi) and one.n == 1
    assert "n=1 < 2" in one.note and "1 non-finite" in one.note
    none = st.bootstrap_median_ci([np.nan, np.inf])
    assert np.isnan(none.median) and none.n == 0 and "no finite values" in none.note
    x = np.r_[np.random.default_rng(1).normal(size=30), np.nan, np.inf]
    assert st.bootstrap_median_ci(x, 200, 1)[:4] == st.bootstrap_median_ci(x[:30], 200, 1)[:4]


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 10), (3, 17), (10, 10), (50, 100), (1, 1000), (999, 1000)])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_wilson_matches_binomtest(k, n, level):
    lo, hi = st.wilson_interval(k, n, level)
    ref = sps.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    assert lo == pytest.approx(ref.low, abs=1e-12)  # closed form both sides: round-off only
    assert hi == pytest.approx(ref.high, abs=1e-12)


def test_wilson_empty_and_bad():
    assert all(np.isnan(st.wilson_interval(0, 0)))
    for args in ((5, 3), (2.7, 10), (2, 10, 1.5), (2, 10, np.nan), (2, 10, 0.0)):
        with pytest.raises(ValueError):
            st.wilson_interval(*args)
    for call in (lambda: st.bootstrap_median_ci([1.0, 2, 3], n_boot=0), lambda: st.bootstrap_median_ci([1.0, 2], level=1),
                 lambda: st.cluster_bootstrap_median_ci([1.0, 2], [0, 1], n_boot=2.5),
                 lambda: st.paired_comparison([1.0, 2], [2.0, 1], tie_tol=-1), lambda: st.paired_comparison([1.0], [2.0], n_boot=0)):
        with pytest.raises(ValueError):  # bad arguments of the resampling (tie_tol < 0 gave ties = -n)
            call()
    for n in range(1, 200):  # exact ends, as scipy's: 0 at k = 0, 1 at k = n (was ~1e-17 off on some n)
        assert st.wilson_interval(0, n)[0] == 0.0 and st.wilson_interval(n, n)[1] == 1.0


@pytest.mark.parametrize("n,seed", [(3, 4), (4, 0), (9, 1), (60, 2), (301, 3)])
def test_wilson_median_upper_bound_brute_force(n, seed):
    x = np.round(np.random.default_rng(seed).exponential(size=n), 1)  # rounding makes ties
    bound, note = st.wilson_median_upper_bound(x)
    # brute force: first sorted distinct value t whose share #{x <= t}/n has a ONE-sided 95% Wilson
    # lower end >= 1/2 (= the lower end of the two-sided 90% interval)
    expected = np.nan
    for t in np.unique(x):
        if sps.binomtest(int(np.sum(x <= t)), n).proportion_ci(confidence_level=0.90, method="wilson").low >= 0.5:
            expected = t
            break
    assert bound == expected and note == ""
    assert bound >= np.median(x)


def test_wilson_median_upper_bound_too_few():
    bound, note = st.wilson_median_upper_bound([0.1, 0.2])
    assert np.isnan(bound) and "too small" in note
    assert np.isnan(st.wilson_median_coverage(2))
    assert st.wilson_median_upper_bound([0.1, 0.3, 0.2])[0] == 0.3  # n = 3: the maximum, coverage 7/8
    assert st.wilson_median_coverage(3) == pytest.approx(0.875, abs=1e-15)
    assert np.isnan(st.wilson_median_upper_bound([])[0])


@pytest.mark.parametrize("n", [3, 4, 5, 8, 13, 30, 75])
def test_wilson_median_bound_coverage_by_simulation(n):
    """Simulated coverage of the population median (exponential law, median ln 2) equals the exact
    binomial formula P(Bin(n, 1/2) <= j - 1); 40,000 draws: 4.5 binomial standard errors."""
    reps = 40_000
    x = np.random.default_rng(n).exponential(size=(reps, n))
    j = st.wilson_median_rank(n)
    bounds = np.sort(x, axis=1)[:, j - 1]  # the bound is x_(j) (no ties in continuous draws) ...
    for row, b in zip(x[:300], bounds[:300]):  # ... which the function returns
        assert st.wilson_median_upper_bound(row)[0] == b
    covered = np.mean(bounds >= np.log(2))
    exact = st.wilson_median_coverage(n)
    assert exact == pytest.approx(sum(math.comb(n, i) for i in range(j)) / 2 ** n, rel=1e-12)
    assert abs(covered - exact) <= 4.5 * math.sqrt(exact * (1 - exact) / reps)


def test_wilson_median_bound_is_one_sided_95_on_average():
    """Averaged over n = 10..400 the exact coverage is 95% (±0.5 points); the two-sided 95% end that
    the label used to mean gives ≈ 97.5% (the over-coverage this definition removes)."""
    cov = np.array([st.wilson_median_coverage(n) for n in range(10, 401)])
    assert abs(cov.mean() - 0.95) < 0.005
    two_sided = np.array([st.wilson_median_coverage(n, level=0.975) for n in range(10, 401)])
    assert abs(two_sided.mean() - 0.975) < 0.005


def _auc_pairs(pos, neg):
    """O(n1 n0) reference: share of pairs with pos > neg, ties half."""
    d = pos[:, None] - neg[None, :]
    return ((d > 0) + 0.5 * (d == 0)).mean()


@pytest.mark.parametrize("seed", range(4))
def test_auc_matches_mann_whitney_with_ties(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(80) < 0.35
    s = np.round(rng.normal(size=80) + 0.8 * y, 1)  # many ties
    r = st.auc_mann_whitney(s, y)
    u = sps.mannwhitneyu(s[y], s[~y]).statistic
    assert r.auc == pytest.approx(u / (y.sum() * (~y).sum()), abs=1e-12)  # same rank sums
    assert r.auc == pytest.approx(_auc_pairs(s[y], s[~y]), abs=1e-12)
    # DeLong variance from the O(n1 n0) structural components
    pos, neg = s[y], s[~y]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    var = np.var(psi.mean(1), ddof=1) / pos.size + np.var(psi.mean(0), ddof=1) / neg.size
    assert r.se == pytest.approx(np.sqrt(var), rel=1e-10)
    z = sps.norm.ppf(0.975)
    assert r.lo == pytest.approx(max(0, r.auc - z * r.se), abs=1e-12)
    assert r.hi == pytest.approx(min(1, r.auc + z * r.se), abs=1e-12)
    assert (r.n_pos, r.n_neg) == (y.sum(), (~y).sum())


def test_roc_curve_area_is_auc():
    rng = np.random.default_rng(7)
    y = rng.random(200) < 0.3
    s = np.round(rng.normal(size=200) + y, 1)
    fpr, tpr = st.roc_curve(s, y)
    assert fpr[0] == 0 and tpr[0] == 0 and fpr[-1] == 1 and tpr[-1] == 1
    area = np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2)  # trapezoids: ties count half
    assert area == pytest.approx(st.auc_mann_whitney(s, y).auc, abs=1e-12)


def test_auc_one_class_is_nan_with_note():
    r = st.auc_mann_whitney([0.1, 0.2, 0.3], [False, False, False])
    assert np.isnan(r.auc) and "no positive" in r.note
    r = st.auc_mann_whitney([0.1, 0.2, 0.3], [False, False, True])
    assert r.auc == 1.0 and np.isnan(r.lo) and "fewer than 2" in r.note


def test_spearman_matches_scipy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=50)
    y = np.round(x + rng.normal(size=50), 1)
    x[3] = np.nan
    r = st.spearman(x, y)
    ref = sps.spearmanr(np.delete(x, 3), np.delete(y, 3))
    assert r.rho == pytest.approx(ref.statistic, abs=1e-12) and r.pvalue == pytest.approx(ref.pvalue, rel=1e-9)
    assert r.n == 49
    assert np.isnan(st.spearman([1, 2], [3, 4]).rho)
    c = st.spearman([1, 1, 1, 1], [1, 2, 3, 4])
    assert np.isnan(c.rho) and "constant" in c.note


def test_definitions_edge_cases():
    top = np.array([1.0, 0.0, 2.0, 1.0])
    best = np.array([0.5, 0.0, 2.0, 0.0])
    bal = np.array([0.6, 0.0, 2.0, 0.5])
    np.testing.assert_array_equal(st.closable_share(top, best), [0.5, 0.0, 0.0, 1.0])
    rec = st.balancing_recovery(top, bal, best)
    assert rec[0] == pytest.approx(0.8) and np.isnan(rec[1]) and np.isnan(rec[2]) and rec[3] == 0.5
    ratio = st.selector_ratio(bal, best)
    assert ratio[0] == pytest.approx(1.2) and np.isnan(ratio[1]) and ratio[2] == 1 and np.isnan(ratio[3])


def test_pessimistic_closable_share():
    top = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    best = np.array([0.9, 0.9, 0.9, 0.9, np.nan])
    lb = np.array([0.9, 0.6, np.nan, 0.95, np.nan])
    status = np.array(["optimal", "unsolved", "unsolved", "improved", "invalid"])
    k = st.pessimistic_closable_share(top, best, lb, status)
    # optimal keeps es_best; unproved rows use the proved bound (0 -> kappa 1 when none), never
    # above es_best (row 3's bound 0.95 is capped at its es_best 0.9)
    np.testing.assert_allclose(k[:4], [0.1, 0.4, 1.0, 0.1], atol=1e-15)
    assert np.isnan(k[4])
    # an improved row is not proved either: its ES* may still lie down to its lower bound
    k2 = st.pessimistic_closable_share([1.0, 1.0], [0.9, 0.9], [0.5, 0.5], ["improved", "optimal"])
    np.testing.assert_allclose(k2, [0.5, 0.1], atol=1e-15)
    # the composite bound is the Wilson median bound of these pessimistic shares (invalid dropped)
    big = np.tile(np.arange(5), 3)
    bound, _ = st.wilson_upper_median_share(top[big], best[big], lb[big], status[big])
    # 9 of 12 at or below 0.4: its one-sided 95% Wilson lower end (= two-sided 90%) is >= 1/2, so 0.4
    assert sps.binomtest(9, 12).proportion_ci(confidence_level=0.90, method="wilson").low >= 0.5
    assert bound == st.wilson_median_upper_bound(k[big][~np.isnan(k[big])])[0] == 0.4


def test_substitution_sensitivity_direct():
    rng = np.random.default_rng(4)
    top = rng.uniform(1, 2, 41)
    pool = top * (1 - rng.uniform(0, 0.1, 41))
    best = pool * (1 - (rng.random(41) < 0.2) * rng.uniform(0, 0.05, 41))
    bal = top - 0.9 * (top - pool)
    r = st.substitution_sensitivity(top, bal, pool, best)
    kp, kb = (top - pool) / top, (top - best) / top
    assert r["median_kappa_pool"] == pytest.approx(np.median(kp), abs=1e-15)
    assert r["median_kappa_best"] == pytest.approx(np.median(kb), abs=1e-15)
    assert r["delta_median_kappa"] == pytest.approx(np.median(kb) - np.median(kp), abs=1e-15)
    assert r["max_paired_delta_kappa"] == pytest.approx(np.max(kb - kp), abs=1e-15)
    rb = (top - bal) / (top - best)
    assert r["median_recovery_best"] == pytest.approx(np.median(rb), abs=1e-12)
    assert r["median_recovery_pool"] == pytest.approx(0.9, abs=1e-12)
    assert r["n"] == 41


def test_cluster_bootstrap_against_a_direct_loop():
    rng = np.random.default_rng(3)
    labels = rng.choice(["a", "b", "c", "d", "e", "f"], size=80)
    shift = {c: i * 0.5 for i, c in enumerate("abcdef")}  # strong cluster effects
    x = np.array([shift[c] for c in labels]) + 0.1 * rng.normal(size=80)
    x[3] = np.nan
    got = st.cluster_bootstrap_median_ci(x, labels, n_boot=300, seed=9)
    # direct: clusters in sorted label order, k clusters drawn with replacement per resample
    keep = np.isfinite(x)
    names = sorted(set(labels[keep]))
    groups = [x[keep][labels[keep] == c] for c in names]
    r = np.random.default_rng(9)
    meds = [np.median(np.concatenate([groups[i] for i in r.integers(0, len(groups), size=len(groups))]))
            for _ in range(300)]
    lo, hi = np.quantile(meds, [0.025, 0.975])
    assert (got.lo, got.hi) == (pytest.approx(lo, abs=1e-15), pytest.approx(hi, abs=1e-15))
    assert got.median == np.median(x[keep]) and got.n == 79 and "1 non-finite" in got.note
    # clustering matters here: the cluster interval is much wider than the row interval
    row = st.bootstrap_median_ci(x, n_boot=300, seed=9)
    assert (got.hi - got.lo) > 2 * (row.hi - row.lo)
    one = st.cluster_bootstrap_median_ci([1.0, 2.0], ["a", "a"])
    assert np.isnan(one.lo) and "fewer than" in one.note
