"""Candidate pool and exact enumeration against the NumPy brute force."""

from itertools import combinations

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forcedweight.core import operator as op
from forcedweight.certify.enumerate import brute_force_best, enumerate_best
from forcedweight.certify.pool import candidate_pool

from tests.rowgen import KINDS, make_row


rows = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(1, 10),
    st.sampled_from([1, 2, 3, 8]),
    st.sampled_from(KINDS),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows)
def test_enumerate_matches_brute_force_every_s(row):
    seed, n, d, kind = row
    p, V = make_row(seed, n, d, kind)
    for s in range(1, n + 1):
        v, S = enumerate_best(p, V, np.arange(n), s)
        ref, _ = brute_force_best(p, V, s)
        # both are forced_error on (possibly different, tied) minimisers; float64 sums of <= 10
        # terms agree to ~1e-15 relative, so 1e-9 relative + 1e-13 absolute is generous
        assert v == pytest.approx(ref, rel=1e-9, abs=1e-13)
        assert S.dtype == np.int64 and S.shape == (s,) and np.all(np.diff(S) > 0)
        # the reported set reproduces the reported value bit for bit
        assert v == op.forced_error(p, V, S)


def test_enumerate_on_a_sub_pool_is_the_pool_minimum():
    rng = np.random.default_rng(3)
    for _ in range(5):
        n, d = 14, 5
        p = rng.random(n) ** 3
        p /= p.sum()
        V = rng.normal(size=(n, d))
        pool = np.sort(rng.choice(n, 9, replace=False))
        for s in (1, 2, 4, 7, 9):
            v, S = enumerate_best(p, V, pool, s)
            ref = min(op.forced_error(p, V, c) for c in combinations(pool.tolist(), s))
            assert set(S.tolist()) <= set(pool.tolist())
            # same float64 operator on the minimiser: equal up to tie rounding
            assert v == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_many_chunks_and_rescan_match_brute_force():
    # C(20, 10) = 184756 subsets: 64 chunks, parallel scan; a row with exact duplicates makes
    # many near-zero candidates so the rounding-safe rescan path runs as well
    rng = np.random.default_rng(4)
    n, d = 20, 3
    p = rng.random(n) + 0.2
    p /= p.sum()
    V = rng.normal(size=(n, d))
    for s in (10, 6):
        v, S = enumerate_best(p, V, np.arange(n), s)
        ref, _ = brute_force_best(p, V, s)
        assert v == pytest.approx(ref, rel=1e-12)
    p = np.ones(n) / n
    V = np.repeat(rng.normal(size=(n // 2, d)), 2, axis=0)  # pairs: E = 0 reachable many ways
    v, S = enumerate_best(p, V, np.arange(n), 10)
    ref, _ = brute_force_best(p, V, 10)
    # an exact zero is only reached up to rounding of sums of 10 terms of size ~1/n
    assert v <= 1e-15 and ref <= 1e-15


def test_large_pools_at_small_s_match_brute_force_and_the_pair_table():
    # P = 200 keys at s = 2 and 3 (1.3e6 subsets at s = 3: 81 chunks, each reading the pool's one
    # pair table) against the brute force, with distinct and with repeated values (many near-tied candidates),
    # and with light keys
    from forcedweight.certify.enumerate import pair_table

    rng = np.random.default_rng(6)
    n, d = 200, 8
    p = np.exp(rng.normal(size=n))
    p /= p.sum()
    G = rng.normal(size=(5, 5))
    G = G @ G.T
    R = pair_table(G, np.diag(G).copy())
    assert np.array_equal(R, 2.0 * G + np.diag(G)[None, :])  # R[k1, k2] = 2 G[k1, k2] + G[k2, k2]
    light = p * np.where(rng.random(n) < 0.3, 1e-13, 1.0)  # a third of the keys ~1e-13 of the rest: sets of
    light /= light.sum()  # light keys, whose margins take the pair's own norms (enumerate._scan)
    rows = ((p, rng.normal(size=(n, d))), (p, rng.normal(size=(40, d))[rng.integers(0, 40, size=n)]),
            (light, rng.normal(size=(n, d))))
    for p, V in rows:
        for s in (2, 3):
            v, S = enumerate_best(p, V, np.arange(n), s)
            ref, _ = brute_force_best(p, V, s)
            assert v == pytest.approx(ref, rel=1e-12, abs=1e-15)  # (both forced_error on tied minimisers)
            assert v == op.forced_error(p, V, S)


def test_enumerate_bytes_bounds_the_peak_with_two_tables_and_none_at_s_1():
    # tracemalloc sees NumPy's allocations (the kernels' own are O(P s) per chunk): the peak of a call holds the
    # Gram matrix and the pair table and no third P x P array (the pair table built in place), stays under the
    # estimate certify's --max-memory check uses, and at s = 1 no table is built at all
    import tracemalloc

    from forcedweight.certify.enumerate import enumerate_bytes

    rng = np.random.default_rng(8)
    for n, P, s in ((1400, 1200, 2), (500, 400, 3), (1400, 1200, 1)):
        p = np.exp(rng.normal(size=n))
        p /= p.sum()
        V = rng.normal(size=(n, 4))
        pool = np.sort(rng.choice(n, size=P, replace=False))
        enumerate_best(p, V, pool, s)  # compiled before the count
        tracemalloc.start()
        try:
            v, S = enumerate_best(p, V, pool, s)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        table = 8 * P * P
        assert peak <= enumerate_bytes(n, 4, P, s), (P, s, peak)
        if s == 2:  # (few chunks: the tables are nearly all of it)
            assert 2 * table <= peak < 2.5 * table, (P, s, peak)  # (three tables before: 3.1x)
        elif s == 3:  # (648 chunks' candidate lists beside the tables)
            assert 2 * table <= peak, (P, s, peak)
        else:
            assert peak < 0.25 * table, (P, s, peak)  # (the Gram matrix before: 1.1x)
        assert v == op.forced_error(p, V, S)


def test_cancellation_large_offsets():
    # values share a huge common offset: centring cancels it; the true optimum has E ~ 1e-9
    rng = np.random.default_rng(5)
    n, d = 12, 2
    p = np.full(n, 1.0 / n)
    V = 1e6 + rng.normal(size=(n, d)) * 1e-3
    for s in (3, 6):
        v, _ = enumerate_best(p, V, np.arange(n), s)
        ref, _ = brute_force_best(p, V, s)
        # forced_error on tied-or-equal sets; the offset costs ~1e6 * eps = 2e-10 absolute
        assert v == pytest.approx(ref, rel=1e-6, abs=1e-9)


def test_ties_go_to_the_lexicographically_smallest_set():
    n = 8
    p = np.full(n, 1.0 / n)
    V = np.ones((n, 3))  # every set has E = 0, exactly in any order of the sums (masses 1/8: 1/9 left 8.5e-32 on some CPUs)
    for s in range(1, n + 1):
        v, S = enumerate_best(p, V, np.arange(n), s)
        assert v == 0.0 and S.tolist() == list(range(s))


def test_result_does_not_depend_on_thread_count():
    rng = np.random.default_rng(6)
    n = 22
    p = np.ones(n) / n
    V = np.round(rng.normal(size=(n, 2)) * 2)  # many exact ties
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = enumerate_best(p, V, np.arange(n), 7)
        numba.set_num_threads(before)
        many = enumerate_best(p, V, np.arange(n), 7)
    finally:
        numba.set_num_threads(before)
    assert one[0] == many[0] and one[1].tolist() == many[1].tolist()
    serial = enumerate_best(p, V, np.arange(n), 7, parallel=False)
    forced = enumerate_best(p, V, np.arange(n), 7, parallel=True)
    assert serial[1].tolist() == forced[1].tolist() == one[1].tolist()


def test_candidate_pool_contents():
    rng = np.random.default_rng(7)
    for _ in range(10):
        n = int(rng.integers(5, 40))
        p = rng.random(n) ** 4
        p[rng.integers(n)] = p[rng.integers(n)]  # a possible mass tie
        p /= p.sum()
        V = rng.normal(size=(n, 4))
        s = int(rng.integers(1, n + 1))
        a, b = int(rng.integers(0, 6)), int(rng.integers(0, 6))
        pool = candidate_pool(p, V, s, pool_mass=a, pool_error=b)
        e = op.single_key_errors(p, V)
        by_mass = sorted(range(n), key=lambda i: (-p[i], i))[: s + a]
        by_err = sorted(range(n), key=lambda i: (-e[i], i))[:b]
        assert pool.dtype == np.int64
        assert pool.tolist() == sorted(set(by_mass) | set(by_err))
        assert pool.size <= n


def test_bad_arguments():
    p = np.full(4, 0.25)
    V = np.eye(4)
    with pytest.raises(ValueError):
        enumerate_best(p, V, np.arange(3), 4)
    with pytest.raises(ValueError):
        enumerate_best(p, V, [0, 4], 1)
    with pytest.raises(ValueError):
        brute_force_best(p, V, 0)
    with pytest.raises(ValueError):
        candidate_pool(p, V, 2, pool_mass=-1)


def test_large_s_close_to_a_large_pool():
    # C(70, 68) = 2415 subsets, but the binomial table passes C(70, 35) > 2**63 (clipped)
    rng = np.random.default_rng(8)
    n = 70
    p = rng.random(n)
    p /= p.sum()
    V = rng.normal(size=(n, 3))
    v, S = enumerate_best(p, V, np.arange(n), 68)
    ref = min(op.forced_error(p, V, c) for c in combinations(range(n), 68))
    # same float64 operator on the minimiser (ties only up to rounding)
    assert v == pytest.approx(ref, rel=1e-12) and S.size == 68


@pytest.mark.parametrize("scale", [1e-170, 1e160])
def test_value_scale_does_not_change_the_best_set(scale):
    # regression: the Gram entries underflowed (every subset looked like E = 0: the
    # lexicographically first set came back) or overflowed (inf/nan: a crash); E is homogeneous
    # in V, so the best set of c V is the best set of V
    rng = np.random.default_rng(4)
    for _ in range(4):
        n, s = 12, int(rng.integers(2, 6))
        p = rng.random(n) ** 2
        p /= p.sum()
        V = rng.normal(size=(n, 2))
        v0, S0 = brute_force_best(p, V, s)
        v, S = enumerate_best(p, V * scale, np.arange(n), s)
        vb, Sb = brute_force_best(p, V * scale, s)
        # the sets found on c V are optimal for V (relative 1e-9: float64 round-off of E)
        assert op.forced_error(p, V, S) <= v0 * (1 + 1e-9)
        assert op.forced_error(p, V, Sb) <= v0 * (1 + 1e-9)
        assert v == pytest.approx(op.forced_error(p, V, S) * scale, rel=1e-9)


def test_pool_of_zero_mass_keys_gives_inf_not_a_crash():
    # regression: no subset passed the w > 0 filter, and the empty candidate list crashed
    p = np.array([0.0, 0.0, 0.0, 0.5, 0.5])
    V = np.arange(10.0).reshape(5, 2)
    v, S = enumerate_best(p, V, [0, 1, 2], 2)
    assert v == np.inf and S.tolist() == [0, 1]
    assert op.forced_error(p, V, S) == np.inf


@pytest.mark.parametrize("seed", range(12))
def test_brute_force_is_exact_where_masses_span_300_decades(seed):
    """The NumPy reference on rows where some masses are 1e-300..1e-150 of the others: a sum of such keys
    squares to 0, and passed for E = 0 (the reference then returned a set of E ~ 1-3 on rows whose
    optimum, the heavy keys', is ~0). Checked against E of every subset by the operator (a loop) and
    against the Numba enumeration."""
    rng = np.random.default_rng(seed)
    n = 11
    p = np.exp(rng.normal(size=n))
    light = rng.integers(1, n - 3)
    p[:light] *= 10.0 ** rng.uniform(-300, -150, size=light)
    p /= p.sum()
    V = rng.normal(size=(n, 3))
    s = int(rng.integers(2, 5))
    loop = min(op.forced_error(p, V, np.array(c)) for c in combinations(range(n), s))
    value, best = brute_force_best(p, V, s)
    # ties within the operator's own rounding (values here reach ~1e-17, E's float64 noise)
    assert value <= loop * (1 + 1e-12) + 1e-15
    assert value == op.forced_error(p, V, best)
    e_value, _ = enumerate_best(p, V, np.arange(n), s)
    assert abs(e_value - value) <= 1e-12 * value + 1e-15
