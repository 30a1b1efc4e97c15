"""Bad input that used to reach a traceback or a wrong answer in certify (issue 16 items 6-8, 11)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forcedweight import rows
from forcedweight.certify import certify_file
from forcedweight.errors import InputError
from tests.certify.test_certify import OPTS, _rec, _write


def test_weights_near_the_float64_maximum_are_rescaled_exactly(tmp_path):
    # all weights 1e308 overflow their plain sum; after rescaling the row is the uniform row
    huge = _rec(0, 8, keys=False)
    huge["weights"] = np.full(8, 1e308)
    plain = dict(huge, weights=np.ones(8))
    a = certify_file(_write(tmp_path / "a.parquet", [huge]), tmp_path / "ra.parquet", [3], **OPTS)
    b = certify_file(_write(tmp_path / "b.parquet", [plain]), tmp_path / "rb.parquet", [3], **OPTS)
    ra, rb = pq.read_table(a).to_pylist()[0], pq.read_table(b).to_pylist()[0]
    assert np.isfinite(ra["es_top"]) and ra["status"] == rb["status"] == "optimal"
    for k in ("es_top", "es_best"):
        assert ra[k] == pytest.approx(rb[k], rel=1e-12)  # same row up to one rounding per weight
    assert ra["best_set"] == rb["best_set"]
    p, _ = rows.validate_row(huge["weights"], huge["values"], 3, 0)
    np.testing.assert_allclose(p, np.full(8, 1 / 8), rtol=1e-15)


@pytest.mark.parametrize("ids", [[0, 1, 1], [None, 0, 2]])
def test_duplicate_row_ids_are_refused_naming_the_row(tmp_path, ids):
    t = rows.make_row_table([_rec(i, 6, keys=False) for i in range(3)])
    t = t.append_column("row_id", pa.array(ids, type=pa.int64()))
    pq.write_table(t, tmp_path / "dup.parquet")
    dup = 1 if ids[1] == 1 else 0  # a null row_id at position 0 collides with the explicit 0
    with pytest.raises(InputError, match=f"row_id {dup} appears more than once"):
        certify_file(tmp_path / "dup.parquet", tmp_path / "o.parquet", [2], **OPTS)
    with pytest.raises(InputError, match=f"row_id {dup} appears more than once"):
        certify_file(tmp_path / "dup.parquet", tmp_path / "o.parquet", [2], skip_invalid=True, **OPTS)
    assert not (tmp_path / "o.parquet").exists()


def test_a_pool_whose_tables_exceed_max_memory_is_refused_with_or_without_a_solver(tmp_path):
    # with --max-subsets raised at s = 2 the candidate pool can take the whole row: its two P x P tables
    # (enumerate.enumerate_bytes) are counted against --max-memory even where no solver runs (--solver none,
    # or a row the pool covers), and the message names the pool's options; the default pool fits
    from forcedweight.certify import CertifyOptions
    from forcedweight.certify.enumerate import enumerate_bytes
    from forcedweight.certify.options import pool_memory, solver_memory
    from forcedweight.certify.row import needs_solver

    recs = [_rec(0, 12, keys=False), _rec(1, 200, keys=False)]
    d = recs[1]["value_dim"]
    src = _write(tmp_path / "r.parquet", recs)
    assert pool_memory(200, d, 2, 300, 8, 10**6) == enumerate_bytes(200, d, 200, 2) >= 16 * 200 * 200
    # more subsets than the cap: the pool's bnb on its 200 keys first (none with a node limit of 0), then the
    # enumeration of the pool shrunk to C(14, 2) = 91 <= 100 subsets
    assert pool_memory(200, d, 2, 300, 8, 100, pool_node_limit=0) == enumerate_bytes(200, d, 14, 2)
    assert pool_memory(200, d, 2, 300, 8, 100) == solver_memory("bnb", 200, d) > enumerate_bytes(200, d, 14, 2)
    for solver in ("none", "bnb"):
        wide = CertifyOptions(pool_mass=300, pool_error=8, max_subsets=10**6, solver=solver, time_limit=20.0,
                              max_memory=400_000)
        assert not needs_solver(200, 2, wide)  # the pool covers the row: no solver runs on it either way
        reason = wide.memory_problem(200, d, 2, False)
        assert reason is not None and "candidate pool" in reason and "--max-subsets" in reason
        with pytest.raises(InputError, match=r"row 1 .*candidate pool .*N = 200"):
            certify_file(src, tmp_path / "o.parquet", [2], options=wide, progress=False)
        assert not (tmp_path / "o.parquet").exists()
        t = pq.read_table(certify_file(src, tmp_path / "o.parquet", [2], options=wide, progress=False,
                                       skip_invalid=True)).to_pylist()
        assert t[0]["status"] == "optimal" and t[1]["status"] == "invalid" and "candidate pool" in t[1]["reason"]
        (tmp_path / "o.parquet").unlink()
    narrow = CertifyOptions(pool_mass=2, pool_error=2, solver="none", time_limit=20.0, max_memory=400_000)
    assert narrow.memory_problem(200, d, 2, False) is None


def _true_pi(p, V, S):
    """π = E / EF of a two-key kept set in 50-digit arithmetic (EF: the projection on the segment)."""
    import mpmath as mp

    mp.mp.dps = 50
    p = [mp.mpf(float(x)) for x in p]
    tot = sum(p)
    p = [x / tot for x in p]
    V = [[mp.mpf(float(x)) for x in r] for r in V]
    d = len(V[0])
    mu = [sum(p[i] * V[i][k] for i in range(len(p))) for k in range(d)]
    w = sum(p[i] for i in S)
    m = [sum(p[i] * V[i][k] for i in S) / w for k in range(d)]
    E = mp.sqrt(sum((m[k] - mu[k]) ** 2 for k in range(d)))
    a, b = V[S[0]], V[S[1]]
    ab = [b[k] - a[k] for k in range(d)]
    t = min(max(sum((mu[k] - a[k]) * ab[k] for k in range(d)) / sum(x * x for x in ab), 0), 1)
    EF = mp.sqrt(sum((a[k] + t * ab[k] - mu[k]) ** 2 for k in range(d)))
    return float(E / EF), float(E)


def test_pi_of_a_peaked_row_is_finite_and_exact():
    from forcedweight.certify.record import penalties
    from forcedweight.core import operator as op

    eps = 2e-11  # three keys of mass 2e-11, one of the rest: E ~ 1e-9 while the values spread over ~60
    p = np.array([1 - 3 * eps, eps, eps, eps])
    V = 30 * np.array([[0.0, 0.0], [1.0, 0.0], [-2.0, 1.0], [0.3, -0.2]])
    S = np.array([0, 1])
    want, e_true = _true_pi(p, V, S)
    assert 1e-9 < e_true < 2e-9 and 1.7 < want < 1.9  # the regime of the report: E ~ 1e-9, π ~ 1.8
    e = op.forced_error(p, V, S)
    got = penalties(p, V, S, S, e, e)
    # float64 E and EF of ~1e-9 carry an absolute error ~1e-16 of the scale 67: relative ~1e-5
    assert got["pi_top"] == pytest.approx(want, rel=1e-5) and got["pi_best"] == pytest.approx(want, rel=1e-5)
    # below the round-off level (a kept set that reaches mu exactly) π stays undefined, never a number
    Vz = V.copy()
    Vz[1:] = 0.0
    assert np.isnan(penalties(p, Vz, S, S, 0.0, 0.0)["pi_top"])


def test_rows_whose_gram_matrix_exceeds_max_memory_are_refused(tmp_path):
    from forcedweight.certify import CertifyOptions
    from forcedweight.certify.options import parse_memory, solver_memory

    assert solver_memory("bnb", 100_000, 64) > 74 * 2**30  # the 74.5 GiB of the report, before any solve
    assert parse_memory("8G") == 8 * 2**30 and parse_memory("512MiB") == 2**29 and parse_memory("1e6") == 10**6
    with pytest.raises(InputError, match="--max-memory"):
        parse_memory("lots")
    recs = [_rec(0, 12, keys=False), _rec(1, 200, keys=False)]  # N = 200: bnb's Gram is 320 kB
    src = _write(tmp_path / "r.parquet", recs)
    small = CertifyOptions(pool_mass=2, pool_error=2, time_limit=20.0, max_memory=200_000)
    assert small.memory_problem(12, 3, 3) is None and "max-memory" in small.memory_problem(200, 3, 3)
    with pytest.raises(InputError, match=r"row 1 .*needs ~.* GiB for N = 200"):
        certify_file(src, tmp_path / "o.parquet", [3], options=small, progress=False)
    assert not (tmp_path / "o.parquet").exists()
    out = certify_file(src, tmp_path / "o.parquet", [3], options=small, progress=False, skip_invalid=True)
    t = pq.read_table(out).to_pylist()
    assert t[0]["status"] == "optimal" and t[1]["status"] == "invalid" and "max-memory" in t[1]["reason"]
    # with room (or without a solver) the same row is certified
    roomy = CertifyOptions(pool_mass=2, pool_error=2, time_limit=20.0, max_memory=10**9)
    t = pq.read_table(certify_file(src, tmp_path / "o2.parquet", [3], options=roomy, progress=False)).to_pylist()
    assert t[1]["status"] != "invalid"
