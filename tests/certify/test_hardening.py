"""Concurrency and crash hardening of certify and groups (issue 16 items 1-4)."""

import subprocess

import pyarrow.parquet as pq
import pytest

from forcedweight.certify import certify_file
from forcedweight.errors import InputError
from tests.certify.test_certify import OPTS, _rec, _run_sub, _same, _table, _write
from tests.test_io import hold_lock


@pytest.fixture()
def rows_file(tmp_path):
    return _write(tmp_path / "rows.parquet", [_rec(i, n) for i, n in enumerate([12, 9, 14, 10])],
                  row_group_size=2)


def test_second_concurrent_certify_is_refused(rows_file, tmp_path):
    out = tmp_path / "res.parquet"
    holder = hold_lock(out)
    try:
        res = _run_sub([rows_file, "--s", 3, "--out", out])
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            certify_file(rows_file, out, [3], **OPTS)
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and f"pid {holder.pid}" in lines[0]
    assert not out.exists()
    certify_file(rows_file, out, [3], **OPTS)  # the lock is gone with its holder
    assert pq.read_table(out).num_rows == 4


def test_groups_refused_while_its_output_is_locked(rows_file, tmp_path):
    from forcedweight.certify.groups import group_voting

    out = tmp_path / "groups.parquet"
    holder = hold_lock(out)
    try:
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            group_voting(rows_file, [2], out)
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists()


@pytest.mark.parametrize("damage", ["zeroed", "truncated", "short"])
def test_a_damaged_part_is_redone_on_resume(rows_file, tmp_path, damage):
    from forcedweight.certify.run import KILL_HOOK, parts_dir_for

    ref = certify_file(rows_file, tmp_path / "ref.parquet", [3, 4], **OPTS)
    out = tmp_path / "out.parquet"
    args = [rows_file, "--s", 3, "--s", 4, "--pool-mass", 2, "--pool-error", 2, "--chunk-rows", 2]
    killed = _run_sub(args + ["--out", out], {KILL_HOOK: "1"})
    assert killed.returncode == -9, killed.stderr
    (part,) = sorted(parts_dir_for(out).glob("part-*.parquet"))
    if damage == "zeroed":
        part.write_bytes(b"")  # what an un-fsync'd rename leaves after a power cut
    elif damage == "truncated":
        part.write_bytes(part.read_bytes()[:-20])
    else:  # readable, but fewer records than state.json recorded
        t = pq.read_table(part)
        pq.write_table(t.slice(0, t.num_rows - 1), part)
    again = _run_sub(args + ["--out", out])
    assert again.returncode == 0, again.stderr
    assert f"{part.name}" in again.stderr and "certifying its rows again" in again.stderr
    _same(_table(out), _table(ref))


def _incomplete_dump(tmp_path):
    import json

    dump = tmp_path / "dump"
    dump.mkdir()
    _write(dump / "rows-000.parquet", [_rec(i, 10) for i in range(2)])
    (dump / "manifest.json").write_text(json.dumps({"format": 1, "n_rows": 40, "complete": False}))
    return dump


def test_an_incomplete_dump_is_refused_unless_allowed(tmp_path):
    from forcedweight.certify.groups import group_voting
    from forcedweight.probabilistic.study import run_study

    dump = _incomplete_dump(tmp_path)
    out = tmp_path / "res.parquet"
    res = _run_sub([dump, "--s", 3, "--out", out])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert str(dump) in lines[0] and "complete: false" in lines[0] and "--allow-incomplete" in lines[0]
    assert "resume" in lines[0] and not out.exists()
    with pytest.raises(InputError, match="incomplete dump"):
        group_voting(dump, [3], tmp_path / "g.parquet")
    with pytest.raises(InputError, match="incomplete dump"):
        run_study(dump, tmp_path / "study", progress=False)
    assert not (tmp_path / "g.parquet").exists() and not (tmp_path / "study").exists()
    # one rows file of the dump is refused the same way
    with pytest.raises(InputError, match="incomplete dump"):
        certify_file(dump / "rows-000.parquet", out, [3], **OPTS)
    ok = _run_sub([dump, "--s", 3, "--out", out, "--allow-incomplete"])
    assert ok.returncode == 0, ok.stderr
    assert pq.read_table(out).num_rows == 2
    # once the manifest says complete the rows are taken as they are
    import json

    (dump / "manifest.json").write_text(json.dumps({"format": 1, "n_rows": 2, "complete": True}))
    certify_file(dump, tmp_path / "res2.parquet", [3], **OPTS)
    assert pq.read_table(tmp_path / "res2.parquet").num_rows == 2


