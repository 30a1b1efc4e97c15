"""The relaxation bound of a node (certify/solvers/bounds.py) and its use in bnb's bounds."""

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.solvers.bnb import root_bound, solve_bnb
from forcedweight.certify.solvers.bounds import _project_capped, relax_bound
from forcedweight.core import operator as op


def _pv(seed, n, d, peak):
    rng = np.random.default_rng(seed)
    p = np.exp(peak * rng.normal(size=n))
    p /= p.sum()
    return p, rng.normal(size=(n, d))


def _node_min(A, p, T, k, r):
    """Brute force: min over completions S = T + r keys of rows k.. of ||y_S|| / p(S) (float64)."""
    best = np.inf
    for Z in itertools.combinations(range(k, A.shape[0]), r):
        S = list(T) + list(Z)
        w = p[S].sum()
        if w > 0:
            best = min(best, np.linalg.norm(A[S].sum(axis=0)) / w)
    return best


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(4, 12), d=st.integers(1, 12),
       peak=st.sampled_from([0.2, 1.0, 2.5]), iters=st.sampled_from([1, 20, 150]),
       phases=st.integers(0, 2), data=st.data())
def test_relax_bound_of_a_node_is_below_its_brute_force_minimum(seed, n, d, peak, iters, phases, data):
    p, V = _pv(seed, n, d, peak)
    A = op.centred_contributions(p, V)
    t = data.draw(st.integers(0, n - 2))
    k = data.draw(st.integers(t, n - 1))
    r = data.draw(st.integers(1, n - k))
    T = list(range(t))  # any fixed set before row k
    yT = A[T].sum(axis=0) if T else np.zeros(d)
    nrm = np.linalg.norm(A, axis=1)
    exact = _node_min(A, p, T, k, r)
    top = 2.0 * exact if np.isfinite(exact) and exact > 0 else 1.0
    lb = relax_bound(yT, float(p[T].sum()), A, p, nrm, k, r, top, iters, phases)
    # a proof: never above the node's brute-force minimum (float64, relative 1e-12)
    assert 0.0 <= lb <= exact * (1 + 1e-12) + 1e-300


def test_projection_onto_the_capped_simplex_is_the_nearest_point():
    """Against a float64 reference: the projection is feasible and no random feasible point of
    the set is nearer (tolerance 1e-9 on sums and distances)."""
    rng = np.random.default_rng(3)
    for _ in range(30):
        m = int(rng.integers(2, 30))
        r = int(rng.integers(1, m))
        v = rng.normal(size=m) * 2
        x = np.empty(m)
        _project_capped(v, r, x)
        assert abs(x.sum() - r) < 1e-9 and x.min() >= 0.0 and x.max() <= 1.0
        d0 = np.linalg.norm(x - v)
        for _ in range(50):
            z = rng.random(m)
            # a random feasible point: shift-and-clip z to sum r
            _project_capped(z, r, z)
            assert np.linalg.norm(z - v) >= d0 - 1e-9


def test_relaxation_raises_the_root_bound_on_high_dimensional_spread_rows():
    """Spread rows in d = 32: the first-level bound with the relaxation is never below the
    tests' alone and is strictly above it on most rows; both stay below bnb's proved optimum."""
    raised = 0
    for seed in range(5):
        p, V = _pv(seed, 60, 32, 0.5)
        a = root_bound(p, V, 6, relax_iters=0, refine_work=0)
        b = root_bound(p, V, 6, relax_iters=150, refine_work=0)
        assert b >= a
        raised += b > a * (1 + 1e-6)
        res = solve_bnb(p, V, 6, time_limit=60.0)
        if res.proved:
            assert b <= res.value * (1 + 1e-12)
    assert raised >= 3


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(6, 13), d=st.integers(4, 16),
       nodes=st.integers(1, 30), data=st.data())
def test_stopped_search_bounds_with_the_relaxation_stay_below_brute_force(seed, n, d, nodes, data):
    p, V = _pv(seed, n, d, 0.5)
    s = data.draw(st.integers(2, n - 1))
    opt, _ = brute_force_best(p, V, s)
    res = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0, relax_iters=100)
    off = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0, relax_iters=0)
    assert 0.0 <= res.lower_bound <= opt * (1 + 1e-12) + 1e-300
    # the relaxation only adds bounds: the search (value, nodes) is the same
    assert res.value == off.value and res.info["nodes"] == off.info["nodes"]
