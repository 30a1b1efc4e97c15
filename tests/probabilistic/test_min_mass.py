"""πmin-h's per-head step (probabilistic.min_mass_mixture): the least uniform mixing that gives every
entry at least min_mass / n, checked against the closed form and by brute force over a grid of weights."""

from __future__ import annotations

import numpy as np
import pytest

from forcedweight.errors import InputError
from forcedweight.probabilistic import min_mass_mixture


def test_closed_form_and_untouched_when_already_above():
    pi = np.array([0.7, 0.3, 0.0, 0.0])
    out = min_mass_mixture(pi, 0.4)
    lam = (0.1 - 0.0) / (0.25 - 0.0)
    np.testing.assert_allclose(out, (1 - lam) * pi + lam / 4, rtol=0, atol=1e-15)
    assert out.min() == pytest.approx(0.4 / 4, abs=1e-15) and out.sum() == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_array_equal(min_mass_mixture(np.full(4, 0.25), 0.4), np.full(4, 0.25))
    with pytest.raises(InputError, match="min_mass"):
        min_mass_mixture(pi, 1.5)


def test_least_mixing_by_brute_force():
    """The weight found is the smallest on a fine grid that meets the floor (grid step 1e-5)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        pi = rng.dirichlet(np.full(30, 0.2))
        delta = rng.uniform(0.05, 0.9)
        out = min_mass_mixture(pi, delta)
        lam = (out[0] - pi[0]) / (1 / 30 - pi[0])
        grid = np.arange(0, 1 + 1e-5, 1e-5)
        ok = grid[((1 - grid)[:, None] * pi + grid[:, None] / 30).min(axis=1) >= delta / 30 - 1e-15]
        assert abs(lam - ok[0]) <= 1e-5
        # every importance weight c / (m pi') is then at most c n / (m delta)
        assert (1 / out).max() <= 30 / delta * (1 + 1e-12)
