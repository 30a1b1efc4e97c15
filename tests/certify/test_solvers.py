"""Exact solvers over all N keys (branch and bound, SCIP) against the NumPy brute force."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forcedweight.core import operator as op
from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.solvers.bnb import REL_TOL, solve_bnb
from forcedweight.certify.solvers.scip import REL_EPS, RESOLUTION, solve_scip

from tests.rowgen import KINDS, make_row


def synthetic_row(n, sigma, seed, d=64):
    """Softmax weights of N(0, sigma^2) logits (large sigma: peaked), Gaussian values."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n) * sigma
    p = np.exp(z - z.max())
    return p / p.sum(), rng.normal(size=(n, d))


def check_result(res, p, V, s, ref, rel):
    assert res.best_set.dtype == np.int64 and res.best_set.shape == (s,)
    assert np.all(np.diff(res.best_set) > 0)
    # the reported set reproduces the reported value exactly
    assert res.value == op.forced_error(p, V, res.best_set)
    assert res.proved and res.lower_bound == res.value
    # proved within the solver's relative tolerance of the true minimum; the extra 1e-13
    # absolute covers float64 rounding of minima that are exact zeros
    assert ref - 1e-13 <= res.value <= ref * (1 + rel) + 1e-13


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 10), st.sampled_from([1, 2, 3, 8]),
                 st.sampled_from(KINDS)))
def test_bnb_matches_brute_force_every_s(row):
    seed, n, d, kind = row
    p, V = make_row(seed, n, d, kind)
    for s in range(1, n + 1):
        ref, _ = brute_force_best(p, V, s)
        res = solve_bnb(p, V, s)
        # bnb proves value <= ES / (1 - REL_TOL); 2x for rounding of the two evaluations
        check_result(res, p, V, s, ref, 2 * REL_TOL)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.integers(0, 2**31 - 1), st.integers(2, 6), st.sampled_from([1, 2, 8]),
                 st.sampled_from(KINDS)))
def test_scip_matches_brute_force_every_s(row):
    seed, n, d, kind = row
    p, V = make_row(seed, n, d, kind)
    for s in range(1, n + 1):
        ref, _ = brute_force_best(p, V, s)
        res = solve_scip(p, V, s, time_limit=20)
        if res.info["below_resolution"]:  # (the next test): not proved, and never below the optimum
            assert not res.proved and res.lower_bound == 0.0 and ref - 1e-13 <= res.value
            continue
        # SCIP proves no set has E < (1 - REL_EPS) value up to its feasibility tolerance
        check_result(res, p, V, s, ref, 2 * REL_EPS)


def test_scip_leaves_a_value_below_its_resolution_unsolved_at_once():
    """Row (seed 230, 6 keys, d 2, peaked) at s = 5: leaving out its 1.5e-13-mass key gives E = 4.8e-13, against
    a sum of the 5 largest ||a_i|| of about 1.1, so a round's scaled sums y / t are ~1e12 terms that must cancel
    to 1e-6 of 1. SCIP spent its whole 20 s limit on it and proved nothing (found by a hypothesis run with fresh
    examples); now it is refused at once, and the same row with that key's mass raised to 1e-8 is still proved."""
    p, V = make_row(230, 6, 2, "peaked")
    ref, _ = brute_force_best(p, V, 5)
    A = op.centred_contributions(p, V)
    reach = RESOLUTION * np.sort(np.linalg.norm(A, axis=1))[-5:].sum()
    assert op.forced_error_rounding(V, 5) < ref < reach  # above the rounding of 0, below SCIP's resolution
    res = solve_scip(p, V, 5, time_limit=20)
    assert res.info["below_resolution"] and res.info["rounds"] == 0 and res.seconds < 5.0
    assert not res.proved and res.lower_bound == 0.0 and res.value == ref
    k = int(np.argmin(p))
    q = p * (1 - 1e-8) / (1.0 - p[k])
    q[k] = 1e-8
    ref_q, _ = brute_force_best(q, V, 5)
    res_q = solve_scip(q, V, 5, time_limit=20)
    assert not res_q.info["below_resolution"] and res_q.info["rounds"] >= 1
    check_result(res_q, q, V, 5, ref_q, 2 * REL_EPS)


