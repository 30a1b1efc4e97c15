"""Certification (SPEC §5) and the ``certify`` pipeline: brute force, bad input, resume, workers, Dask."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from forcedweight import errors
from forcedweight.core import operator as op
from forcedweight import rows
from forcedweight.certify import CertifyOptions, certify_file, certify_row
from forcedweight.certify.enumerate import brute_force_best
from forcedweight.certify.run import KILL_HOOK, parts_dir_for

REPO = Path(__file__).resolve().parents[2]
SMALL_POOL = CertifyOptions(pool_mass=1, pool_error=1, time_limit=20.0)  # forces the solver on N > s + 2


def _pv(seed, n, d, peak=2.0):
    rng = np.random.default_rng(seed)
    p = np.exp(peak * rng.normal(size=n))
    p /= p.sum()
    return p, rng.normal(size=(n, d))


def _rec(seed, n, d=3, keys=True, **extra):
    p, V = _pv(seed, n, d)
    rng = np.random.default_rng(seed + 1000)
    r = dict(weights=p, values=V.ravel(), value_dim=d, **extra)
    if keys:
        r["keys"] = rng.normal(size=n * 4)
        r["query"] = rng.normal(size=4)
    return r


def _write(path, recs, row_group_size=None):
    pq.write_table(rows.make_row_table(recs), path, row_group_size=row_group_size)
    return path


def _check_record(rec, p, V, s):
    """Invariants every certified record must satisfy, recomputed from scratch."""
    best = np.asarray(rec["best_set"])
    assert best.shape == (s,) and np.all(np.diff(best) > 0)
    # recomputing E on best_set gives es_best (same float64 operator: relative 1e-12)
    assert op.forced_error(p, V, best) == pytest.approx(rec["es_best"], rel=1e-12, abs=1e-300)
    top = op.top_mass_set(p, s)
    assert rec["es_top"] == pytest.approx(op.forced_error(p, V, top), rel=1e-12, abs=1e-300)
    heur = [rec[k] for k in ("es_top", "es_balance", "es_pool", "es_geometric", "es_leverage",
                             "es_random", "es_streaming", "es_knorm", "es_quest") if rec[k] is not None]
    assert rec["es_best"] <= min(heur)
    assert rec["es_balance"] <= rec["es_top"]
    assert rec["lower_bound"] <= rec["es_best"]
    if rec["es_top"] > 0:
        assert rec["closable_share"] == pytest.approx((rec["es_top"] - rec["es_best"]) / rec["es_top"], rel=1e-12)
    assert rec["dropped_mass"] == pytest.approx(1 - p[top].sum(), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000), n=st.integers(3, 11), d=st.integers(1, 3), data=st.data())
def test_es_best_equals_brute_force(seed, n, d, data):
    s = data.draw(st.integers(1, n))
    p, V = _pv(seed, n, d, peak=data.draw(st.sampled_from([0.3, 2.0])))
    row = rows.Row(seed, p, V, {})
    rec = certify_row(row, s, SMALL_POOL)
    _check_record(rec, p, V, s)
    ref, _ = brute_force_best(p, V, s)
    if rec["proved"]:
        assert rec["status"] == "optimal"
        # solver tolerance (bnb/mitm document theirs) is far below 1e-9 relative on these rows
        assert rec["es_best"] == pytest.approx(ref, rel=1e-9, abs=1e-12)
    else:
        assert rec["status"] in ("unsolved", "improved")
        assert rec["es_best"] >= ref * (1 - 1e-12)
    if rec["status"] == "improved" or rec["solver_improved"]:
        known = min(rec["es_pool"], rec["es_balance"])
        assert rec["es_best"] < known
    if rec["status"] == "improved":
        assert rec["solver_improved"] and not rec["proved"]


def test_exhaustive_pool_and_solver_none():
    p, V = _pv(11, 12, 2)
    row = rows.Row(0, p, V, {})
    rec = certify_row(row, 4, CertifyOptions(solver="none"))  # pool = top 16 by mass = all 12 keys
    assert rec["status"] == "optimal" and rec["proved"] and rec["solver"] == "enumerate"
    assert rec["es_best"] == pytest.approx(brute_force_best(p, V, 4)[0], rel=1e-12)
    rec = certify_row(row, 4, CertifyOptions(solver="none", pool_mass=1, pool_error=1))
    assert rec["status"] == "unsolved" and not rec["proved"] and rec["lower_bound"] == 0.0
    assert rec["es_best"] >= brute_force_best(p, V, 4)[0] * (1 - 1e-12)


@pytest.mark.parametrize("solver", ["bnb", "scip"])
def test_named_solvers_prove_small_rows(solver):
    p, V = _pv(21, 16, 3, peak=1.0)
    rec = certify_row(rows.Row(3, p, V, {}), 5, CertifyOptions(pool_mass=1, pool_error=1, solver=solver))
    _check_record(rec, p, V, 5)
    assert rec["proved"] and rec["solver"] == solver
    assert rec["es_best"] == pytest.approx(brute_force_best(p, V, 5)[0], rel=1e-9)


def test_partition_instances_certified_by_auto_and_cpsat():
    # ZEROES from balanced partition (SPEC §6): 1/m masses, integer 1-D values, s = m/2
    yes = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], dtype=float)  # sum 52: a 6/6 split of 26 exists
    assert sum([9, 8, 3, 1, 1, 4]) == 26
    no = np.array([2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 23], dtype=float)  # odd total: no equal split
    m = 12
    p = np.full(m, 1 / m)
    for a, zero in ((yes, True), (no, False)):
        V = a[:, None]
        for solver in ("auto", "cpsat"):
            rec = certify_row(rows.Row(0, p, V, {}), m // 2, CertifyOptions(pool_mass=0, pool_error=0, solver=solver))
            assert rec["proved"], solver
            assert rec["solver"] in (("mitm", "zero") if solver == "auto" else ("cpsat", "zero"))
            assert (rec["es_best"] < 1e-12) == zero
            # integer values up to 23, s = 6: E is a multiple of 1/36 or round-off (abs 1e-12)
            assert rec["es_best"] == pytest.approx(brute_force_best(p, V, m // 2)[0], abs=1e-12)
    # cpsat on a non-integral row falls back to scip and says so
    pr, Vr = _pv(5, 14, 2)
    rec = certify_row(rows.Row(0, pr, Vr, {}), 3, CertifyOptions(pool_mass=0, pool_error=0, solver="cpsat"))
    assert rec["solver"] == "scip" and "cpsat" in rec["reason"]


# ------------------------------------------------------------------------------------------
# the file pipeline


def _table(path):
    t = pq.read_table(path)
    return t.drop_columns(["seconds"]).to_pylist()


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                # other processes/threads may sum in another order: relative 1e-12
                assert (math.isnan(x[k]) and math.isnan(y[k])) or x[k] == pytest.approx(y[k], rel=1e-12, abs=1e-300), k
            else:
                assert x[k] == y[k], k


@pytest.fixture()
def rows_file(tmp_path):
    recs = [_rec(i, n, text_id=10 + i, tag=f"t{i}") for i, n in enumerate([12, 20, 9, 16, 24, 14])]
    return _write(tmp_path / "rows.parquet", recs, row_group_size=4)


OPTS = dict(options=CertifyOptions(pool_mass=2, pool_error=2, time_limit=20.0), progress=False, chunk_rows=2)


def test_certify_file_output_columns_and_values(rows_file, tmp_path):
    out = certify_file(rows_file, tmp_path / "res.parquet", [5, 3], **OPTS)
    t = pq.read_table(out)
    recs = t.to_pylist()
    assert [(r["row_id"], r["s"]) for r in recs] == [(i, s) for i in range(6) for s in (3, 5)]
    assert "weights" not in t.column_names and "values" not in t.column_names and "keys" not in t.column_names
    assert [r["tag"] for r in recs[::2]] == [f"t{i}" for i in range(6)]
    src = rows.read_table(rows_file).to_pylist()
    for r in recs:
        x = src[r["row_id"]]
        p = np.asarray(x["weights"]) / np.sum(x["weights"])
        V = np.asarray(x["values"]).reshape(len(p), 3)
        _check_record(r, p, V, r["s"])
        assert r["n_keys"] == len(p)
        assert r["es_quest"] is not None and r["status"] in ("optimal", "improved")
        if r["proved"]:
            assert r["es_best"] == pytest.approx(brute_force_best(p, V, r["s"])[0], rel=1e-9)
    assert not parts_dir_for(out).exists()


def _cli(*args):
    from forcedweight.cli import app

    return CliRunner().invoke(app, ["certify", *map(str, args), "--no-progress"])


def _bad(tmp_path, mutate):
    recs = [_rec(i, 10, keys=False) for i in range(3)]
    mutate(recs)
    return _write(tmp_path / "bad.parquet", recs)


BAD_ROWS = {
    "nan": (lambda r: r[1]["weights"].__setitem__(2, np.nan), "NaN"),
    "inf": (lambda r: r[1]["values"].__setitem__(0, np.inf), "inf"),
    "negative": (lambda r: r[1]["weights"].__setitem__(0, -0.1), "negative"),
    "zero": (lambda r: r[1].__setitem__("weights", np.zeros(10)), "zero"),
    "length": (lambda r: r[1].__setitem__("values", r[1]["values"][:-1]), "length"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_rows_fail_with_row_named_and_no_output(tmp_path, kind):
    mutate, word = BAD_ROWS[kind]
    src = _bad(tmp_path, mutate)
    out = tmp_path / "out.parquet"
    res = _cli(src, "--s", 3, "--out", out)
    assert res.exit_code != 0
    assert "row 1" in res.output and "bad.parquet" in res.output and word in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not out.exists() and not parts_dir_for(out).exists()


def test_bad_budgets_paths_and_files(tmp_path):
    src = _write(tmp_path / "ok.parquet", [_rec(i, 10, keys=False) for i in range(2)])
    out = tmp_path / "out.parquet"
    cases = [
        ((src, "--s", 11, "--out", out), ["row 0", "s=11", "N=10"]),
        ((src, "--s", 0, "--out", out), ["--s 0"]),
        ((tmp_path / "nope.parquet", "--s", 2, "--out", out), ["nope.parquet", "no such file"]),
    ]
    (tmp_path / "text.parquet").write_text("not parquet at all")
    cases.append(((tmp_path / "text.parquet", "--s", 2, "--out", out), ["text.parquet", "not a readable Parquet"]))
    pq.write_table(pa.table({"weights": [[0.5, 0.5]], "value_dim": [1]}), tmp_path / "cols.parquet")
    cases.append(((tmp_path / "cols.parquet", "--s", 1, "--out", out), ["cols.parquet", "values"]))
    cases.append(((src, "--s", 2, "--out", out, "--solver", "gurobi"), ["--solver"]))
    cases.append(((src, "--s", 2, "--out", out, "--max-subsets", 0), ["--max-subsets"]))
    cases.append(((src, "--s", 2, "--out", out, "--chunk-rows", 0), ["--chunk-rows"]))
    (tmp_path / "adir").mkdir()
    cases.append(((src, "--s", 2, "--out", tmp_path / "adir"), ["adir", "is a directory"]))
    (tmp_path / "afile").write_text("")  # an output under a path that is a file: no traceback
    cases.append(((src, "--s", 2, "--out", tmp_path / "afile" / "o.parquet"), ["afile", "cannot write output"]))
    for args, words in cases:
        res = _cli(*args)
        assert res.exit_code != 0, args
        for w in words:
            assert w in res.output, (w, res.output)
        assert len(res.output.strip().splitlines()) == 1, res.output
        assert not out.exists() and not parts_dir_for(out).exists()


def test_skip_invalid_records_bad_rows(tmp_path):
    recs = [_rec(i, 10, keys=False) for i in range(4)]
    recs[1]["weights"][3] = np.nan
    recs[3] = _rec(3, 4, keys=False)  # N = 4 < s = 6 for one of the budgets
    src = _write(tmp_path / "mixed.parquet", recs)
    out = tmp_path / "out.parquet"
    res = _cli(src, "--s", 3, "--s", 6, "--out", out, "--skip-invalid", "--pool-mass", 2, "--pool-error", 2)
    assert res.exit_code == 0, res.output
    t = {(r["row_id"], r["s"]): r for r in pq.read_table(out).to_pylist()}
    assert len(t) == 8
    assert t[(1, 3)]["status"] == t[(1, 6)]["status"] == "invalid" and "NaN" in t[(1, 3)]["reason"]
    assert t[(3, 6)]["status"] == "invalid" and "exceeds N=4" in t[(3, 6)]["reason"]
    assert t[(3, 3)]["status"] == "optimal"
    assert t[(1, 3)]["es_best"] is None and t[(1, 3)]["best_set"] is None
    for key in [(0, 3), (0, 6), (2, 3), (2, 6)]:
        assert t[key]["status"] in ("optimal", "improved") and t[key]["reason"] is None


def _run_sub(args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    code = "from forcedweight.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, "certify", *map(str, args), "--no-progress"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_resume_after_kill_equals_uninterrupted(rows_file, tmp_path):
    args = [rows_file, "--s", 4, "--pool-mass", 2, "--pool-error", 2, "--chunk-rows", 2]
    ref = certify_file(rows_file, tmp_path / "ref.parquet", [4], **OPTS)
    out = tmp_path / "out.parquet"
    killed = _run_sub(args + ["--out", out], {KILL_HOOK: "1"})
    assert killed.returncode == -9, killed.stderr
    parts = parts_dir_for(out)
    done = sorted(parts.glob("part-*.parquet"))
    assert len(done) == 1 and not out.exists()
    # mark the finished part: the rerun must reuse it rather than recompute it
    t = pq.read_table(done[0])
    pq.write_table(t.set_column(t.column_names.index("seconds"), "seconds", pa.array([-1.0] * t.num_rows)), done[0])
    again = _run_sub(args + ["--out", out])
    assert again.returncode == 0, again.stderr
    assert not parts.exists()
    got = pq.read_table(out).to_pylist()
    assert sum(r["seconds"] == -1.0 for r in got) == t.num_rows
    _same(_table(out), _table(ref))


def test_changed_options_restart_cleanly(rows_file, tmp_path):
    out = tmp_path / "out.parquet"
    killed = _run_sub([rows_file, "--s", 4, "--solver", "none", "--chunk-rows", 2, "--out", out], {KILL_HOOK: "1"})
    assert killed.returncode == -9
    res = _cli(rows_file, "--s", 4, "--solver", "none", "--seed", 5, "--chunk-rows", 2, "--out", out)
    assert res.exit_code == 0 and "starting over" in res.output
    ref = certify_file(rows_file, tmp_path / "ref.parquet", [4], options=CertifyOptions(solver="none", seed=5),
                       progress=False, chunk_rows=2)
    _same(_table(out), _table(ref))


def test_workers_and_dask_equal_a_local_run(rows_file, tmp_path):
    from distributed import LocalCluster

    ref = certify_file(rows_file, tmp_path / "one.parquet", [3, 5], **OPTS)
    two = certify_file(rows_file, tmp_path / "two.parquet", [3, 5], workers=2, **OPTS)
    _same(_table(two), _table(ref))
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
        dask_out = certify_file(rows_file, tmp_path / "dask.parquet", [3, 5],
                                scheduler=cluster.scheduler_address, **OPTS)
    _same(_table(dask_out), _table(ref))


def test_directory_input_and_row_ids(tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    _write(d / "rows-000.parquet", [_rec(i, 9, keys=False, row_id=100 + i) for i in range(2)])
    _write(d / "rows-001.parquet", [_rec(5, 11, keys=False, row_id=7)])
    out = certify_file(d, tmp_path / "res.parquet", [2], options=CertifyOptions(solver="none"), progress=False)
    got = pq.read_table(out).to_pylist()
    assert [r["row_id"] for r in got] == [7, 100, 101]
    assert [r["es_knorm"] for r in got] == [None] * 3  # no keys in these rows
    with pytest.raises(errors.InputError, match="inside the input directory"):
        certify_file(d, d / "res.parquet", [2], progress=False)


def test_a_bad_row_met_mid_run_stops_the_shard(tmp_path):
    from forcedweight.certify.run import certify_batch

    recs = [_rec(0, 8, keys=False), _rec(1, 8, keys=False)]
    recs[1]["weights"][0] = -1.0
    batch = rows.make_row_table(recs).to_batches()[0]
    with pytest.raises(errors.RowError, match="row 1 in src.parquet: weights contain a negative"):
        certify_batch(batch, 0, "src.parquet", [2], CertifyOptions(solver="none"), skip_invalid=False)
    t = certify_batch(batch, 0, "src.parquet", [2], CertifyOptions(solver="none"), skip_invalid=True)
    assert t.column("status").to_pylist() == ["optimal", "invalid"]  # N = 8 <= pool: exhaustive


def test_empty_input_gives_an_empty_table(tmp_path):
    src = tmp_path / "empty.parquet"
    pq.write_table(rows.make_row_table([_rec(0, 5, keys=False)]).slice(0, 0), src)
    out = certify_file(src, tmp_path / "res.parquet", [2], progress=False)
    t = pq.read_table(out)
    assert t.num_rows == 0 and "es_best" in t.column_names and "best_set" in t.column_names


def test_bad_keys_or_query_named_or_recorded(tmp_path):
    recs = [_rec(i, 10) for i in range(3)]
    recs[1]["keys"] = recs[1]["keys"][:-3]  # 37 numbers for N = 10
    recs[2]["query"] = recs[2]["query"][:3]  # key dim is 4
    src = _write(tmp_path / "k.parquet", recs)
    out = tmp_path / "out.parquet"
    res = _cli(src, "--s", 3, "--out", out)
    assert res.exit_code != 0 and "row 1" in res.output and "keys length 37" in res.output
    assert not out.exists()
    res = _cli(src, "--s", 3, "--out", out, "--skip-invalid", "--solver", "none")
    assert res.exit_code == 0, res.output
    got = {r["row_id"]: r for r in pq.read_table(out).to_pylist()}
    assert got[0]["status"] == "optimal" and got[0]["es_quest"] is not None  # N = 10 <= pool: exhaustive
    assert got[1]["status"] == "invalid" and "keys length 37" in got[1]["reason"]
    assert got[2]["status"] == "invalid" and "query length 3" in got[2]["reason"]


def test_a_proof_contradicted_by_a_better_known_set_is_discarded(monkeypatch):
    from forcedweight.certify import row as cert
    from forcedweight.certify.solvers.result import SolverResult

    p, V = _pv(31, 20, 3)
    worst = np.argsort(p)[:4]  # the 4 lightest keys: far worse than top-mass

    def lying_solver(name, p_, V_, s, incumbent, time_limit, node_limit=None, refine_work=None, bound_time=None):
        e = op.forced_error(p_, V_, worst)
        return SolverResult(e, np.sort(worst), e, True, "bnb", 0.0, 0.0), None

    monkeypatch.setattr(cert, "run_solver", lying_solver)
    rec = certify_row(rows.Row(0, p, V, {}), 4, CertifyOptions(pool_mass=1, pool_error=1))
    assert rec["status"] == "unsolved" and not rec["proved"] and "proof discarded" in rec["reason"]
    assert rec["lower_bound"] == 0.0 and rec["es_best"] <= rec["es_top"]
    _check_record(rec, p, V, 4)


def test_a_set_within_the_rounding_of_zero_is_optimal_without_a_solver():
    # a kept pair {0.4, -0.4} of equal masses leaves the mean 0 of a symmetric row: E = 0 exactly, computed as
    # 3.1e-17 here (0 on some CPUs, noise on others); it is optimal, not "unsolved", with no solver at all
    p = np.full(9, 1 / 9)
    V = np.array([0.4, 0.1, 0.8, 0.6, -0.4, -0.1, -0.8, -0.6, 0.0])[:, None]
    rec = certify_row(rows.Row(0, p, V, {}), 2, CertifyOptions(solver="none", pool_mass=0, pool_error=0))
    assert rec["es_best"] <= op.forced_error_rounding(V, 2)
    assert rec["status"] == "optimal" and rec["proved"] and rec["solver"] == "zero" and rec["lower_bound"] == 0.0
    _check_record(rec, p, V, 2)


def test_sets_of_exact_zero_error_are_optimal_and_never_contradict_each_other():
    # two sets of exact E = 0 compute to 1.2e-17 (bnb's) and 6.8e-19 (balancing's): the proof was
    # discarded as contradicted (unsolved, bound_gap 1) although both are optimal; a value at or below E's
    # rounding is now optimal before any solver runs
    p = np.full(9, 1 / 9)
    V = np.array([0.2, 0.2, 0.2, 0.2, 0.2, -0.1, 0.1, 0.1, -0.2])[:, None]
    rec = certify_row(rows.Row(0, p, V, {}), 5, CertifyOptions(pool_mass=0, pool_error=0))
    assert rec["status"] == "optimal" and rec["proved"] and rec["reason"] is None and rec["bound_gap"] == 0.0
    assert rec["es_best"] <= op.forced_error_rounding(V, 5)
    # a set of E = 0 found by a search stopped at its node limit is optimal, not "improved"
    p = np.array([2, 1, 1, 2, 1, 2, 2, 1, 1, 2, 1]) / 16
    V = np.array([-0.1, 0.2, 0.0, -0.2, 0.1, 0.1, 0.1, -0.1, 0.0, -0.2, -0.2, 0.2, -0.1, 0.2, 0.2, -0.2, -0.1, -0.1,
                  -0.1, 0.2, 0.0, 0.2]).reshape(11, 2)
    rec = certify_row(rows.Row(0, p, V, {}), 5, CertifyOptions(pool_mass=0, pool_error=0, solver="bnb", node_limit=2))
    # (E = 0 exactly computes to 0 or to a few 1e-18, as the CPU's instructions round: NUMBA_CPU_NAME=generic gave
    # 6.9e-18, and the row was "unsolved" while only an exact 0 counted)
    assert rec["es_best"] <= op.forced_error_rounding(V, 5)
    assert rec["status"] == "optimal" and rec["proved"] and rec["lower_bound"] == 0.0
    _check_record(rec, p, V, 5)


# ------------------------------------------------------------------------------------------
# the main job (``forcedweight pipeline``): bad options are refused before the dump starts


@pytest.mark.parametrize("bad, word", [
    (dict(max_texts=0), "--max-texts"), (dict(max_texts=-1), "--max-texts"), (dict(s_values=(0,)), "--s"),
    (dict(solver="gurobi"), "--solver"), (dict(time_limit=0.0), "--time-limit"), (dict(workers=0), "--workers"),
])
def test_pipeline_refuses_bad_options_before_any_work(tmp_path, bad, word):
    from forcedweight.pipeline import PipelineOptions, run_pipeline

    # a model path that does not exist: reaching the dump would fail on --model instead
    with pytest.raises(errors.InputError, match=word):  # options are checked when they are made
        run_pipeline(tmp_path / "p", PipelineOptions(model=str(tmp_path / "no-model"), **bad), progress=False)
    assert not (tmp_path / "p").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(errors.InputError, match="--out"):
        run_pipeline(tmp_path / "f", PipelineOptions(model=str(tmp_path / "no-model")), progress=False)


def test_penalty_does_not_depend_on_a_shared_value_offset():
    # pi = E/EF is invariant to adding one vector to every value; the round-off floor must be too
    rng = np.random.default_rng(5)
    p = rng.random(30) ** 3
    p /= p.sum()
    V = rng.normal(size=(30, 4))
    opts = CertifyOptions(solver="none")
    a = certify_row(rows.Row(0, p, V, {}), 4, opts)
    b = certify_row(rows.Row(0, p, V + 1e11, {}), 4, opts)
    assert np.isfinite(a["pi_top"]) and np.isfinite(b["pi_top"])
    # tolerance: the offset 1e11 costs ~1e11 * eps = 2e-5 absolute accuracy in E and EF (both ~0.1 here)
    assert b["pi_top"] == pytest.approx(a["pi_top"], rel=1e-2)


def test_free_geometry_column_is_the_selectors_forced_error(tmp_path):
    from forcedweight.selectors import FreeGeometry
    from forcedweight.selectors.base import RowView

    recs = [_rec(i, n) for i, n in enumerate([20, 31])]
    out = certify_file(_write(tmp_path / "r.parquet", recs), tmp_path / "o.parquet", [4], **OPTS)
    got = pq.read_table(out).to_pylist()
    for rec, r in zip(recs, got):
        p = rec["weights"] / rec["weights"].sum()
        V = rec["values"].reshape(-1, 3)
        S = FreeGeometry().select(RowView(p, V), 4)
        # the same float64 operator on the same set: relative 1e-12
        assert r["es_free_geometry"] == pytest.approx(op.forced_error(p, V, S), rel=1e-12)
        assert r["es_free_geometry"] >= r["es_best"] * (1 - 1e-9)  # never below the certified optimum


def _wide(seed, decades):
    """A row of 11 keys whose first ``light`` weights are 10**-decades (in a range) of the others."""
    rng = np.random.default_rng(seed)
    n = 11
    p = np.exp(rng.normal(size=n))
    light = rng.integers(2, n - 3)
    p[:light] *= 10.0 ** rng.uniform(-decades[1], -decades[0], size=light)
    p = p[rng.permutation(n)]
    return p / p.sum(), rng.normal(size=(n, 1))


def test_weights_beyond_the_exact_search_range_are_refused_naming_the_row(tmp_path, monkeypatch):
    """Weights 1e-300..1e-150 of the largest: the enumeration and bnb sum squares that underflow, and proved
    wrong sets optimal (1-D rows: 3 of 200 for bnb, 7 of 300 for the enumeration). Such a row is refused with
    its reason (an error naming row and file, or status=invalid with skip_invalid); a row whose weights span
    1e-90..1e-60 is certified and its proof holds against E of every subset."""
    from itertools import combinations

    from forcedweight.certify import run as run_module
    from forcedweight.certify.row import MASS_SPAN

    p, V = _wide(46, (150, 300))
    assert p[p > 0].min() < MASS_SPAN * p.max()
    with pytest.raises(errors.RowError, match="weights span more than 1e100"):
        certify_row(rows.Row(7, p, V, {}), 2, CertifyOptions())
    src = _write(tmp_path / "wide.parquet", [_rec(0, 12), dict(weights=p, values=V.ravel(), value_dim=1)])
    certified = []  # the run's up-front screen refuses the row: no row is certified before the error
    monkeypatch.setattr(run_module, "certify_row", lambda *a, **k: certified.append(a) or certify_row(*a, **k))
    with pytest.raises(errors.RowError, match="row 1.*weights span") as exc:
        certify_file(src, tmp_path / "out.parquet", [2], CertifyOptions(), progress=False)
    assert "wide.parquet" in str(exc.value) and not (tmp_path / "out.parquet").exists() and certified == []
    out = certify_file(src, tmp_path / "out2.parquet", [2], CertifyOptions(), skip_invalid=True, progress=False)
    got = pq.read_table(out).to_pydict()
    assert got["status"] == ["optimal", "invalid"] and "weights span" in got["reason"][1]
    for seed in range(6):
        p, V = _wide(seed, (60, 90))
        for s in (2, 3):
            loop = min(op.forced_error(p, V, np.array(c)) for c in combinations(range(p.size), s))
            # the enumeration (the pool covers the row), then bnb (a pool of s + 2 keys)
            for opts in (CertifyOptions(solver="bnb"), CertifyOptions(solver="bnb", pool_mass=1, pool_error=1)):
                rec = certify_row(rows.Row(seed, p, V, {}), s, opts)
                # (a proof within bnb's 1e-9; E's own float64 noise near 0: 1e-15)
                assert rec["proved"] and rec["es_best"] <= loop * (1 + 1e-9) + 1e-15
                _check_record(rec, p, V, s)
