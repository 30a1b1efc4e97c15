import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forcedweight import io as fio
from forcedweight import errors
from forcedweight import rows


def _table(n_rows=5, n=6, d=2, seed=0, with_id=True):
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n_rows):
        w = rng.random(n)
        recs.append({"weights": (w / w.sum()).tolist(), "values": rng.normal(size=n * d).tolist(),
                     "value_dim": d, "layer": i % 3, "my_extra": f"x{i}"})
        if with_id:
            recs[-1]["row_id"] = 100 + i
    return rows.make_row_table(recs)


def test_stream_directory_in_row_groups_and_carry_unknown_columns(tmp_path):
    pq.write_table(_table(7, seed=1, with_id=False), tmp_path / "a.parquet", row_group_size=3)
    pq.write_table(_table(4, seed=2, with_id=False), tmp_path / "b.parquet", row_group_size=2)
    # a dump's sidecars are not rows
    pq.write_table(pa.table({"text_id": [0], "text": ["t"]}), tmp_path / "texts.parquet")
    pq.write_table(pa.table({"row_id": [0]}), tmp_path / "stats-00000.parquet")
    batches = list(rows.iter_batches(tmp_path))
    assert [b.num_rows for _, _, b in batches] == [3, 3, 1, 2, 2]
    got = list(rows.iter_rows(tmp_path))
    assert [r.row_id for r in got] == list(range(11))  # position when row_id is absent
    assert got[8].extra["my_extra"] == "x1"
    assert rows.count_rows(tmp_path) == 11
    r = got[0]
    assert r.V.shape == (6, 2) and r.p.dtype == np.float64
    assert r.p.sum() == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize(
    "weights,values,dim,needle",
    [
        ([0.5, float("nan")], [1.0, 2.0], 1, "NaN"),
        ([0.5, float("inf")], [1.0, 2.0], 1, "NaN or inf"),
        ([0.5, -0.1], [1.0, 2.0], 1, "negative"),
        ([0.0, 0.0], [1.0, 2.0], 1, "all zero"),
        ([0.5, 0.5], [1.0, 2.0, 3.0], 1, "expected N*value_dim"),
        ([0.5, 0.5], [1.0, float("nan")], 1, "values contain"),
        ([], [], 1, "empty"),
    ],
)
def test_bad_rows_name_the_row(weights, values, dim, needle):
    with pytest.raises(errors.RowError) as exc:
        rows.validate_row(weights, values, dim, row_id=42, source="f.parquet")
    assert "row 42" in str(exc.value) and needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_skip_invalid_returns_invalid_rows(tmp_path):
    t = rows.make_row_table([
        {"row_id": 1, "weights": [0.5, 0.5], "values": [1.0, 2.0], "value_dim": 1},
        {"row_id": 2, "weights": [0.5, -0.5], "values": [1.0, 2.0], "value_dim": 1},
    ])
    pq.write_table(t, tmp_path / "r.parquet")
    with pytest.raises(errors.RowError, match="row 2"):
        list(rows.iter_rows(tmp_path / "r.parquet"))
    got = list(rows.iter_rows(tmp_path / "r.parquet", skip_invalid=True))
    assert isinstance(got[1], rows.InvalidRow) and "negative" in got[1].reason


def test_budget_validation():
    rows.validate_budget(3, 3, 0)
    with pytest.raises(errors.RowError, match="exceeds N"):
        rows.validate_budget(4, 3, 7)
    with pytest.raises(errors.RowError, match="below 1"):
        rows.validate_budget(0, 3, 7)


def test_subnormal_masses_are_refused():
    # p_i (v_i - mu) of a mass near 5e-324 keeps a few bits: every solver proved a wrong set optimal
    with pytest.raises(errors.RowError, match="subnormal masses"):
        rows.validate_row([1.0, 1.0, 3e-323, 4e-323], [1.0, -1.0, 0.70, -0.68], 1, 0)
    p, _ = rows.validate_row([1.0, 1e-300, 0.0], [1.0, 2.0, 3.0], 1, 0)  # tiny but normal, and 0: kept
    assert p[1] == pytest.approx(1e-300) and p[2] == 0.0


