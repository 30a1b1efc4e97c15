"""Proved lower bounds of stopped searches, the pool-restricted branch and bound, node limits, warm-up."""

import math

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forcedweight import rows
from forcedweight.certify import CertifyOptions, certify_file
from forcedweight.certify.enumerate import brute_force_best, enumerate_best
from forcedweight.certify.pool import bnb_in_pool, candidate_pool, pool_optimum
from forcedweight.certify.record import proof_gap
from forcedweight.certify.solvers.bnb import root_bound, solve_bnb
from forcedweight.certify.solvers.search_row import prepare
from forcedweight.certify.warmup import warm_up
from forcedweight.core import operator as op
from forcedweight.errors import InputError


def _pv(seed, n, d, peak):
    rng = np.random.default_rng(seed)
    p = np.exp(peak * rng.normal(size=n))
    p /= p.sum()
    return p, rng.normal(size=(n, d))


def _ceil(opt, p, V, s):
    """The most a proved bound may exceed the brute-force optimum ``opt`` by float64 rounding:
    relative 1e-12, plus the error of evaluating E on the centred contributions (the solver's
    ``a_i = p_i (v_i - mu)``, summed in another order than the brute force's), at most about
    (N + d) eps * sum |p_i v_i| (with mu's share) over the smallest kept mass; it matters only for
    near-cancelling sets (E ~ 1e-5 of the scale of the a_i, where the relative 1e-12 is too tight)."""
    scale = float(np.abs(p[:, None] * V).sum() + np.abs(V).max() * p.sum())
    return opt * (1 + 1e-12) + 16 * (p.size + V.shape[1]) * np.finfo(float).eps * scale / np.sort(p)[:s].sum()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(5, 13), d=st.integers(1, 4),
       peak=st.sampled_from([0.3, 1.0, 2.5]), nodes=st.integers(1, 40), data=st.data())
def test_every_lower_bound_is_below_the_brute_force_optimum(seed, n, d, peak, nodes, data):
    p, V = _pv(seed, n, d, peak)
    s = data.draw(st.integers(1, n - 1))
    opt, _ = brute_force_best(p, V, s)
    res = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0)
    rb = root_bound(p, V, s)
    # bounds are proofs: never above the optimum (brute force, up to float64 rounding: _ceil)
    assert 0.0 <= res.lower_bound <= _ceil(opt, p, V, s)
    assert 0.0 <= rb <= _ceil(opt, p, V, s)
    assert res.value >= opt * (1 - 1e-12)
    if res.proved:
        assert res.value == pytest.approx(opt, rel=1e-9)


def test_open_rows_keep_a_positive_bound_where_the_root_bound_is():
    """Stopped after a few nodes, the bound over the open frontier stays > 0 where the first-level
    bound is > 0, and is at most the brute-force optimum."""
    positive = 0
    for seed in range(40):
        p, V = _pv(seed, 16, 3, 1.5)
        s = 3 + seed % 4
        rb = root_bound(p, V, s)
        opt, _ = brute_force_best(p, V, s)
        for nodes in (1, 7, 25):
            res = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0)
            assert res.lower_bound <= opt * (1 + 1e-12)
            if rb > 0:
                assert res.lower_bound > 0.0
        positive += rb > 0
    assert positive >= 10  # the property was exercised (rows with a positive root bound)


def test_node_limit_stops_deterministically():
    p, V = _pv(5, 200, 4, 1.0)
    a = solve_bnb(p, V, 8, node_limit=300, time_limit=60.0)
    b = solve_bnb(p, V, 8, node_limit=300, time_limit=60.0)
    assert not a.proved and a.info["nodes"] == 300 and a.info["stopped_by"] == "nodes"
    assert (a.value, a.lower_bound, a.best_set.tolist()) == (b.value, b.lower_bound, b.best_set.tolist())
    with pytest.raises(ValueError, match="node_limit"):
        solve_bnb(p, V, 8, node_limit=0)


