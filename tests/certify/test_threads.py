"""The branch and bound on several threads (``solve_bnb(threads=K)``, ``solvers.subtrees``): the same
optimum as brute force, valid bounds when stopped, work stealing exercised, node limits deterministic."""

import numpy as np
import pytest

from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.solvers import subtrees
from forcedweight.certify.solvers.bnb import solve_bnb


def _pv(seed, n, d, peak):
    rng = np.random.default_rng(seed)
    p = np.exp(peak * rng.normal(size=n))
    p /= p.sum()
    return p, rng.normal(size=(n, d))


@pytest.fixture
def splits(monkeypatch):
    """Counts the parts handed from one thread to another (``SearchState.split`` calls that split)."""
    made = []
    orig = subtrees.SearchState.split

    def counted(self):
        new = orig(self)
        made.append(new is not None)
        return new

    monkeypatch.setattr(subtrees.SearchState, "split", counted)
    return made


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_search_is_exact(threads, splits, monkeypatch):
    """Threads from the first node (kick_work = 0 skips the serial incumbent phases), from the
    top-mass start, so the incumbent improves while parts run on other threads; batches of 3 nodes,
    so parts are stolen even on these small trees: the value equals brute force to relative 1e-12
    (the same sets' direct float64 values), and every result is proved."""
    monkeypatch.setattr(subtrees, "FIRST_BATCH", 3)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        n, s = int(rng.integers(14, 26)), int(rng.integers(2, 7))
        p, V = _pv(seed, n, int(rng.integers(2, 6)), [0.3, 1.0, 2.5][seed % 3])
        opt, _ = brute_force_best(p, V, s)
        res = solve_bnb(p, V, s, threads=threads, kick_work=0, polish=False)
        assert res.proved, (seed, n, s)
        assert abs(res.value - opt) <= 1e-12 * opt, (seed, n, s, res.value, opt)
        assert res.info["nodes"] == sum(res.info["level_nodes"])
    assert sum(splits) > 0  # some part was handed to an idle thread (work stealing ran)


def test_threaded_search_matches_serial_on_longer_rows():
    """N = 120, s = 5: the serial search needs 40,000-50,000 nodes, so the threads start after the
    incumbent phases (20,000 nodes), as in certify; both prove the same value (relative 1e-12)."""
    for seed in (100, 101):
        p, V = _pv(seed, 120, 6, 0.4)
        one = solve_bnb(p, V, 5, threads=1, time_limit=120.0)
        two = solve_bnb(p, V, 5, threads=2, time_limit=120.0)
        assert one.proved and two.proved
        assert one.info["nodes"] > 20_000
        assert abs(one.value - two.value) <= 1e-12 * one.value


def test_stopped_threaded_search_bound_is_valid():
    """Stopped by a short time limit, a threaded search's lower bound is <= the proved optimum (from
    the serial search) up to its relative 1e-9 tolerance, and its value is >= it."""
    for seed in (100, 101):
        # N = 160, s = 6: the serial proof needs 1.1-1.9 million nodes, far more than 0.05 s searches on any
        # machine (at N = 120, s = 5 it needed 38,000-56,000, and a fast run visited more than that in 0.05 s)
        p, V = _pv(seed, 160, 6, 0.4)
        ref = solve_bnb(p, V, 6, time_limit=300.0)
        assert ref.proved
        res = solve_bnb(p, V, 6, threads=2, time_limit=0.05, kick_work=0, polish=False, bound_time=5.0)
        assert res.lower_bound <= ref.value * (1 + 1e-9)
        assert res.value >= ref.value * (1 - 1e-12)
        # every thread stops at the limit (it does not finish its part)
        assert not res.proved and res.info["stopped_by"] == "time"
        assert res.info["nodes"] < ref.info["nodes"]


def test_node_limit_ignores_threads():
    """With a node limit the search runs on one thread: identical results for any thread count."""
    p, V = _pv(3, 400, 8, 0.5)
    a = solve_bnb(p, V, 8, node_limit=3000, threads=1)
    b = solve_bnb(p, V, 8, node_limit=3000, threads=4)
    assert (a.value, a.lower_bound, a.proved, a.info["nodes"]) == (b.value, b.lower_bound, b.proved, b.info["nodes"])
    assert np.array_equal(a.best_set, b.best_set)


def test_threads_stop_at_the_deadline(monkeypatch):
    """A deadline already past: each thread runs one batch (FIRST_BATCH nodes) and stops, inside its
    part, and the search is reported open with a frontier to bound."""
    from forcedweight.certify.solvers.bnb import _prepared, _search, search_order
    from forcedweight.certify.solvers.node_tests import NREF
    from forcedweight.core import operator as op

    monkeypatch.setattr(subtrees, "FIRST_BATCH", 50)
    p, V = _pv(100, 120, 6, 0.4)
    A_keys = op.centred_contributions(p, V)
    A, pw, nrm, G, lo, hi, use_box, kappa, gamma, wtop = _prepared(A_keys, p, search_order(A_keys, p), 5)
    serial = subtrees.SearchState(120, 5, A.shape[1])
    best = np.array([np.inf])
    bestset = np.arange(5)
    done, counts, frontier = subtrees.search_subtrees(_search, (A, pw, wtop, nrm, G, lo, hi, use_box), 5, 1e-9,
                                                      kappa, gamma, serial, best, bestset, NREF, True, 0.0, 2)
    assert not done and frontier is not None
    assert 0 < counts[0] <= 2 * 50
    assert counts[0] == counts[2:].sum()