def test_bad_files(tmp_path):
    with pytest.raises(errors.InputError, match="no such file"):
        list(rows.iter_batches(tmp_path / "missing.parquet"))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(errors.InputError, match="junk.parquet: not a readable Parquet"):
        list(rows.iter_batches(tmp_path / "junk.parquet"))
    pq.write_table(pa.table({"weights": [[1.0]]}), tmp_path / "cols.parquet")
    with pytest.raises(errors.InputError, match="missing required column"):
        list(rows.iter_batches(tmp_path / "cols.parquet"))
    # columns of the wrong type: one line naming the column (a text row_id was a ValueError in certify)
    good = {"weights": [[0.5, 0.5]], "values": [[1.0, 2.0]], "value_dim": [1], "row_id": [0]}
    for name, bad, kind in (("row_id", ["a"], "integers"), ("value_dim", ["1"], "integers"),
                            ("weights", [["0.5", "0.5"]], "lists of numbers"), ("values", [1.0], "lists of numbers")):
        pq.write_table(pa.table({**good, name: bad}), tmp_path / "typed.parquet")
        with pytest.raises(errors.InputError, match=f"typed.parquet: column {name} holds .*, not {kind}"):
            list(rows.iter_batches(tmp_path / "typed.parquet"))
    pq.write_table(pa.table(good), tmp_path / "typed.parquet")
    assert len(list(rows.iter_batches(tmp_path / "typed.parquet"))) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(errors.InputError, match="no .parquet files"):
        fio.list_parquet_files(empty)


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.parquet"
    with pytest.raises(RuntimeError):
        with fio.atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    fio.write_table_atomic(_table(2), target)
    assert pq.read_table(target).num_rows == 2
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]


def test_unwritable_destination(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(errors.InputError, match="cannot write"):
        fio.write_table_atomic(_table(1), blocker / "sub" / "out.parquet")


def test_output_path_that_is_a_directory_or_unwritable(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(errors.InputError, match="adir: output path is a directory"):
        fio.write_table_atomic(_table(1), tmp_path / "adir")
    with pytest.raises(errors.InputError, match="adir: output path is a directory"):
        fio.check_output_file(tmp_path / "adir")
    (tmp_path / "file").write_text("x")
    with pytest.raises(errors.InputError, match="out.parquet: cannot write output .*file is not a directory"):
        fio.check_output_file(tmp_path / "file" / "sub" / "out.parquet")
    # a writable target: nothing is created (missing parents are made by the first write), the probe leaves nothing
    assert fio.check_output_file(tmp_path / "new" / "sub" / "out.parquet") == tmp_path / "new" / "sub" / "out.parquet"
    assert fio.check_output_file(tmp_path / "adir" / "out.parquet") == tmp_path / "adir" / "out.parquet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "file"] and not list((tmp_path / "adir").iterdir())
    # a lock on an output under missing directories: they are removed again when the command fails
    with pytest.raises(errors.InputError, match="bad input"):
        with fio.output_lock(tmp_path / "new" / "sub" / "out"):
            assert (tmp_path / "new" / "sub").is_dir()
            raise errors.InputError("bad input")
    assert not (tmp_path / "new").exists()
    with fio.output_lock(tmp_path / "new" / "sub" / "out"):  # kept on success
        pass
    assert (tmp_path / "new" / "sub").is_dir()


def test_load_rows_scans_the_row_shards_of_a_dump_only(tmp_path):
    import json

    import polars as pl

    import forcedweight

    d = tmp_path / "dump"
    d.mkdir()
    recs = [dict(row_id=i, weights=[0.5, 0.5], values=[1.0, 2.0], value_dim=1, layer=i % 2) for i in range(6)]
    pq.write_table(rows.make_row_table(recs[:4]), d / "rows-t0-l0.parquet")
    pq.write_table(rows.make_row_table(recs[4:]), d / "rows-t1-l0.parquet")
    pq.write_table(pa.table({"text_id": [0], "text": ["x"]}), d / "texts.parquet")
    pq.write_table(pa.table({"row_id": [0], "dropped_mass_s8": [0.1]}), d / "stats-t0-l0.parquet")
    (d / "manifest.json").write_text(json.dumps({"complete": True, "n_rows": 6}))
    with pytest.raises(Exception):  # the plain scan of the directory trips on the sidecars / manifest
        pl.scan_parquet(d).collect()
    lf = forcedweight.load_rows(d)
    assert isinstance(lf, pl.LazyFrame)
    df = lf.sort("row_id").collect()
    assert df["row_id"].to_list() == list(range(6)) and df.filter(pl.col("layer") == 1).height == 3
    assert df["weights"].to_list()[0] == [0.5, 0.5]
    (d / "manifest.json").write_text(json.dumps({"complete": False, "n_rows": 9}))
    with pytest.raises(errors.InputError, match="incomplete dump"):
        forcedweight.load_rows(d)
    assert forcedweight.load_rows(d, allow_incomplete=True).collect().height == 6


def test_rows_by_id_picks_valid_rows_across_files(tmp_path):
    # two shards; ids found in either, an invalid row and a missing id left out
    pq.write_table(_table(3), tmp_path / "a.parquet")
    bad = rows.make_row_table([{"row_id": 7, "weights": [0.5, -0.5], "values": [1.0, 2.0], "value_dim": 1}])
    pq.write_table(bad, tmp_path / "b.parquet")
    got = rows.rows_by_id(tmp_path, [102, 100, 7, 999])
    assert sorted(got) == [100, 102]
    assert all(isinstance(r, rows.Row) and r.row_id == k for k, r in got.items())
    first = next(rows.iter_rows(tmp_path / "a.parquet"))
    assert np.array_equal(got[100].p, first.p) and np.array_equal(got[100].V, first.V)