@pytest.mark.parametrize("seed", range(12))
def test_pool_restricted_bnb_equals_enumeration(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 90))
    p, V = _pv(seed, n, int(rng.integers(1, 6)), float(rng.choice([0.5, 1.5, 3.0])))
    s = int(rng.integers(2, 8))
    pool = candidate_pool(p, V, s, pool_mass=int(rng.integers(2, 10)), pool_error=int(rng.integers(0, 8)))
    e_enum, _ = enumerate_best(p, V, pool, s)
    proved, e_bnb, best = bnb_in_pool(p, V, pool, s, node_limit=10**7)
    assert proved and np.isin(best, pool).all() and best.size == s
    # the value is the full row's E of a pool subset (mu of the full row): recomputed by the operator
    assert e_bnb == op.forced_error(p, V, best)
    # equal optima (bnb proves within rel_tol 1e-9)
    assert e_bnb == pytest.approx(e_enum, rel=1e-9, abs=1e-300)


def test_pool_optimum_keeps_the_configured_pool_at_s32():
    p, V = _pv(4, 160, 4, 2.0)
    s = 32
    full = candidate_pool(p, V, s)
    assert math.comb(full.size, s) > 4_000_000
    pool, value, best, extra = pool_optimum(p, V, s, node_limit=2_000_000)
    assert pool.size == full.size and extra is None and value == op.forced_error(p, V, best)
    shrunk, v_shrunk, _, _ = pool_optimum(p, V, s, node_limit=0)
    assert shrunk.size < full.size and value <= v_shrunk * (1 + 1e-9)
    # out of nodes: the shrunk pool's exact optimum, and the bnb's better set as a candidate
    pool2, v2, _, cand = pool_optimum(p, V, s, node_limit=1000)
    assert pool2.size == shrunk.size and v2 == v_shrunk
    assert cand is None or op.forced_error(p, V, cand) < v_shrunk


def test_pool_optimum_enumerates_only_when_the_pool_bnb_is_not_proved(monkeypatch):
    import forcedweight.certify.pool as pool_mod

    p, V = _pv(7, 120, 64, 1.0)
    s = 32
    calls = []
    real = pool_mod.best_in_pool
    monkeypatch.setattr(pool_mod, "best_in_pool", lambda *a: calls.append(a) or real(*a))
    pool, value, best, extra = pool_optimum(p, V, s, node_limit=2_000_000)
    assert pool.size == candidate_pool(p, V, s).size and extra is None and not calls
    assert value == op.forced_error(p, V, best)
    pool_optimum(p, V, s, node_limit=1)  # out of nodes at once: the shrunk pool is enumerated
    assert len(calls) == 1


def test_proof_gap():
    assert proof_gap(2.0, 2.0) == 0.0 and proof_gap(2.0, 0.0) == 1.0 and proof_gap(2.0, 0.5) == 0.75
    assert proof_gap(0.0, 0.0) == 0.0


def _rows_file(tmp_path, seeds, n=120):
    """A rows Parquet file of random rows (``_pv(seed, n, 3, 1.0)``, value dim 3), one per seed."""
    recs = []
    for seed in seeds:
        p, V = _pv(seed, n, 3, 1.0)
        recs.append(dict(weights=p, values=V.ravel(), value_dim=3))
    src = tmp_path / "r.parquet"
    pq.write_table(rows.make_row_table(recs), src)
    return src


def test_two_node_limited_runs_give_identical_outputs(tmp_path):
    src = _rows_file(tmp_path, range(100, 104))
    opts = CertifyOptions(pool_mass=2, pool_error=1, solver="bnb", node_limit=200, time_limit=600.0)
    outs = []
    for k in range(2):
        out = certify_file(src, tmp_path / f"o{k}.parquet", [6], opts, progress=False, chunk_rows=2 + k)
        outs.append(pl.read_parquet(out).drop("seconds"))
    assert outs[0].equals(outs[1])
    st_ = outs[0]["status"].to_list()
    assert "unsolved" in st_ or "improved" in st_  # the node limit did stop searches
    open_ = outs[0].filter(pl.col("proved").not_())
    assert ((open_["bound_gap"] - (open_["es_best"] - open_["lower_bound"]) / open_["es_best"]).abs() < 1e-12).all()


def test_warm_up_runs_once_per_process():
    warm_up()
    assert warm_up() is False
    assert warm_up(force=True) is True


