import itertools

import numpy as np
import pytest

from forcedweight.core import operator as op


def _row(rng, n=9, d=4):
    p = rng.random(n) ** 3
    p /= p.sum()
    return p, rng.normal(size=(n, d))


def test_identity_and_definition_agree():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, V = _row(rng)
        for s in range(1, 9):
            for S in itertools.islice(itertools.combinations(range(9), s), 10):
                direct = np.linalg.norm(op.forced_output(p, V, S) - op.dense_output(p, V))
                # tolerance: float64 sums of 9 terms, relative 1e-12
                assert op.forced_error(p, V, S) == pytest.approx(direct, rel=1e-12, abs=1e-15)
                assert op.forced_error_identity(p, V, S) == pytest.approx(direct, rel=1e-10, abs=1e-14)


def test_single_key_errors_match_dropping_one_key():
    rng = np.random.default_rng(1)
    p, V = _row(rng, 12, 3)
    e = op.single_key_errors(p, V)
    for j in range(12):
        keep = [i for i in range(12) if i != j]
        assert e[j] == pytest.approx(op.forced_error(p, V, keep), rel=1e-11)


def test_top_mass_ties_prefer_lower_index():
    p = np.array([0.2, 0.3, 0.2, 0.3])
    assert op.top_mass_set(p, 3).tolist() == [0, 1, 3]


def test_top_s_is_the_brute_force_best_set_with_lowest_indices_on_ties():
    # top_s(score, s) = the s-subset of largest total score, ties broken by the lexicographically
    # smallest index tuple: checked against every subset on small rows with many ties
    rng = np.random.default_rng(11)
    for _ in range(40):
        n = int(rng.integers(1, 8))
        sc = rng.integers(0, 3, n).astype(np.float64)
        s = int(rng.integers(1, n + 1))
        best = sorted(itertools.combinations(range(n), s), key=lambda c: (sorted((-sc[list(c)]).tolist()), c))[0]
        got = op.top_s(sc, s)
        assert got.tolist() == list(best) and got.dtype == np.int64
        assert op.top_mass_set(sc, s).tolist() == got.tolist()
        assert np.sort(op.rank_order(sc)[:s]).tolist() == got.tolist()


def test_free_weight_error_is_simplex_least_squares():
    from scipy.optimize import minimize

    rng = np.random.default_rng(2)
    for _ in range(10):
        p, V = _row(rng, 10, 5)
        S = [0, 2, 3, 7]
        ef = op.free_weight_error(p, V, S)
        mu = op.dense_output(p, V)
        X = V[S].T
        best = np.inf
        for start in range(4):
            w0 = np.full(4, 0.25)
            res = minimize(
                lambda w: np.sum((X @ w - mu) ** 2), w0, method="SLSQP",
                bounds=[(0, 1)] * 4, constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
                options={"ftol": 1e-15, "maxiter": 500},
            )
            best = min(best, np.sqrt(res.fun))
        # SLSQP is approximate: the exact active-set answer is never worse, and close
        assert ef <= best + 1e-9
        assert ef == pytest.approx(best, abs=1e-6)
        assert ef <= op.forced_error(p, V, S) + 1e-12
        assert op.penalty(p, V, S) >= 1 - 1e-9


def _simplex_lsq_by_faces(X, b):
    """Reference: the affine least squares on every face of the simplex; the best feasible one."""
    best = np.inf
    for r in range(1, X.shape[1] + 1):
        for F in itertools.combinations(range(X.shape[1]), r):
            XF = X[:, list(F)]
            D = XF[:, 1:] - XF[:, :1]
            t = np.linalg.lstsq(D, b - XF[:, 0], rcond=None)[0] if r > 1 else np.zeros(0)
            w = np.concatenate([[1.0 - t.sum()], t])
            if np.all(w >= -1e-12):
                best = min(best, np.linalg.norm(XF @ w - b))
    return best


@pytest.mark.parametrize("scale", [1e-8, 1.0, 1e8])
def test_free_weight_error_exact_at_any_scale_and_with_degenerate_values(scale):
    # regression: the NNLS-penalty start used absolute tolerances (wrong by 1e7 at scale 1e8,
    # uniform weights at scale 1e-8) and could return NaN weights on duplicated values
    rng = np.random.default_rng(3)
    for trial in range(60):
        k, d = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        X = rng.normal(size=(d, k)) * scale
        if trial % 3 == 1:
            X[:, 1:] = X[:, [0]]  # duplicated values
        elif trial % 3 == 2 and k >= 3:
            X[:, 2] = 0.5 * (X[:, 0] + X[:, 1])  # collinear values
        outside = rng.normal(size=d) * scale * (trial % 2)
        b = X @ rng.dirichlet(np.ones(k)) + outside
        w = op._simplex_lsq(X, b)
        assert np.all(w >= 0) and w.sum() == pytest.approx(1.0, abs=1e-12)
        got, ref = np.linalg.norm(X @ w - b), _simplex_lsq_by_faces(X, b)
        span = np.abs(X - b[:, None]).max() + np.abs(b).max()
        # exact up to float64 round-off: relative 1e-9 of the answer, 1e-12 of the value scale
        assert got <= ref * (1 + 1e-9) + 1e-12 * span