def test_scip_proves_a_value_at_the_rounding_of_zero_at_once():
    """A tied row whose best sets cancel exactly (E = 0 in reals) but one of them evaluates to 5.6e-17 in
    float64: no SCIP round can go below that (it ran into its time limit before), so a value at or below
    ``operator.forced_error_rounding`` (the float64 rounding of E, 1.1e-14 here) is proved with no round."""
    p, V = make_row(1, 6, 2, "tied")
    ref, _ = brute_force_best(p, V, 3)
    res = solve_scip(p, V, 3, incumbent=[0, 1, 5], time_limit=20)
    assert 0.0 < res.value <= op.forced_error_rounding(V, 3) and ref == 0.0
    assert res.proved and res.info["rounds"] == 0
    assert res.lower_bound == res.value and res.tolerance == res.value  # "no set has E < value - tolerance = 0"
    check_result(res, p, V, 3, ref, 2 * REL_EPS)
    above = solve_scip(p, V, 2, time_limit=20)  # values above the floor still go through SCIP's rounds
    assert above.proved and above.info["rounds"] >= 1 and above.value > op.forced_error_rounding(V, 2)


def test_solvers_on_partition_instances():
    # 1-D integers, uniform mass, s = m/2: ES = 0 iff a balanced equal-sum split exists
    yes = np.array([3.0, 1, 1, 2, 2, 1, 4, 2])  # {3,1,2,2} vs {1,1,4,2}
    no = np.array([3.0, 1, 1, 2, 2, 1, 4, 3])  # odd total: no equal split
    for a, zero in ((yes, True), (no, False)):
        m = a.size
        p = np.full(m, 1.0 / m)
        V = a[:, None]
        ref, _ = brute_force_best(p, V, m // 2)
        for res in (solve_bnb(p, V, m // 2), solve_scip(p, V, m // 2)):
            assert res.proved
            if zero:
                # an exact balanced split: the float64 sum of 4 centred terms cancels to ~1e-16
                assert res.value <= 1e-14
            else:
                # no split: the gap is 1/m^2 * |difference| >= 1/64 here; rel 2e-6 covers SCIP
                assert res.value == pytest.approx(ref, rel=2e-6) and ref > 1e-3


def test_bnb_and_scip_prove_synthetic_rows_with_warm_start():
    for sigma, n in ((3.0, 48), (1.0, 24)):
        p, V = synthetic_row(n, sigma, 11, d=16)
        bnb = solve_bnb(p, V, 4)
        assert bnb.proved
        warm = solve_bnb(p, V, 4, incumbent=bnb.best_set)
        scip = solve_scip(p, V, 4, incumbent=op.top_mass_set(p, 4), time_limit=30)
        assert warm.proved and scip.proved
        # two proofs of the same minimum: bnb to 1e-9, SCIP to 1e-6 relative
        assert warm.value == pytest.approx(bnb.value, rel=2 * REL_TOL)
        assert scip.value == pytest.approx(bnb.value, rel=2 * REL_EPS)


def test_unsolved_reports_a_valid_lower_bound():
    p, V = synthetic_row(60, 0.1, 3, d=64)  # flat: far beyond a few ms
    res = solve_bnb(p, V, 8, time_limit=0.0)
    assert not res.proved
    assert 0.0 <= res.lower_bound <= res.value
    assert res.value == op.forced_error(p, V, res.best_set)
    # a row bnb finishes fast, stopped after its first batch: the bound holds for the optimum
    p, V = synthetic_row(36, 0.5, 4, d=2)
    full = solve_bnb(p, V, 6, time_limit=30)
    part = solve_bnb(p, V, 6, time_limit=0.0)
    assert full.proved and not part.proved
    assert part.lower_bound <= full.value * (1 + 1e-12)  # rounding of the bound arithmetic
    assert part.value >= full.value * (1 - 2 * REL_TOL)
    p, V = synthetic_row(60, 0.1, 3, d=64)
    sres = solve_scip(p, V, 8, time_limit=0.2)
    assert not sres.proved and sres.lower_bound == 0.0 <= sres.value
    assert sres.value == op.forced_error(p, V, sres.best_set)


def test_bad_arguments():
    p, V = synthetic_row(6, 1.0, 0, d=2)
    for solve in (solve_bnb, solve_scip):
        with pytest.raises(ValueError):
            solve(p, V, 0)
        with pytest.raises(ValueError):
            solve(p, V, 3, incumbent=[0, 1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.integers(0, 2**31 - 1), st.integers(9, 22), st.sampled_from([1, 2, 5]),
                 st.sampled_from(KINDS), st.integers(2, 5)))
def test_bnb_from_a_bad_incumbent_with_and_without_polish(row):
    # the worst warm start (the s lightest keys): polishing moves it, the proof must not care
    seed, n, d, kind, s = row
    p, V = make_row(seed, n, d, kind)
    ref, _ = brute_force_best(p, V, s)
    bad = np.argsort(p, kind="stable")[:s]
    e_bad = op.forced_error(p, V, bad)
    for polish in (True, False):
        res = solve_bnb(p, V, s, incumbent=bad, polish=polish)
        check_result(res, p, V, s, ref, 2 * REL_TOL)
        assert res.value <= e_bad or not np.isfinite(e_bad)


def test_direction_steps_prune_more_and_stay_exact(monkeypatch):
    # rows large enough that the supergradient steps on u fire at many nodes: with them the
    # search visits fewer nodes, and with or without them it matches the brute force
    from forcedweight.certify.solvers import node_tests as nt

    for seed, sigma in ((5, 1.0), (6, 0.7)):
        p, V = synthetic_row(26, sigma, seed, d=6)
        ref, _ = brute_force_best(p, V, 5)
        nodes = {}
        for nref in (0, 2, nt.NREF):
            monkeypatch.setattr(nt, "NREF", nref)  # (node_tests.search_steps)
            res = solve_bnb(p, V, 5, time_limit=60)
            check_result(res, p, V, 5, ref, 2 * REL_TOL)
            nodes[nref] = res.info["nodes"]
        assert nodes[nt.NREF] < nodes[0]


def test_bnb_kick_search_mid_search_keeps_it_exact_and_deterministic(monkeypatch):
    # the kick search runs once the search has visited KICK_AFTER nodes, the random restarts at
    # RESTART_AFTER; set low here so these small rows reach both from a bad warm start: the proof
    # still matches the brute force, with and without them, and two node-limited runs through them
    # are identical
    import forcedweight.certify.solvers.bnb as bnb

    monkeypatch.setattr(bnb, "KICK_AFTER", 40)
    monkeypatch.setattr(bnb, "RESTART_AFTER", 80)  # the random restarts too
    reached = False
    for seed, sigma in ((5, 1.0), (6, 0.7), (7, 0.4)):
        p, V = synthetic_row(24, sigma, seed, d=5)
        ref, _ = brute_force_best(p, V, 5)
        bad = np.argsort(p, kind="stable")[:5]
        res = solve_bnb(p, V, 5, incumbent=bad, polish=True, time_limit=60)
        check_result(res, p, V, 5, ref, 2 * REL_TOL)
        assert res.info["kick_improved"] is not None  # the kick ran
        reached = reached or res.info["restart_improved"] is not None  # so did the restarts
        off = solve_bnb(p, V, 5, incumbent=bad, polish=True, time_limit=60, kick_work=0)
        check_result(off, p, V, 5, ref, 2 * REL_TOL)
        assert off.info["kick_improved"] is None
        runs = [solve_bnb(p, V, 5, incumbent=bad, node_limit=300, time_limit=60) for _ in range(2)]
        assert runs[0].info["nodes"] == runs[1].info["nodes"] == 300 or runs[0].proved
        assert np.array_equal(runs[0].best_set, runs[1].best_set)
        assert runs[0].lower_bound == runs[1].lower_bound and runs[0].value == runs[1].value
    assert reached


def test_bnb_restarts_again_with_the_next_seed_as_the_search_grows(monkeypatch):
    # restart phases j = 0, 1, ... run after RESTART_AFTER * RESTART_GROWTH**j nodes, each drawing
    # from seed j (uniform, then windowed starts), on one thread and on two; the proof stays exact
    import forcedweight.certify.solvers.bnb as bnb

    monkeypatch.setattr(bnb, "KICK_AFTER", 10)
    monkeypatch.setattr(bnb, "RESTART_AFTER", 20)
    monkeypatch.setattr(bnb, "RESTART_GROWTH", 2)
    seeds = []
    real = bnb.multistart_search

    def recording(A, pw, G, s, work, seed, window=0):
        seeds.append((seed, window > 0))
        return real(A, pw, G, s, work, seed, window)

    monkeypatch.setattr(bnb, "multistart_search", recording)
    p, V = synthetic_row(40, 0.3, 11, d=4)
    ref, _ = brute_force_best(p, V, 6)
    bad = np.argsort(p, kind="stable")[:6]
    res = solve_bnb(p, V, 6, incumbent=bad, time_limit=60, node_limit=170)
    due = [j for j in range(bnb.RESTART_PHASES) if 20 * 2 ** j <= 170]  # phases at 20, 40, 80, 160 nodes
    assert res.info["nodes"] == 170  # (the row takes more nodes than that)
    assert seeds == [(j, w) for j in due for w in (False, True)]
    for threads in (1, 2):
        seeds.clear()
        res = solve_bnb(p, V, 6, incumbent=bad, time_limit=60, threads=threads)
        check_result(res, p, V, 6, ref, 2 * REL_TOL)
        ran = len(seeds) // 2
        if threads == 1:  # the node-limited run's first 170 nodes, then as many more as the search takes
            assert seeds[:2 * len(due)] == [(j, w) for j in due for w in (False, True)]
        else:  # on two threads phases due close together may overlap: each seed once, with both windows
            assert ran >= 1 and sorted(seeds) == [(j, w) for j in range(ran) for w in (False, True)]


def test_bnb_on_peaked_rows_with_early_stopped_scans_and_long_row_steps(monkeypatch):
    # peaked masses (most keys light): the scans and the leaves stop early at most nodes; with the
    # long-row step count forced on (LONG_ROWS = 10) as well as off, bnb matches the brute force
    from forcedweight.certify.solvers import node_tests as nt

    for long_from in (nt.LONG_ROWS, 10):
        monkeypatch.setattr(nt, "LONG_ROWS", long_from)  # (node_tests.search_steps, bnb.bound_relax_iters)
        for seed in range(4):
            p, V = synthetic_row(40, 3.0, seed, d=4)
            for s in (2, 3, 4):
                ref, _ = brute_force_best(p, V, s)
                check_result(solve_bnb(p, V, s, time_limit=60), p, V, s, ref, 2 * REL_TOL)


def test_bnb_long_rows_take_their_own_steps_on_every_thread(monkeypatch):
    # rows of LONG_ROWS keys or more: NREF_LONG steps of length THETA_LONG / j**DECAY_LONG and warm starts of
    # WARM_STEPS steps, in the serial search and on the threads alike; shorter rows NREF steps of
    # THETA / j**DECAY, every test cold (every batch recorded)
    import threading

    import forcedweight.certify.solvers.bnb as bnb
    from forcedweight.certify.solvers import node_tests as nt

    assert (nt.THETA_LONG, nt.DECAY_LONG) != (nt.THETA, nt.DECAY)
    search = bnb._search
    seen = []

    def recorded(*args):
        # (nref, theta, decay, nwarm, whether on the main thread)
        seen.append((args[-6], args[-5], args[-4], args[-3], threading.current_thread() is threading.main_thread()))
        return search(*args)

    monkeypatch.setattr(bnb, "_search", recorded)
    monkeypatch.setattr(bnb, "KICK_AFTER", 20)  # the threads start after 20 nodes
    p, V = synthetic_row(40, 0.3, 3, d=4)
    ref, _ = brute_force_best(p, V, 5)
    bad = np.argsort(p, kind="stable")[:5]
    for long_from, steps in ((nt.LONG_ROWS, (nt.NREF, nt.THETA, nt.DECAY, 0)),
                             (10, (nt.NREF_LONG, nt.THETA_LONG, nt.DECAY_LONG, nt.WARM_STEPS))):
        monkeypatch.setattr(nt, "LONG_ROWS", long_from)
        seen.clear()
        res = solve_bnb(p, V, 5, incumbent=bad, threads=2, time_limit=60)
        check_result(res, p, V, 5, ref, 2 * REL_TOL)
        assert {x[:4] for x in seen} == {steps}
        assert {x[4] for x in seen} == {True, False}  # both the serial search and the threads ran