def test_cli_node_limit(tmp_path):
    from typer.testing import CliRunner

    from forcedweight.cli import app

    p, V = _pv(7, 60, 3, 1.0)
    src = tmp_path / "r.parquet"
    pq.write_table(rows.make_row_table([dict(weights=p, values=V.ravel(), value_dim=3)]), src)
    bad = CliRunner().invoke(app, ["certify", str(src), "--s", "4", "--out", str(tmp_path / "x.parquet"),
                                   "--node-limit", "0", "--no-progress"])
    assert bad.exit_code == 2 and "--node-limit" in bad.output and not (tmp_path / "x.parquet").exists()
    outs = []
    for k in range(2):
        out = tmp_path / f"c{k}.parquet"
        ok = CliRunner().invoke(app, ["certify", str(src), "--s", "4", "--out", str(out), "--pool-mass", "1",
                                      "--pool-error", "0", "--solver", "bnb", "--node-limit", "5",
                                      "--time-limit", "600", "--no-progress"])
        assert ok.exit_code == 0, ok.output
        outs.append(pl.read_parquet(out).drop("seconds"))
    assert outs[0].equals(outs[1]) and outs[0]["status"][0] in ("unsolved", "improved")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(5, 13), d=st.integers(1, 8),
       peak=st.sampled_from([0.3, 1.0, 2.5]), nodes=st.integers(1, 40), data=st.data())
def test_split_first_level_bounds_stay_below_brute_force(seed, n, d, peak, nodes, data):
    """Splitting the open first-level nodes into {k, j} children: every bound stays <= the
    brute-force optimum, is never below the unsplit bound, and the search itself is unchanged."""
    p, V = _pv(seed, n, d, peak)
    s = data.draw(st.integers(2, n - 1))
    opt, _ = brute_force_best(p, V, s)
    split = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0, refine_work=1e9)
    plain = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0, refine_work=0)
    assert 0.0 <= split.lower_bound <= _ceil(opt, p, V, s)  # a proof (up to float64 rounding)
    assert split.lower_bound >= plain.lower_bound
    assert split.value == plain.value and split.info["nodes"] == plain.info["nodes"]
    rb = root_bound(p, V, s, refine_work=1e9)
    assert rb >= root_bound(p, V, s, refine_work=0) and rb <= _ceil(opt, p, V, s)


def test_long_rows_bound_without_the_relaxation_and_stay_proofs(monkeypatch):
    """The bound of a stopped search (its first-level pass, its path nodes and the refinement) gets
    ``bnb.bound_relax_iters(N, relax_iters)`` relaxation steps: ``relax_iters`` below ``LONG_ROWS`` keys, 0 from
    there on (LONG_ROWS forced down to 10 here, so small rows take the long-row path); either way its bounds stay
    <= the brute-force optimum."""
    import forcedweight.certify.solvers.bnb as bnb
    import forcedweight.certify.solvers.frontier as fr
    from forcedweight.certify.solvers import node_tests as nt
    from forcedweight.certify.solvers.bounds import RELAX_ITERS

    assert bnb.bound_relax_iters(nt.LONG_ROWS - 1, 150) == 150 and bnb.bound_relax_iters(nt.LONG_ROWS, 150) == 0
    seen = []

    def spy(name, at):
        real = getattr(fr, name)

        def call(*args, **kwargs):
            seen.append((name, args[at]))  # its relax_iters
            return real(*args, **kwargs)

        monkeypatch.setattr(fr, name, call)

    spy("_refine", 18)
    spy("_first_level_vals", 13)
    spy("_open_frontier", 18)
    for long_from, expect in ((nt.LONG_ROWS, RELAX_ITERS), (10, 0)):
        monkeypatch.setattr(nt, "LONG_ROWS", long_from)  # the refinement's rule and the search's steps
        stopped = 0
        for seed in range(8):
            p, V = _pv(seed, 13, 3, 1.0)
            s = 3 + seed % 3
            opt, _ = brute_force_best(p, V, s)
            seen.clear()
            res = solve_bnb(p, V, s, node_limit=4, time_limit=60.0)
            assert 0.0 <= res.lower_bound <= _ceil(opt, p, V, s)
            assert 0.0 <= root_bound(p, V, s) <= _ceil(opt, p, V, s)
            if not res.proved:
                stopped += 1
                assert {name for name, _ in seen} == {"_refine", "_first_level_vals", "_open_frontier"}
                assert {relax for _, relax in seen} == {expect}
        assert stopped >= 4  # the bound ran (searches stopped by the node limit)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(4, 12), d=st.integers(1, 8),
       peak=st.sampled_from([0.3, 1.0, 2.5]), relax=st.sampled_from([0, 150]),
       budget=st.sampled_from([1e3, 1e5, 1e12]), data=st.data())