def _exact_error(p, V, S):
    """E(S) in exact rational arithmetic on the float64 inputs (then one rounding)."""
    from fractions import Fraction

    P = [Fraction(float(x)) for x in p]
    tot, w = sum(P), sum(P[i] for i in S)
    sq = Fraction(0)
    for j in range(V.shape[1]):
        col = [Fraction(float(x)) for x in V[:, j]]
        mu = sum(a * b for a, b in zip(P, col)) / tot
        sq += (sum(P[i] * col[i] for i in S) / w - mu) ** 2
    return float(sq) ** 0.5


def test_forced_error_accurate_with_offsets_tiny_kept_mass_and_tiny_values():
    # regressions: mu = p @ V rounded at eps * offset (relative error 1e-2 at offset 1e12);
    # w = 1 - p(S^c) lost the digits of a small kept mass (1e-4 relative); ||y|| underflowed
    rng = np.random.default_rng(5)
    for case in range(30):
        n = 8
        p = rng.random(n) ** 4
        V = rng.normal(size=(n, 2))
        S = np.sort(rng.choice(n, int(rng.integers(1, n)), replace=False))
        if case % 3 == 0:
            V = V + 1e12
        elif case % 3 == 1:
            p = 1e-12 * rng.random(n)
            p[0] = 1.0
            S = np.arange(1, 6)  # more than half the keys, a kept mass of ~1e-12
        else:
            V = V * 1e-170
        p = p / p.sum()
        # float64 round-off of a few sums: relative 1e-12
        assert op.forced_error(p, V, S) == pytest.approx(_exact_error(p, V, S), rel=1e-12)
        assert op.kept_mass(p, S) == pytest.approx(float(sum(p[S])), rel=1e-14)


def test_single_key_errors_accurate_for_a_dominant_key():
    # regression: 1 - p_j cancelled for a key holding nearly all the mass
    rng = np.random.default_rng(6)
    p = 1e-12 * rng.random(6)
    p[2] = 1.0
    p /= p.sum()
    V = rng.normal(size=(6, 3))
    e = op.single_key_errors(p, V)
    for j in range(6):
        keep = [i for i in range(6) if i != j]
        # exact rationals: relative 1e-12 is float64 round-off of a few sums
        assert e[j] == pytest.approx(_exact_error(p, V, keep), rel=1e-12)


def test_penalty_is_undefined_on_identical_values_and_infinite_under_a_shared_offset():
    from forcedweight.certify.record import penalties

    # identical values: E = EF = 0, π undefined. EF used to be formed uncentred (X w - mu), whose
    # 1-ulp leftover of |v| passed the floor and gave π ≈ 1e-17 on most such rows
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, d = int(rng.integers(2, 7)), int(rng.integers(1, 5))
        p = rng.dirichlet(np.ones(n))
        V = np.tile(rng.normal(size=d), (n, 1))
        S = op.top_mass_set(p, int(rng.integers(1, n)))
        e = op.forced_error(p, V, S)
        assert np.isnan(penalties(p, V, S, S, e, e)["pi_top"]) and np.isnan(op.penalty(p, V, S))
    # mu inside the kept triangle (EF = 0 < E): π infinite at any offset shared by every value
    base = np.array([[0.0, 0], [4, 0], [0, 4], [1, 1], [0.5, 0.2]])
    q, S = np.array([0.1, 0.1, 0.1, 0.4, 0.3]), np.array([0, 1, 2])
    for offset in (0.0, 1e3, 1e7, 1e12):
        V = base + offset
        e = op.forced_error(q, V, S)
        assert e == pytest.approx(0.6090885722855, rel=1e-4)  # float64 E at offset 1e12: relative 2e-5
        assert op.free_weight_error(q, V, S) <= op.PI_FLOOR * op.penalty_scale(q, V)
        assert penalties(q, V, S, S, e, e)["pi_top"] == np.inf and op.penalty(q, V, S) == np.inf