def _python_grandchild(k, pid: int) -> bool:
    """Whether process ``k`` is a Python process below the fork server of ``pid`` (a short-lived helper, such
    as an ``ldconfig``, may also show up there, and may be gone before it is asked)."""
    import psutil

    try:
        return k.ppid() != pid and "python" in k.name().lower()
    except psutil.NoSuchProcess:
        return False


def test_workers_exit_when_the_parent_is_killed(tmp_path):
    import os
    import signal
    import time

    import psutil

    from tests.certify.test_certify import REPO

    src = _write(tmp_path / "many.parquet", [_rec(i, 40) for i in range(400)], row_group_size=400)
    out = tmp_path / "res.parquet"
    code = "from forcedweight.cli import main; main()"
    proc = psutil.Popen([__import__("sys").executable, "-c", code, "certify", str(src), "--s", "8", "--s", "12",
                         "--workers", "2", "--chunk-rows", "1", "--no-progress", "--out", str(out)], cwd=REPO,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        kids = []
        while time.monotonic() < deadline:  # fork server + 2 workers (+ resource tracker)
            kids = proc.children(recursive=True)
            workers = [k for k in kids if _python_grandchild(k, proc.pid)]
            if len(workers) >= 2:
                break
            assert proc.poll() is None, "certify finished before its workers could be seen"
            time.sleep(0.2)
        assert len(workers) >= 2, kids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, [(p.pid, p.name()) for p in alive]  # every helper process is gone within 10 s
    finally:
        for k in [proc, *kids]:  # never leave them behind, even when the test fails
            try:
                k.kill()
            except psutil.NoSuchProcess:
                pass
    assert not out.exists()


def test_value_dim_strings_and_fractions_are_refused(tmp_path):
    import pyarrow as pa

    from forcedweight import rows as rows_mod

    t = rows_mod.make_row_table([_rec(i, 6, keys=False) for i in range(2)])
    i = t.column_names.index("value_dim")
    frac = t.set_column(i, "value_dim", pa.array([3.0, 2.5]))
    pq.write_table(frac, tmp_path / "frac.parquet")
    res = _run_sub([tmp_path / "frac.parquet", "--s", 2, "--out", tmp_path / "o.parquet"])
    assert res.returncode == 2 and res.stderr.strip().startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    assert "row 1" in res.stderr and "value_dim 2.5 is not an integer" in res.stderr
    nulls = t.set_column(i, "value_dim", pa.nulls(2))  # (a null-typed column, as polars writes one)
    pq.write_table(nulls, tmp_path / "null.parquet")
    res = _run_sub([tmp_path / "null.parquet", "--s", 2, "--out", tmp_path / "o.parquet"])
    assert res.returncode == 2 and "value_dim is null" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    strs = t.set_column(i, "value_dim", pa.array(["3", "3"]))
    pq.write_table(strs, tmp_path / "str.parquet")
    res = _run_sub([tmp_path / "str.parquet", "--s", 2, "--out", tmp_path / "o.parquet"])
    assert res.returncode == 2 and "value_dim" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.parquet").exists()


def test_a_finished_output_is_kept_unless_forced(rows_file, tmp_path, capsys):
    import os

    from forcedweight.certify import CertifyOptions
    from forcedweight.certify.run import FINGERPRINT_KEY

    out = certify_file(rows_file, tmp_path / "o.parquet", [3], **OPTS)
    assert FINGERPRINT_KEY in pq.read_schema(out).metadata
    first = out.stat().st_ino  # every write is a rename of a new file: a new inode
    capsys.readouterr()
    certify_file(rows_file, out, [3], **OPTS)  # same input and options: nothing redone
    assert out.stat().st_ino == first and "up to date" in capsys.readouterr().err
    certify_file(rows_file, out, [3], force=True, **OPTS)  # --force: certified again
    second = out.stat().st_ino
    assert second != first
    opts = dict(OPTS, options=CertifyOptions(pool_mass=2, pool_error=2, time_limit=20.0, seed=1))
    certify_file(rows_file, out, [3], **opts)  # other options: redone
    assert out.stat().st_ino != second
    third = out.stat().st_ino
    certify_file(rows_file, out, [3, 4], **opts)  # other budgets: redone, with the new budget
    assert out.stat().st_ino != third and sorted(set(pq.read_table(out)["s"].to_pylist())) == [3, 4]
    fourth = out.stat().st_ino
    st = rows_file.stat()
    os.utime(rows_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the input changed: redone
    certify_file(rows_file, out, [3, 4], **opts)
    assert out.stat().st_ino != fourth


def _brute(p, V, s):
    import itertools

    from forcedweight.core import operator as op

    return min(op.forced_error(p, V, list(S)) for S in itertools.combinations(range(p.size), s) if p[list(S)].sum() > 0)


@pytest.mark.parametrize("scale", [1e-13, 1e-170, 1e140])
@pytest.mark.parametrize("solver", ["auto", "bnb", "scip"])
def test_values_of_any_magnitude_are_proved_as_brute_force(scale, solver):
    # values near 1e-13 were proved at SCIP's absolute rounding floor, and near 1e-170 their squares underflowed
    # bnb's Gram matrix: a wrong set came out optimal (the solvers now run on values scaled by a power of two)
    import numpy as np

    from forcedweight.certify import CertifyOptions, certify_row
    from forcedweight.rows import Row

    for seed in range(4):
        rng = np.random.default_rng(seed)
        p = rng.integers(1, 100, 9).astype(float)
        p /= p.sum()
        V = rng.integers(-9, 10, (9, 2)) * scale
        r = certify_row(Row(0, p, V), 3, CertifyOptions(solver=solver, pool_mass=0, pool_error=0))
        es = _brute(p, V, 3)
        assert r["status"] == "optimal" and r["es_best"] == pytest.approx(es, rel=1e-9)  # E's own rounding
        assert r["lower_bound"] <= es * (1 + 1e-9)


def test_scip_on_a_row_with_zero_masses_does_not_crash():
    # sets of zero-mass keys only (y = 0, w = 0) passed SCIP's cone and it died of SIGFPE after a few no-goods
    import numpy as np

    from forcedweight.certify.solvers.scip import solve_scip

    p = np.array([0.0, 0.0, 0.0, 0.0, 0.6, 0.4])
    V = np.array([[0.1], [-0.1], [0.6], [0.1], [-0.5], [0.4]])
    res = solve_scip(p, V, 1)
    assert res.proved and res.value == pytest.approx(_brute(p, V, 1))
    # beside a mass below SCIP's feasibility tolerance every zero-mass key still came back, one no-good each
    p = np.array([0.0] * 8 + [1 - 1e-9, 1e-9])
    V = np.linspace(-1, 1, 10)[:, None]
    res = solve_scip(p, V, 1)
    assert res.proved and res.info["nogoods"] == 0 and res.value == pytest.approx(_brute(p, V, 1))


def test_the_pool_branch_and_bound_on_tiny_values_equals_the_same_row_at_scale_one():
    # a pool holding every key with C(N, s) past max_subsets is proved by the pool's own branch and bound,
    # which ran on the unscaled contributions: at 1e-170 it proved sets 52-69x the optimum
    import numpy as np

    from forcedweight.certify import CertifyOptions, certify_row
    from forcedweight.rows import Row

    for seed in range(2):
        rng = np.random.default_rng(seed)
        p = rng.integers(1, 100, 25).astype(float)
        p /= p.sum()
        V = rng.integers(-9, 10, (25, 2)).astype(float)
        one = certify_row(Row(0, p, V), 13, CertifyOptions(solver="bnb"))
        tiny = certify_row(Row(0, p, V * 2.0**-560), 13, CertifyOptions(solver="bnb"))  # ~1e-169, exact
        assert one["status"] == tiny["status"] == "optimal"
        assert tiny["es_best"] == np.ldexp(one["es_best"], -560) and tiny["es_pool"] == np.ldexp(one["es_pool"], -560)