def test_refined_node_bound_is_below_the_brute_force_node_minimum(seed, n, d, peak, relax, budget, data):
    """frontier._refine from one node (fixed keys T, the rest from keys >= k, in the search's mass
    order) against brute force over that node's sets: never above its minimum; with an unbounded
    budget the refinement reaches the leaves and equals it (relative 1e-9 and the leaves' rounding margin)."""
    import itertools

    from forcedweight.certify.solvers import frontier

    p, V = _pv(seed, n, d, peak)
    s = data.draw(st.integers(1, n - 1))
    t = data.draw(st.integers(0, s - 1))
    k = data.draw(st.integers(t, n - (s - t)))
    A0 = op.centred_contributions(p, V)
    A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A0, p, s)[:10]
    T = list(range(t))
    exact = np.inf
    margin = 0.0  # the leaves' rounding margin (frontier._leaf_lower): 4 (d + s + 4) eps sum_S ||a|| / w_S, at most
    for rest in itertools.combinations(range(k, n), s - t):
        S = T + list(rest)
        w = pw[S].sum()
        if w > 0:
            exact = min(exact, np.linalg.norm(A[S].sum(axis=0)) / w)
            margin = max(margin, 4.0 * (d + s + 4) * np.finfo(float).eps * nrm[S].sum() / w)
    top = 2.0 * exact if np.isfinite(exact) and exact > 0 else 1.0
    keys, tt, kn, val, state = frontier._frontier(n, s)
    keys[0, :t] = T
    tt[0], kn[0], val[0], state[0] = t, k, 0.0, 0
    lb = frontier._refine(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, 1, top, gamma, 30,
                          relax, budget, np.zeros(len(frontier.REFINE_STATS), np.int64))
    assert 0.0 <= lb <= exact * (1 + 1e-12) + 1e-300  # a proof (float64, relative 1e-12)
    if budget == 1e12 and np.isfinite(exact):
        # converged to the leaves: relative 1e-9, less the leaves' margin (absolute, so it shows on rows whose
        # best sets cancel to E ~ 1e-6 of their keys' norms)
        assert lb >= exact * (1 - 1e-9) - margin


def test_a_full_frontier_grows_up_to_its_byte_ceiling_and_the_bound_stays_a_proof():
    """frontier._refine from the root with an unbounded budget, starting from a store of 2 nodes instead of
    ``_frontier``'s: it doubles the store when full, so where ``frontier_bytes(N) // node_bytes(s)`` nodes
    suffice it reaches the same bound as from the full store (bit for bit; no ``frontier_full``); where they do
    not, it stops at that ceiling (``frontier_full``) with a bound still <= the brute-force optimum. Both happen
    among these rows. ``solver_memory`` counts the ceiling (1.5 times: a doubling holds old and new)."""
    from forcedweight.certify.options import solver_memory
    from forcedweight.certify.solvers import frontier

    outcomes = set()
    for n, s in ((10, 3), (12, 4), (12, 6), (14, 5)):
        for seed in range(4):
            p, V = _pv(seed, n, 3, 1.0)
            A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(op.centred_contributions(p, V), p, s)[:10]
            exact, _ = brute_force_best(p, V, s)
            runs = []
            for size in (None, 2):
                arrays = frontier._frontier(n, s)
                if size is not None:
                    arrays = tuple(a[:size].copy() for a in arrays)
                keys, tt, kn, val, state = arrays
                tt[0], kn[0], val[0], state[0] = 0, 0, 0.0, 0  # the root: every set
                stats = np.zeros(len(frontier.REFINE_STATS), np.int64)
                lb = frontier._refine(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, 1,
                                      2.0 * exact, gamma, 30, 0, 1e12, stats)
                runs.append((lb, int(stats[5]), int(stats[1])))
            (lb_full, full_full, _), (lb_small, small_full, splits) = runs
            assert splits >= 1  # the root was split: n + 1 slots, so the 2-node store grew
            assert full_full == 0 and lb_full >= exact * (1 - 1e-9)  # converged (relative 1e-9: float64 bounds)
            assert 0.0 <= lb_small <= exact * (1 + 1e-12)  # a proof either way (relative 1e-12)
            if small_full == 0:
                assert lb_small == lb_full  # refined as far as from the full store
            outcomes.add(small_full)
    assert outcomes == {0, 1}
    assert frontier.frontier_bytes(10) == frontier.FRONTIER_GRAM_SHARE * 8 * 100 and frontier.node_bytes(5) == 52
    big = 100_000
    assert frontier.frontier_bytes(big) == frontier.FRONTIER_MAX_BYTES
    assert solver_memory("bnb", big, 64) == 8 * big * 64 * 8 + 8 * big * big + 3 * frontier.FRONTIER_MAX_BYTES // 2


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(6, 12), d=st.integers(1, 6),
       peak=st.sampled_from([0.3, 1.0, 2.5]), other=st.sampled_from([0.0, 0.25, 1.0]), data=st.data())
