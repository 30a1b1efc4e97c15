"""Statistics for the paper (docs/enumerate.md, docs/report.md): pure functions over float64 arrays.

Every function takes plain arrays and returns plain numbers (in small named tuples); none reads
or writes files. A statistic that is undefined for its input (too few values, one class only,
constant input) comes back as ``nan`` with a ``note`` saying why, never as an exception.

Definitions used throughout
---------------------------
- closable share ``kappa = (E(top) - ES*) / E(top)``; ``0`` when ``E(top) = 0`` (top-mass exact).
- balancing recovery ``(E(top) - E(bal)) / (E(top) - ES*)``; undefined (``nan``) when the gap
  ``E(top) - ES*`` is zero, since there is nothing to recover.
- selector ratio ``E(selector) / ES*``; undefined (``nan``) when ``ES* = 0``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as sps

#: Minimum finite values for a bootstrap interval of a median.
MIN_BOOTSTRAP = 2
#: Draws (resamples x sample size) per bootstrap batch; bounds working memory to about 70 MB.
BOOTSTRAP_BATCH_ELEMENTS = 2_000_000


class MedianCI(NamedTuple):
    """A median with its percentile-bootstrap interval; ``n`` finite values used."""

    median: float
    lo: float
    hi: float
    n: int
    note: str


class AUCResult(NamedTuple):
    """ROC AUC (Mann–Whitney) with a DeLong interval."""

    auc: float
    lo: float
    hi: float
    se: float
    n_pos: int
    n_neg: int
    note: str


class SpearmanResult(NamedTuple):
    rho: float
    pvalue: float
    n: int
    note: str


def _finite(x) -> tuple[np.ndarray, int]:
    x = np.asarray(x, dtype=np.float64).ravel()
    keep = np.isfinite(x)
    return x[keep], int(x.size - keep.sum())


def _check_resampling(n_boot, level) -> None:
    """ValueError naming the argument unless ``n_boot`` is a positive integer and ``level`` in (0, 1)."""
    if int(n_boot) != n_boot or int(n_boot) < 1:
        raise ValueError(f"n_boot={n_boot!r} must be a positive integer")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level={level!r} outside (0, 1)")


def bootstrap_batch(n: int, n_boot: int) -> int:
    """Resamples per batch for a sample of size ``n`` (a batch holds at most 2e6 draws, or one resample)."""
    return int(max(1, min(n_boot, BOOTSTRAP_BATCH_ELEMENTS // max(n, 1))))


def _resample_medians(v_sorted: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Medians of ``v_sorted[idx]`` row by row, without sorting: (b, n) indices -> (b,) medians.

    ``v_sorted`` is ascending, so a resample's k-th order statistic is ``v_sorted[j]`` for the
    smallest j whose cumulative count of draws exceeds k; counting draws (bincount) and a cumsum
    is O(b n), several times faster than partitioning, and gives exactly ``np.median(v[idx], -1)``.
    """
    b, n = idx.shape
    counts = np.bincount((idx + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n)
    cum = np.cumsum(counts, axis=1)
    lo = (cum <= (n - 1) // 2).sum(axis=1)
    hi = (cum <= n // 2).sum(axis=1)
    return (v_sorted[lo] + v_sorted[hi]) / 2.0


def bootstrap_median_ci(x, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> MedianCI:
    """Median of the finite values of ``x`` with a percentile-bootstrap interval.

    The resampling is exactly that of ``scipy.stats.bootstrap(..., method="percentile",
    vectorized=True, batch=bootstrap_batch(n, n_boot), rng=np.random.default_rng(seed))``:
    per batch ``rng.integers(0, n, (batch, n))`` indices, the median of each resample, then
    the linear-interpolated ``(1-level)/2`` and ``(1+level)/2`` quantiles. It is faster (the
    resample medians come from draw counts, see ``_resample_medians``) and bounds memory with
    batches.

    Parameters
    ----------
    x : array-like, shape (n,). NaN/inf values are dropped and counted in ``note``.
    n_boot : number of bootstrap resamples.
    seed : seed of ``numpy.random.default_rng``; the same seed gives the same interval.
    level : two-sided confidence level.

    Returns
    -------
    MedianCI(median, lo, hi, n, note); ``nan`` values with a note when fewer than 2 finite
    values (no interval) or none at all (no median).
    """
    _check_resampling(n_boot, level)
    v, dropped = _finite(x)
    n = v.size
    notes = [f"{dropped} non-finite value(s) dropped"] if dropped else []
    if n == 0:
        return MedianCI(np.nan, np.nan, np.nan, 0, "; ".join(notes + ["no finite values"]))
    med = float(np.median(v))
    if n < MIN_BOOTSTRAP:
        return MedianCI(med, np.nan, np.nan, n, "; ".join(notes + [f"n={n} < {MIN_BOOTSTRAP}: no interval"]))
    rng = np.random.default_rng(seed)
    batch = bootstrap_batch(n, n_boot)
    order = np.argsort(v, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    v_sorted = v[order]
    meds = []
    for k in range(0, n_boot, batch):
        b = min(batch, n_boot - k)
        idx = rng.integers(0, n, (b, n))  # the draws scipy makes; v[idx] == v_sorted[rank[idx]]
        meds.append(_resample_medians(v_sorted, rank[idx]))
    theta = np.concatenate(meds)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(theta, [alpha, 1.0 - alpha])
    return MedianCI(med, float(lo), float(hi), n, "; ".join(notes))


def cluster_bootstrap_median_ci(x, clusters, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> MedianCI:
    """Median of the finite values of ``x`` with a cluster-bootstrap percentile interval.

    Rows that share a cluster label (a text, or a (layer, head) family) are not independent: each
    resample draws the clusters with replacement (as many as there are) and takes the median of all
    rows of the drawn clusters. ``x`` and ``clusters`` of shape (n,); non-finite ``x`` dropped.
    Fewer than ``MIN_BOOTSTRAP`` clusters: NaN interval with a note.
    """
    _check_resampling(n_boot, level)
    x = np.asarray(x, dtype=np.float64).ravel()
    labels = np.asarray(clusters).ravel()
    if labels.shape != x.shape:
        raise ValueError(f"cluster_bootstrap_median_ci: {x.size} values, {labels.size} cluster labels")
    keep = np.isfinite(x)
    dropped = int(x.size - keep.sum())
    v, lab = x[keep], labels[keep]
    nan = float("nan")
    if v.size == 0:
        return MedianCI(nan, nan, nan, 0, "no finite values")
    _, inv = np.unique(lab, return_inverse=True)
    order = np.argsort(inv, kind="stable")
    groups = np.split(v[order], np.cumsum(np.bincount(inv))[:-1])
    k = len(groups)
    note = f"{dropped} non-finite value(s) dropped" if dropped else ""
    med = float(np.median(v))
    if k < MIN_BOOTSTRAP:
        return MedianCI(med, nan, nan, int(v.size), "; ".join(x for x in (note, f"fewer than {MIN_BOOTSTRAP} clusters: no interval") if x))
    rng = np.random.default_rng(seed)
    meds = np.empty(n_boot)
    for b in range(n_boot):
        pick = rng.integers(0, k, size=k)
        meds[b] = np.median(np.concatenate([groups[i] for i in pick]))
    alpha = (1.0 - level) / 2.0
    lo, hi = (float(q) for q in np.quantile(meds, [alpha, 1.0 - alpha]))
    return MedianCI(med, lo, hi, int(v.size), note)


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (no continuity correction) for ``k`` successes in ``n`` trials.

    Same as ``scipy.stats.binomtest(k, n).proportion_ci(level, method="wilson")``;
    ``(nan, nan)`` when ``n = 0``.
    """
    if int(k) != k or int(n) != n:
        raise ValueError(f"k={k} and n={n} must be integers")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level={level!r} outside (0, 1)")
    k, n = int(k), int(n)
    if n <= 0:
        return (np.nan, np.nan)
    if not 0 <= k <= n:
        raise ValueError(f"k={k} outside [0, n={n}]")
    z = sps.norm.ppf(0.5 + level / 2.0)
    phat = k / n
    denom = 1.0 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * np.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    # exact ends at k = 0 and k = n (the formula leaves a rounding residue of ~1e-17 there)
    return (0.0 if k == 0 else max(0.0, centre - half), 1.0 if k == n else min(1.0, centre + half))


def wilson_median_rank(n: int, level: float = 0.95) -> int | None:
    """The rank ``j`` of the one-sided Wilson upper bound on a median from ``n`` values.

    ``j`` is the smallest count ``k`` in 1..n whose sample share ``k / n`` has a one-sided
    Wilson lower bound (``z = Φ⁻¹(level)``) of at least 1/2; None when no ``k`` qualifies
    (``n < z²``: n < 3 at 95%).
    """
    if n < 1:
        return None
    k = np.arange(1, n + 1, dtype=np.float64)
    z = sps.norm.ppf(level)
    phat = k / n
    lo = ((phat + z * z / (2 * n)) - z * np.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n))) / (1.0 + z * z / n)
    ok = np.flatnonzero(lo >= 0.5)
    return int(ok[0]) + 1 if ok.size else None


def wilson_median_coverage(n: int, level: float = 0.95) -> float:
    """Exact coverage of ``wilson_median_upper_bound`` for ``n`` values of a continuous law.

    The bound is the order statistic ``x_(j)`` (``j = wilson_median_rank(n, level)``); it lies at
    or above the population median exactly when at most ``j - 1`` values fall below it, so the
    coverage is ``P(Bin(n, 1/2) <= j - 1)``. NaN where the bound is undefined. The one-sided
    Wilson rank gives ≈ ``level`` on average over n but less at some small n (0.875 at n = 3,
    ≈ 0.89-0.93 up to n ≈ 20 at 95%): the report prints this exact value beside the bound.
    """
    j = wilson_median_rank(n, level)
    return float(sps.binom.cdf(j - 1, n, 0.5)) if j is not None else float("nan")


def wilson_median_upper_bound(x, level: float = 0.95) -> tuple[float, str]:
    """One-sided ``level`` Wilson upper bound on the population median of ``x`` (distribution-free).

    The population median is at most ``t`` when the share of the population at or below ``t``
    is at least 1/2. The bound is ``x_(j)``, the smallest observed value whose count
    ``#{x_i <= t} >= j`` with ``j = wilson_median_rank(n, level)``: the first count whose share has
    a one-sided Wilson lower bound (``z = Φ⁻¹(level)``, 1.645 at 95%) of at least 1/2. Its exact
    coverage for that n is ``wilson_median_coverage(n, level)`` (report it beside the bound).

    Returns ``(bound, note)``; ``nan`` with a note when no rank qualifies (n < 3 at 95%).
    Non-finite values are dropped (counted in the note).
    """
    v, dropped = _finite(x)
    n = v.size
    if n == 0:
        return np.nan, "no finite values"
    j = wilson_median_rank(n, level)
    note = f"{dropped} non-finite value(s) dropped" if dropped else ""
    if j is None:
        return np.nan, f"n={n} too small for a one-sided Wilson bound on the median"
    return float(np.sort(v)[j - 1]), note


def closable_share(es_top, es_star) -> np.ndarray:
    """``kappa = (E(top) - ES*) / E(top)``, 0 where ``E(top) = 0``; shapes (n,) -> (n,)."""
    top = np.asarray(es_top, dtype=np.float64)
    star = np.asarray(es_star, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = (top - star) / top
    return np.where(top == 0, 0.0, k)


def balancing_recovery(es_top, es_balance, es_star) -> np.ndarray:
    """``(E(top) - E(bal)) / (E(top) - ES*)``; ``nan`` where the gap is zero (nothing to recover)."""
    top = np.asarray(es_top, dtype=np.float64)
    bal = np.asarray(es_balance, dtype=np.float64)
    star = np.asarray(es_star, dtype=np.float64)
    gap = top - star
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (top - bal) / gap
    return np.where(gap > 0, r, np.nan)


def selector_ratio(es_sel, es_star) -> np.ndarray:
    """``E(selector) / ES*``; ``nan`` where ``ES* = 0`` (the ratio is undefined)."""
    sel = np.asarray(es_sel, dtype=np.float64)
    star = np.asarray(es_star, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = sel / star
    return np.where(star > 0, r, np.nan)


def pessimistic_closable_share(es_top, es_best, lower_bound, status) -> np.ndarray:
    """Closable share with every unproved row counted as improved as far as its proof allows.

    For ``unsolved`` and ``improved`` rows (neither is proved optimal) the true ``ES*`` lies in
    ``[lower_bound, es_best]``; the pessimistic (largest) closable share is
    ``(E(top) - max(lower_bound, 0)) / E(top)``, or 1 when no finite lower bound was proved.
    ``optimal`` rows keep ``(E(top) - es_best) / E(top)``. ``invalid`` rows are ``nan``.
    """
    top = np.asarray(es_top, dtype=np.float64)
    best = np.asarray(es_best, dtype=np.float64)
    lb = np.asarray(lower_bound, dtype=np.float64)
    st = np.asarray(status).astype(str)
    lb_used = np.where(np.isfinite(lb), np.maximum(lb, 0.0), 0.0)
    open_ = (st == "unsolved") | (st == "improved")
    star = np.where(open_, np.minimum(lb_used, best), best)
    k = closable_share(top, star)
    return np.where(st == "invalid", np.nan, k)


def wilson_upper_median_share(es_top, es_best, lower_bound, status, level: float = 0.95) -> tuple[float, str]:
    """One-sided Wilson upper bound on the population median closable share, unproved rows counted as improved.

    ``wilson_median_upper_bound`` of ``pessimistic_closable_share(...)`` over the valid rows:
    every ``unsolved`` or ``improved`` row takes the largest closable share its proved lower bound allows.
    Arrays of shape (n,); returns ``(bound, note)``.
    """
    k = pessimistic_closable_share(es_top, es_best, lower_bound, status)
    return wilson_median_upper_bound(k[~np.isnan(k)], level)


def auc_mann_whitney(scores, labels, level: float = 0.95) -> AUCResult:
    """ROC AUC of ``scores`` for ``labels`` (True = positive) with a DeLong interval.

    ``AUC = U / (n1 n0)``: the share of (positive, negative) pairs where the positive scores
    higher, ties counted half — the Mann–Whitney U of the positives over ``n1 n0``. Its variance
    is DeLong's (1988) from the placement values (mid-ranks, so ties count half there too);
    the interval is ``AUC ± z se`` clipped to [0, 1]. Non-finite scores are dropped.

    Parameters
    ----------
    scores : (n,) float
    labels : (n,) bool
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    keep = np.isfinite(s)
    s, y = s[keep], y[keep]
    pos, neg = s[y], s[~y]
    n1, n0 = pos.size, neg.size
    if n1 == 0 or n0 == 0:
        which = "positive (hard)" if n1 == 0 else "negative (easy)"
        return AUCResult(np.nan, np.nan, np.nan, np.nan, n1, n0, f"no {which} rows: AUC undefined")
    r_all = sps.rankdata(s)
    r_pos = sps.rankdata(pos)
    r_neg = sps.rankdata(neg)
    u = r_all[y].sum() - n1 * (n1 + 1) / 2.0
    auc = u / (n1 * n0)
    # placement values: V10_i = share of negatives below positive i (ties half), V01_j likewise
    v10 = (r_all[y] - r_pos) / n0
    v01 = 1.0 - (r_all[~y] - r_neg) / n1
    if n1 < 2 or n0 < 2:
        return AUCResult(float(auc), np.nan, np.nan, np.nan, n1, n0, "fewer than 2 rows in a class: no interval")
    var = np.var(v10, ddof=1) / n1 + np.var(v01, ddof=1) / n0
    se = float(np.sqrt(var))
    z = sps.norm.ppf(0.5 + level / 2.0)
    return AUCResult(float(auc), float(max(0.0, auc - z * se)), float(min(1.0, auc + z * se)), se, n1, n0, "")


def roc_curve(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """ROC points ``(fpr, tpr)`` sweeping the threshold from +inf down, shape (k,) each."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    keep = np.isfinite(s)
    s, y = s[keep], y[keep]
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s)), s.size - 1] if s.size else np.array([], dtype=int)
    tp = np.cumsum(y)[last]
    fp = np.cumsum(~y)[last]
    n1, n0 = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fp / n0], np.r_[0.0, tp / n1]


def spearman(x, y) -> SpearmanResult:
    """Spearman rank correlation of the finite pairs, by ``scipy.stats.spearmanr``."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = a.size
    if n < 3:
        return SpearmanResult(np.nan, np.nan, n, f"n={n} < 3 pairs: Spearman undefined")
    if np.all(a == a[0]) or np.all(b == b[0]):
        return SpearmanResult(np.nan, np.nan, n, "constant input: Spearman undefined")
    res = sps.spearmanr(a, b)
    return SpearmanResult(float(res.statistic), float(res.pvalue), n, "")


def substitution_sensitivity(es_top, es_balance, es_pool, es_best) -> dict[str, float]:
    """How the medians move when solver improvements (``es_best``) replace the pool argmin.

    Returns medians of the closable share and of the balancing recovery under ``ES* = es_pool``
    and ``ES* = es_best``, the difference of the medians, and the median and maximum of the
    paired per-row differences of kappa. Rows with a non-finite ``es_top``, ``es_pool`` or ``es_best``
    are dropped; a non-finite ``es_balance`` (or recovery, NaN where ES* = es_top) leaves the row out
    of the recovery medians only.
    """
    top, bal, pool, best = (np.asarray(a, dtype=np.float64) for a in (es_top, es_balance, es_pool, es_best))
    keep = np.isfinite(top) & np.isfinite(pool) & np.isfinite(best)
    top, bal, pool, best = top[keep], bal[keep], pool[keep], best[keep]
    out: dict[str, float] = {"n": int(top.size)}
    if top.size == 0:
        nan = float("nan")
        out.update(
            median_kappa_pool=nan, median_kappa_best=nan, delta_median_kappa=nan,
            median_paired_delta_kappa=nan, max_paired_delta_kappa=nan,
            median_recovery_pool=nan, median_recovery_best=nan, delta_median_recovery=nan,
        )
        return out
    kp, kb = closable_share(top, pool), closable_share(top, best)
    rp, rb = balancing_recovery(top, bal, pool), balancing_recovery(top, bal, best)

    def med(a):
        a = a[np.isfinite(a)]
        return float(np.median(a)) if a.size else float("nan")

    d = kb - kp
    out.update(
        median_kappa_pool=med(kp),
        median_kappa_best=med(kb),
        delta_median_kappa=med(kb) - med(kp),
        median_paired_delta_kappa=med(d),
        max_paired_delta_kappa=float(np.max(d)),
        median_recovery_pool=med(rp),
        median_recovery_best=med(rb),
        delta_median_recovery=med(rb) - med(rp),
    )
    return out


class PairedComparison(NamedTuple):
    """Two methods compared on the same items: wins / losses / ties of ``a`` over ``b``, a two-sided
    sign test on the non-tied items, and a percentile-bootstrap interval of the mean difference
    (``a - b``, sign flipped when lower is better, so a positive difference favours ``a``)."""

    n: int
    wins: int
    losses: int
    ties: int
    pvalue: float
    mean_diff: float
    lo: float
    hi: float
    note: str


def paired_comparison(a, b, higher_is_better: bool = True, n_boot: int = 2000, seed: int = 0,
                      level: float = 0.95, tie_tol: float = 0.0) -> PairedComparison:
    """Paired comparison of scores ``a`` and ``b`` (same items, same order; non-finite pairs dropped).

    A win is ``a`` better than ``b`` by more than ``tie_tol``; the sign test is
    ``scipy.stats.binomtest(wins, wins + losses, 0.5)`` (p = 1 when every pair ties); the interval
    resamples the items with replacement ``n_boot`` times (seeded).
    """
    _check_resampling(n_boot, level)
    if not float(tie_tol) >= 0.0:
        raise ValueError(f"tie_tol={tie_tol!r} must be >= 0")
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired_comparison: a has {a.size} values, b has {b.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    d = (a - b)[keep] * (1.0 if higher_is_better else -1.0)
    n = int(d.size)
    nan = float("nan")
    if n == 0:
        return PairedComparison(0, 0, 0, 0, nan, nan, nan, nan, "no finite pairs")
    wins, losses = int((d > tie_tol).sum()), int((d < -tie_tol).sum())
    ties = n - wins - losses
    note = ""
    if wins + losses:
        pvalue = float(sps.binomtest(wins, wins + losses, 0.5).pvalue)
    else:
        pvalue, note = 1.0, "every pair ties"
    lo = hi = nan
    if n >= MIN_BOOTSTRAP:
        rng = np.random.default_rng(seed)
        means = np.empty(n_boot)
        step = bootstrap_batch(n, n_boot)
        for s in range(0, n_boot, step):
            k = min(step, n_boot - s)
            means[s:s + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)
        alpha = (1.0 - level) / 2.0
        lo, hi = (float(v) for v in np.quantile(means, [alpha, 1.0 - alpha]))
    else:
        note = note or f"fewer than {MIN_BOOTSTRAP} pairs: no interval"
    return PairedComparison(n, wins, losses, ties, pvalue, float(d.mean()), lo, hi, note)
