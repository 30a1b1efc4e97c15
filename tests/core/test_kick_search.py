"""The kick search (core.kick_search): never worse than its start, valid sets, deterministic, and
the brute-force optimum on small rows given enough work."""

from itertools import combinations

import numpy as np
import pytest

from forcedweight.core import operator as op
from forcedweight.core.kick_search import REL, _descend, _diagonal, kick_search
from forcedweight.core.swaps import swap_search


def _row(n, d, seed, sigma=1.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n) * sigma
    p = np.exp(z - z.max())
    return p / p.sum(), rng.normal(size=(n, d))


def _arrays(p, V):
    A = op.centred_contributions(p, V)
    return A, p.copy(), A @ A.T


@pytest.mark.parametrize("seed", range(6))
def test_never_worse_than_start_and_than_one_swap_descent(seed):
    p, V = _row(300, 16, seed, sigma=0.5)
    A, pw, G = _arrays(p, V)
    start = op.top_mass_set(p, 8).astype(np.int64)
    out = kick_search(A, pw, G, start, 5e6, 2, 0)
    assert out.shape == (8,) and np.unique(out).size == 8 and out.min() >= 0 and out.max() < 300
    e_out = op.forced_error(p, V, out)
    assert e_out <= op.forced_error(p, V, start)
    # the first descent is the 1-swap search itself; the kicks can only improve on it
    # (relative 1e-9: the Gram expansion and the direct sums round differently)
    local, _ = swap_search(p, V, start)
    assert e_out <= op.forced_error(p, V, local) * (1 + 1e-9)


def test_deterministic_for_a_seed():
    p, V = _row(200, 8, 7, sigma=0.5)
    A, pw, G = _arrays(p, V)
    start = op.top_mass_set(p, 6).astype(np.int64)
    a = kick_search(A, pw, G, start, 2e6, 2, 3)
    b = kick_search(A, pw, G, start, 2e6, 2, 3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", range(10))
def test_reaches_the_brute_force_optimum_on_small_rows(seed):
    n, s = 14, 5
    p, V = _row(n, 3, 100 + seed)
    A, pw, G = _arrays(p, V)
    best = min(op.forced_error(p, V, np.array(S)) for S in combinations(range(n), s))
    out = kick_search(A, pw, G, op.top_mass_set(p, s).astype(np.int64), 2e5, 2, 0)
    # same optimum up to the rounding of the two ways of summing (relative 1e-12)
    assert op.forced_error(p, V, out) <= best * (1 + 1e-12)


def test_multistart_valid_deterministic_and_reaches_small_optima():
    from forcedweight.core.kick_search import multistart_search

    p, V = _row(300, 16, 3, sigma=0.5)
    A, pw, G = _arrays(p, V)
    a = multistart_search(A, pw, G, 8, 3e6, 5)
    b = multistart_search(A, pw, G, 8, 3e6, 5)
    assert np.array_equal(a, b) and a.shape == (8,) and np.unique(a).size == 8
    assert a.min() >= 0 and a.max() < 300
    # every start is descended to a 1-swap local minimum: no single swap improves the result
    local, swaps = swap_search(p, V, a)
    assert op.forced_error(p, V, local) >= op.forced_error(p, V, a) * (1 - 1e-9)
    for seed in range(6):
        n, s = 14, 5
        p, V = _row(n, 3, 200 + seed)
        A, pw, G = _arrays(p, V)
        best = min(op.forced_error(p, V, np.array(S)) for S in combinations(range(n), s))
        out = multistart_search(A, pw, G, s, 2e5, 0)
        assert op.forced_error(p, V, out) <= best * (1 + 1e-12)


def test_windowed_starts_lie_in_a_mass_window_and_reach_small_optima():
    from forcedweight.core.kick_search import multistart_search

    p, V = _row(400, 16, 11, sigma=2.0)
    A, pw, G = _arrays(p, V)
    # window 0 (or >= N) is the uniform draw: the same random stream, the same result
    uniform = multistart_search(A, pw, G, 8, 3e6, 5)
    assert np.array_equal(uniform, multistart_search(A, pw, G, 8, 3e6, 5, 0))
    assert np.array_equal(uniform, multistart_search(A, pw, G, 8, 3e6, 5, 400))
    a = multistart_search(A, pw, G, 8, 3e6, 5, 32)
    assert np.array_equal(a, multistart_search(A, pw, G, 8, 3e6, 5, 32))
    assert a.shape == (8,) and np.unique(a).size == 8 and a.min() >= 0 and a.max() < 400
    # a budget of one scan allows one swap: 7 of the 8 keys are still the start's, which all lie
    # within 32 consecutive keys of the mass order (masses descending, ties to the lower index)
    rank = np.empty(400, np.int64)
    rank[np.argsort(-pw, kind="stable")] = np.arange(400)
    for seed in range(20):
        r = np.sort(rank[multistart_search(A, pw, G, 8, 1.0, seed, 32)])
        spans = [r[i + 6] - r[i] for i in range(2)]  # 7 of the 8, in order
        assert min(spans) < 32
    for seed in range(6):
        n, s = 14, 5
        p, V = _row(n, 3, 300 + seed)
        A, pw, G = _arrays(p, V)
        best = min(op.forced_error(p, V, np.array(S)) for S in combinations(range(n), s))
        out = multistart_search(A, pw, G, s, 2e5, 0, 2 * s)
        assert op.forced_error(p, V, out) <= best * (1 + 1e-12)


def _descend_reference(A, pw, G, members, work_cap):
    """The 1-swap descent of ``kick_search._descend``, every pair valued as sqrt(max(n2, 0)) / w'
    with NumPy (no screen): the list of sets it passes through."""
    N, s = pw.shape[0], members.shape[0]
    members = members.copy()
    path, work = [members.copy()], 0.0
    while work < work_cap:
        c = G[members].sum(axis=0)
        ny2, w = c[members].sum(), pw[members].sum()
        best = np.sqrt(max(ny2, 0.0)) / w * (1.0 - REL)
        base = ny2 - 2.0 * c[members] + G[members, members]
        wn = (w - pw[members])[:, None] + pw[None, :]
        n2 = base[:, None] + 2.0 * (c[None, :] - G[members]) + np.diag(G)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(wn > 0, np.sqrt(np.maximum(n2, 0.0)) / wn, np.inf)
        e[:, members] = np.inf
        work += s * N
        if not e.min() < best:
            break
        a, j = np.unravel_index(np.argmin(e), e.shape)  # the first minimum, as the scan in order
        members[a] = j
        path.append(members.copy())
    return path, work


@pytest.mark.parametrize("seed", range(4))
def test_descent_takes_the_same_swaps_as_an_unscreened_reference(seed):
    # _descend screens pairs by a squared comparison before valuing them; the swaps must be exactly
    # those of valuing every pair (a zero-mass key included, which can never make w' = 0 here)
    p, V = _row(400, 12, seed, sigma=0.7)
    p[7] = 0.0
    p /= p.sum()
    A, pw, G = _arrays(p, V)
    start = np.random.default_rng(seed).choice(400, 8, replace=False).astype(np.int64)
    path, work_ref = _descend_reference(A, pw, G, start, 1e9)
    assert len(path) > 2  # the start is no local minimum: several swaps are compared
    members = start.copy()
    in_set = np.zeros(400, np.bool_)
    in_set[members] = True
    work = _descend(A, pw, G, _diagonal(G), members, in_set, np.empty(400), 1e9)
    assert np.array_equal(members, path[-1]) and work == work_ref