def test_a_peeled_node_of_bound_zero_is_partitioned_into_its_children_and_one_rest(seed, n, d, peak, other, data):
    """One step of frontier._refine on a node of bound 0 whose full bound is taken (state 1): it is peeled into
    the children T + {j}, k <= j < cut, and the rest (T, keys >= cut), bounded at the smallest bound above 0
    in the frontier (another node here, at ``other`` times its own minimum; none when 0: then the rest is
    refuted at the cap and dropped). Every set of the node with E below the cap lies in exactly one live node
    it came from, every live node's bound is <= its sets' brute-force minimum, and a rest left live has the
    bound above 0 it was tested at."""
    import itertools

    from forcedweight.certify.solvers import frontier

    p, V = _pv(seed, n, d, peak)
    s = data.draw(st.integers(2, min(5, n - 2)))
    t = data.draw(st.integers(0, s - 2))  # t + 1 < s: a split into nodes, not leaves
    k = data.draw(st.integers(t, n - (s - t) - 1))  # at least two children
    A0 = op.centred_contributions(p, V)
    A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A0, p, s)[:10]
    T = list(range(t))

    def E(S):
        S = list(S)
        return np.linalg.norm(A[S].sum(axis=0)) / pw[S].sum()

    def sets_of(keys_fixed, kn):
        r = s - len(keys_fixed)
        return [tuple(keys_fixed) + rest for rest in itertools.combinations(range(kn, n), r)]

    mine = sets_of(T, k)
    exact = min(E(S) for S in mine)
    top = 2.0 * exact if exact > 0 else 1.0
    keys, tt, kn, val, state = frontier._frontier(n, s)
    state[:] = -1  # (unused slots read as split nodes, so the live ones are the state >= 0)
    keys[0, :t] = T
    tt[0], kn[0], val[0], state[0] = t, k, 0.0, 1
    m = 1
    # another node (the last s keys' one set), bounded at a share of its value: the smallest bound above 0
    last_set = tuple(range(n - s, n))
    v_other = other * E(last_set)
    if v_other > 0.0 and v_other < top:
        tt[1], kn[1], val[1], state[1] = 0, n - s, v_other, 1
        m = 2
    stats = np.zeros(len(frontier.REFINE_STATS), np.int64)
    frontier._refine(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, m, top, gamma, 30, 0,
                     1.0, stats)  # a budget of 1 key-step: this one step
    assert stats[9] == 1 and stats[1] == 1  # the node was peeled
    live = [j for j in range(keys.shape[0]) if state[j] >= 0 and not (m == 2 and j == 1)]
    members = {j: set(sets_of(list(keys[j, :tt[j]]), kn[j])) for j in live}
    for S in mine:
        holders = [j for j in live if S in members[j]]
        if E(S) < top * (1 - 1e-9):
            assert len(holders) == 1, (S, holders)
        else:
            assert len(holders) <= 1
    assert all(set(members[j]) <= set(mine) for j in live)
    for j in live:
        assert val[j] <= min(E(S) for S in members[j]) * (1 + 1e-12) + 1e-300
        if tt[j] == t:  # the rest (kept only below the cap: with another node's bound above 0)
            assert m == 2 and val[j] == v_other > 0.0


