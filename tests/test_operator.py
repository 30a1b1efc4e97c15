import itertools

import numpy as np
import pytest

from forcedweight import operator as op


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
