"""LP-direction bounds (certify.solvers.lp_bound) and their use on a stopped search's frontier:
always at most the brute-force minimum of the sets they cover; > 0 where the relaxation is."""

import itertools

import numpy as np
import pytest

from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.solvers.bnb import solve_bnb
from forcedweight.certify.solvers.search_row import prepare
from forcedweight.certify.solvers.lp_bound import node_bound, tail_bound
from forcedweight.core import operator as op


def _search_arrays(seed, n, d, peak):
    rng = np.random.default_rng(seed)
    p = np.exp(peak * rng.normal(size=n))
    p /= p.sum()
    V = rng.normal(size=(n, d))
    A0 = op.centred_contributions(p, V)
    order = op.rank_order(p)
    A, pw, nrm, *_ = prepare(A0, p, 3, order)
    return p, V, A, pw, nrm


def _min_over(A, pw, sets):
    return min(np.linalg.norm(A[list(S)].sum(axis=0)) / pw[list(S)].sum() for S in sets)


@pytest.mark.parametrize("seed", range(12))
def test_node_and_tail_bounds_are_below_the_brute_force_minimum(seed):
    n, d, s = 11, 1 + seed % 4, 3 + seed % 2
    _, _, A, pw, nrm = _search_arrays(seed, n, d, (0.3, 1.0, 2.5)[seed % 3])
    for k in range(n - s + 1):
        tail_sets = list(itertools.combinations(range(k, n), s))
        node_sets = [(k,) + c for c in itertools.combinations(range(k + 1, n), s - 1)]
        top = 10.0 * _min_over(A, pw, tail_sets)
        # proofs: float64 with rounding margins, so at most the minimum (relative 1e-12)
        assert 0.0 <= tail_bound(A, pw, nrm, k, s, top) <= _min_over(A, pw, tail_sets) * (1 + 1e-12)
        assert 0.0 <= node_bound(A, pw, nrm, k, s, top) <= _min_over(A, pw, node_sets) * (1 + 1e-12)


def test_bounds_are_positive_where_zero_is_outside_the_subset_polytope():
    # every contribution of the keys >= 4 has a positive first coordinate, so no s of them (not even
    # fractionally) sum to 0: the tail's relaxation, and so its LP bound, is > 0; the quick tests
    # (projection along y_T) cannot see this for the tail (T empty)
    rng = np.random.default_rng(3)
    N, d, s = 30, 5, 4
    A = rng.normal(size=(N, d))
    A[4:, 0] = np.abs(A[4:, 0]) + 0.5
    pw = np.sort(rng.uniform(0.01, 0.1, size=N))[::-1].copy()
    nrm = np.sqrt((A * A).sum(axis=1))
    b = tail_bound(A, pw, nrm, 4, s, 100.0)
    assert b > 0.0
    # and never above the true minimum over those subsets
    best = _min_over(A, pw, itertools.combinations(range(4, N), s))
    assert b <= best * (1 + 1e-12)
    assert node_bound(A, pw, nrm, 6, s, 100.0) > 0.0


@pytest.mark.parametrize("seed", range(8))
def test_frontier_with_lp_nodes_and_tails_stays_a_proof(seed, monkeypatch):
    # force the LP path at every first-level node (STOP_BELOW = 1: every bound is "low"), stop the
    # search early, and compare the stopped search's bound with the brute-force optimum
    import forcedweight.certify.solvers.frontier as fr

    monkeypatch.setattr(fr, "STOP_BELOW", 1.0)
    rng = np.random.default_rng(100 + seed)
    n, d, s = 13, 2 + seed % 3, 4
    p = np.exp((0.3, 1.0, 2.0)[seed % 3] * rng.normal(size=n))
    p /= p.sum()
    V = rng.normal(size=(n, d))
    opt, _ = brute_force_best(p, V, s)
    for nodes in (1, 5, 40):
        res = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0)
        assert 0.0 <= res.lower_bound <= opt * (1 + 1e-12) + 1e-300
        if not res.proved:
            off = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0, tail_lps=0)
            assert off.value == res.value and off.info["nodes"] == res.info["nodes"]  # only the bound moves


def test_refine_work_zero_turns_off_all_bound_work_through_the_registry(monkeypatch):
    # callers that use only the best set (the selection-ceiling audit) pass refine_work = 0: then no
    # LP runs either, and the bound is the plain first-level pass's
    import forcedweight.certify.solvers.frontier as fr
    from forcedweight.certify.options import run_solver

    monkeypatch.setattr(fr, "STOP_BELOW", 1.0)  # every first-level node would call for an LP
    calls = []
    monkeypatch.setattr(fr, "node_bound", lambda *a: calls.append(a) or 0.0)
    rng = np.random.default_rng(4)
    p = np.exp(rng.normal(size=40))
    p /= p.sum()
    V = rng.normal(size=(40, 3))
    start = op.top_mass_set(p, 5)
    off, _ = run_solver("bnb", p, V, 5, start, 60.0, node_limit=3, refine_work=0)
    plain = solve_bnb(p, V, 5, incumbent=start, node_limit=3, time_limit=60.0, refine_work=0, tail_lps=0)
    assert not off.proved and off.lower_bound == plain.lower_bound and not calls
    run_solver("bnb", p, V, 5, start, 60.0, node_limit=3)  # the default does call it
    assert calls