def test_a_child_left_at_zero_is_final_and_caps_none_of_its_siblings(monkeypatch):
    """In a peel, a child whose tests prove nothing at a cap above 0 keeps its bound 0 as a full bound (state 1:
    a full bound at the incumbent would run the same ladder again; without relaxation steps) and does not lower
    the cap of the children after it: they are tested at the smallest bound above 0 among their siblings, as the
    first-level pass does (before, a child at 0 set every later sibling's cap, and so its bound, to 0). The
    children's bounds come from a scripted ``_node_value`` (the refinement's pure-Python form reads it from the
    module), the peel's bisection from the real tests."""
    from forcedweight.certify.solvers import frontier as fr

    p, V = _pv(11, 14, 2, 1.0)
    s, t = 4, 1
    A0 = op.centred_contributions(p, V)
    A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A0, p, s)[:10]
    top = 1.0
    caps = []

    def scripted(*args):
        caps.append(args[16])  # the cap (``top`` of _node_value)
        return 0.0 if len(caps) == 1 else 0.5 * args[16]  # the first child proves nothing, the others half their cap

    for relax_iters, final in ((0, 1), (5, 0)):  # (with relaxation steps the full bound would add them: not final)
        caps.clear()
        keys, tt, kn, val, state = fr._frontier(14, s)
        state[:] = -1
        keys[0, :t] = [0]
        tt[0], kn[0], val[0], state[0] = t, 1, 0.0, 1
        stats = np.zeros(len(fr.REFINE_STATS), np.int64)
        with monkeypatch.context() as mp:
            mp.setattr(fr, "_node_value", scripted)
            mp.setattr(fr, "relax_bound", lambda *a: 0.0)
            fr._refine.py_func(A, pw, wtop, nrm, G, lo, hi, use_box, s, keys, tt, kn, val, state, 1, top, gamma, 30,
                               relax_iters, 1.0, stats)
        assert stats[9] == 1 and len(caps) >= 3  # peeled, into at least three children
        assert caps[:3] == [top, top, 0.5 * top]  # the zero child capped nobody; then the running minimum
        assert all(c > 0.0 for c in caps)
        children = [j for j in range(1, keys.shape[0]) if state[j] >= 0 and tt[j] == t + 1]
        first = max(children, key=lambda j: kn[j])  # made first: the largest key
        assert val[first] == 0.0 and state[first] == final
        assert all(val[j] > 0.0 and state[j] == 0 for j in children if j != first)


def test_refinement_stops_early_only_when_its_bound_would_stay_zero(monkeypatch):
    """_refine stops once the budget left cannot process every frontier node of bound 0
    (``frontier._least_work``); the bound is then the one of the whole budget. Checked against the
    refinement without that stop (its pure-Python form, ``_least_work`` -> 0) on rows where it fires
    and where it does not: equal bounds, never more key-steps."""
    from forcedweight.certify.solvers import bnb, frontier as fr

    compiled_refine = fr._refine
    fired = positive = 0
    for seed in range(8):
        p, V = _pv(seed, 60, 2, [0.3, 1.0, 2.0, 3.0][seed % 4])
        s = 4
        A0 = op.centred_contributions(p, V)
        A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(A0, p, s)[:10]
        top = bnb._set_error(A0, p, op.top_mass_set(p, s))
        for budget in (3e4, 3e5):
            args = (A, pw, wtop, nrm, G, lo, hi, use_box, s, 0, top, gamma, 30, 0, budget)
            stop = np.zeros(len(fr.REFINE_STATS), np.int64)
            v = fr.first_level_bound(*args, stop)
            with monkeypatch.context() as mp:
                mp.setattr(fr, "_refine", compiled_refine.py_func)
                mp.setattr(fr, "_least_work", lambda *a: 0.0)
                full = np.zeros(len(fr.REFINE_STATS), np.int64)
                v_full = fr.first_level_bound.py_func(*args, full)
            assert v == v_full and full[7] == 0
            assert stop[4] <= full[4]  # key-steps spent
            fired += int(stop[7])
            positive += int(v > 0)
            if stop[7]:
                assert v == 0.0 and stop[4] < full[4]
    assert fired >= 4 and positive >= 1  # both cases were met


def test_refine_work_option_reaches_the_solver_and_only_raises_bounds(tmp_path):
    import inspect

    from forcedweight.certify.solvers.frontier import REFINE_WORK
    from forcedweight.cli.certify import certify as certify_cli

    src = _rows_file(tmp_path, range(200, 203))
    outs = {}
    for work in (0.0, REFINE_WORK):
        opts = CertifyOptions(pool_mass=2, pool_error=1, solver="bnb", node_limit=200, time_limit=600.0, refine_work=work)
        outs[work] = pl.read_parquet(certify_file(src, tmp_path / f"o{work:g}.parquet", [6], opts, progress=False))
    a, b = outs[0.0], outs[REFINE_WORK]
    assert a["es_best"].to_list() == b["es_best"].to_list()  # the search itself is the same
    assert (b["lower_bound"] >= a["lower_bound"] - 1e-12).all()  # refinement only raises the bound
    assert (b["lower_bound"] <= b["es_best"] * (1 + 1e-9)).all()  # and it stays a lower bound
    assert inspect.signature(certify_cli).parameters["refine_work"].default.default == REFINE_WORK
    with pytest.raises(InputError, match="--refine-work"):
        CertifyOptions(refine_work=-1.0)


def test_bound_deadline_cuts_only_the_optional_work():
    """At once past its deadline (``bound_time=0``), a stopped search's bound skips the LPs and the
    refinement but keeps the first-level pass: still a proof (<= brute force), still > 0 wherever
    the root bound of the pass alone (no refinement) is; with a node limit and no ``bound_time``
    there is no deadline."""
    positive = cut_short = 0
    for seed in range(30):
        p, V = _pv(seed, 16, 3, 1.5)
        s = 3 + seed % 4
        opt, _ = brute_force_best(p, V, s)
        rb = root_bound(p, V, s, refine_work=0)
        for nodes in (1, 7):
            cut = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0, bound_time=0.0)
            free = solve_bnb(p, V, s, node_limit=nodes, time_limit=60.0)
            if cut.proved:
                continue
            cut_short += cut.info["refine"]["deadline"]  # (0 when nothing was left to refine)
            assert free.info["refine"]["deadline"] == 0
            assert cut.info["refine"]["splits"] == cut.info["refine"]["full_bounds"] == 0
            assert 0.0 <= cut.lower_bound <= _ceil(opt, p, V, s)
            assert (cut.value, cut.best_set.tolist()) == (free.value, free.best_set.tolist())  # the search is the same
            if rb > 0:
                assert cut.lower_bound > 0.0
                positive += 1
    assert positive >= 5 and cut_short >= 5  # the properties were exercised


def test_time_limited_search_gets_a_bound_deadline(monkeypatch):
    """Stopped by its time limit, the search's bound runs to a deadline a fifth of the limit later
    (``bnb.BOUND_SHARE``; the floor ``bnb.BOUND_MIN`` set to 0 here): 0.2 us at a 1 us limit, far less than the
    first-level pass over 1,000 keys takes on any machine (about 4 ms here), so the refinement never starts; the
    bound is still a proof (<= the value)."""
    from forcedweight.certify.solvers import bnb

    monkeypatch.setattr(bnb, "BOUND_MIN", 0.0)
    p, V = _pv(3, 1000, 8, 0.3)
    res = solve_bnb(p, V, 8, time_limit=1e-6)
    assert not res.proved and res.info["stopped_by"] == "time"
    assert res.info["refine"]["deadline"] == 1 and res.info["refine"]["splits"] == 0
    assert 0.0 <= res.lower_bound <= res.value


def test_bound_deadline_has_a_floor():
    """The default bound time is a fifth of the limit but at least ``bnb.BOUND_MIN`` (short limits keep
    the seconds a short row's refinement needs), none with a node limit, and as given otherwise."""
    from forcedweight.certify.solvers.bnb import BOUND_MIN, BOUND_SHARE

    p, V = _pv(3, 1000, 8, 0.3)
    assert solve_bnb(p, V, 8, time_limit=0.005).info["bound_time"] == BOUND_MIN
    assert solve_bnb(p, V, 8, time_limit=0.005, bound_time=0.0).info["bound_time"] == 0.0
    assert solve_bnb(p, V, 8, node_limit=5, time_limit=60.0).info["bound_time"] == math.inf
    assert BOUND_SHARE * 10.0 == BOUND_MIN  # at the default 10 s limit the floor changes nothing


def _first_level_node_values(p, V, s, top, incumbent):
    """``node_tests._node_value`` of every first-level node ``{k}`` (keys in the search's order, capped at
    ``top``) with rescue tests at shares of ``incumbent`` (0 = none), beside each node's brute-force minimum."""
    from itertools import combinations

    from forcedweight.certify.solvers.node_tests import RESCUE_STEPS, _node_value, node_scratch

    A, pw, nrm, G, lo, hi, use_box, _, gamma, wtop = prepare(op.centred_contributions(p, V), p, s)[:10]
    N, d = A.shape
    combs = np.array(list(combinations(range(N), s)))
    E = np.linalg.norm(A[combs].sum(1), axis=1) / pw[combs].sum(1)
    kt, buf, bidx, h, zs, zc, keys, dirn, gc, gk = node_scratch(nrm, pw, wtop, s, RESCUE_STEPS)
    out = []
    for k in range(N - s + 1):
        ys = np.zeros((2, d))
        ys[1] = A[k]
        ws, bs = np.array([0.0, pw[k]]), np.array([0.0, nrm[k]])
        cs = np.zeros((2, N))
        cs[1, k + 1:] = G[k, k + 1:]
        v = _node_value(1, keys, k + 1, N, s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, top, gamma, kt, wtop,
                        buf, bidx, h, zs, zc, dirn, 12, gc, gk, incumbent)
        out.append((v, float(E[combs[:, 0] == k].min())))
    return out


def test_rescue_tests_bound_nodes_the_bisection_leaves_at_zero_and_stay_proofs():
    """A first-level node whose 8-step bisection proves nothing gets rescue tests (RESCUE_STEPS steps at
    shares of the incumbent): on these spread low-dimensional rows they bound some such nodes > 0, never above
    the node's brute-force minimum (relative 1e-12) and never below the bound without them."""
    zero = rescued = 0
    for seed in range(12):
        p, V = _pv(seed, 60, 3, 1.5)
        s = 3
        opt, _ = brute_force_best(p, V, s)
        plain = _first_level_node_values(p, V, s, opt, 0.0)
        with_rescue = _first_level_node_values(p, V, s, opt, opt)
        for (v0, m), (v, m2) in zip(plain, with_rescue):
            assert m == m2 and v0 <= m * (1 + 1e-12) and v <= m * (1 + 1e-12)
            assert v >= v0
            zero += v0 == 0.0
            rescued += v0 == 0.0 and v > 0.0
    assert zero >= 20 and rescued >= 5  # the rescue ran and proved where the bisection did not


def test_long_rows_bound_without_linear_programs(monkeypatch):
    """On rows of LONG_ROWS keys or more (forced down here) the bound of a stopped search calls no LP (node or
    tail); below it, the same stopped searches call some; the bounds stay proofs either way."""
    import forcedweight.certify.solvers.frontier as fr

    calls = []
    real_node, real_tail = fr.node_bound, fr.choose_tail
    monkeypatch.setattr(fr, "node_bound", lambda *a: calls.append("node") or real_node(*a))
    monkeypatch.setattr(fr, "choose_tail", lambda *a: calls.append("tail") or real_tail(*a))
    counts = {}
    default = fr.LONG_ROWS
    for long_from in (default, 10):
        monkeypatch.setattr(fr, "LONG_ROWS", long_from)
        calls.clear()
        for seed in range(10):
            p, V = _pv(seed, 60, 3, 1.5)
            opt, _ = brute_force_best(p, V, 3)
            res = solve_bnb(p, V, 3, node_limit=3, time_limit=60.0)
            assert not res.proved and 0.0 <= res.lower_bound <= _ceil(opt, p, V, 3)
        counts[long_from] = len(calls)
    assert counts[10] == 0 and counts[default] > 0
