"""Group voting under GQA against a direct, independent loop on rows of a tiny random Llama."""

import sys
from itertools import combinations
from math import comb

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from forcedweight import rows
from forcedweight.certify import CertifyOptions, certify_row
from forcedweight.certify.enumerate import enumerate_best
from forcedweight.certify.groups import group_voting, head_subsets
from forcedweight.certify.pool import candidate_pool
from forcedweight.models import LoadedModel, byte_tokenizer, tiny_llama
from forcedweight.errors import InputError

TEXTS = ["the cat sat", "a b c d e f"]


def _dump(path, heads, kv_heads, all_positions=True):
    from forcedweight.dump import dump_rows

    model = LoadedModel(tiny_llama(1, layers=2, heads=heads, kv_heads=kv_heads, head_dim=8), byte_tokenizer(), "tiny", "")
    return dump_rows(model, TEXTS, path, all_positions=all_positions, positions=2, progress=False)


@pytest.fixture(scope="module")
def dump_g4(tmp_path_factory):
    """Rows of every position of a tiny GQA Llama: 8 query heads, 2 KV heads (groups of G = 4)."""
    return _dump(tmp_path_factory.mktemp("g4") / "rows", heads=8, kv_heads=2)


def _E(p, V, S):
    """Forced-weight error written out directly: ||m_S - mu||."""
    S = list(S)
    return float(np.linalg.norm(p[S] @ V[S] / p[S].sum() - p @ V))


def direct_costs(rows_dir, s):
    """(text, layer, kv, pos, subset, head) -> (cost_top, cost_pool) over every subset, brute force."""
    df = pl.read_parquet(rows_dir / "rows-*.parquet")
    out = {}
    for key, grp in df.group_by(["text_id", "layer", "kv_head", "query_pos"]):
        p, V = {}, {}
        for r in grp.iter_rows(named=True):
            w = np.asarray(r["weights"], dtype=np.float64)
            p[r["head"]] = w / w.sum()
            V[r["head"]] = np.asarray(r["values"], dtype=np.float64).reshape(w.size, r["value_dim"])
        heads = sorted(p)
        n = p[heads[0]].size
        if n <= s:
            continue
        # heads of one KV group read the same values (GQA): the premise of a shared kept set
        for h in heads[1:]:
            np.testing.assert_array_equal(V[h], V[heads[0]])
        best = {h: min(_E(p[h], V[h], c) for c in combinations(range(n), s)) for h in heads}
        top = {h: _E(p[h], V[h], sorted(np.argsort(-p[h], kind="stable")[:s])) for h in heads}
        for g in range(2, len(heads) + 1):
            for sub in combinations(heads, g):
                summed = sum(p[h] for h in sub)
                S = sorted(np.argsort(-summed, kind="stable")[:s])
                for h in sub:
                    e = _E(p[h], V[h], S)
                    out[(*key, ",".join(map(str, sub)), h)] = (e / top[h], e / best[h])
    return out


@pytest.mark.parametrize("s", [2, 4])
def test_group_costs_match_direct_loop(dump_g4, tmp_path, s):
    # pool_mass 32 makes the pool every key (N <= 12 here), so ES_pool = brute force over all keys;
    # max_subsets 64 >= C(4, g): every subset of every size is evaluated
    out = group_voting(dump_g4, [s], tmp_path / "g.parquet", pool_mass=32)
    got = pl.read_parquet(out)
    ref = direct_costs(dump_g4, s)
    assert got.height == len(ref) > 0
    assert sorted(got["g"].unique().to_list()) == [2, 3, 4]
    for r in got.iter_rows(named=True):
        ct, cp = ref[(r["text_id"], r["layer"], r["kv_head"], r["query_pos"], r["subset"], r["head"])]
        # float64 on <= 12 keys of dimension 8: round-off ~1e-15 relative
        assert r["cost_top"] == pytest.approx(ct, rel=1e-9)
        assert r["cost_pool"] == pytest.approx(cp, rel=1e-9)
        assert r["cost_pool"] >= 1 - 1e-12 and r["s"] == s and r["model"] == "tiny"


def test_sampled_subsets_are_capped_distinct_and_correct(dump_g4, tmp_path):
    a = pl.read_parquet(group_voting(dump_g4, [3], tmp_path / "a.parquet", pool_mass=32, max_subsets=3, seed=7))
    b = pl.read_parquet(group_voting(dump_g4, [3], tmp_path / "b.parquet", pool_mass=32, max_subsets=3, seed=7))
    assert a.equals(b)  # deterministic given the seed
    per = a.group_by(["text_id", "layer", "kv_head", "query_pos", "g"]).agg(pl.col("subset").n_unique().alias("k"))
    for r in per.iter_rows(named=True):
        assert r["k"] == min(comb(4, r["g"]), 3)
    assert sorted(a["g"].unique().to_list()) == [2, 3, 4]
    ref = direct_costs(dump_g4, 3)
    for r in a.iter_rows(named=True):
        ct, cp = ref[(r["text_id"], r["layer"], r["kv_head"], r["query_pos"], r["subset"], r["head"])]
        assert (r["cost_top"], r["cost_pool"]) == pytest.approx((ct, cp), rel=1e-9)
    # the sample does not depend on the other budgets asked for, and every budget has the same subsets
    # (one generator shared by the budgets drew s = 3's subsets after s = 2's had used it)
    both = pl.read_parquet(group_voting(dump_g4, [2, 3], tmp_path / "c.parquet", pool_mass=32, max_subsets=3, seed=7))
    key = ["text_id", "layer", "kv_head", "query_pos", "g", "subset", "head"]
    assert both.filter(pl.col("s") == 3).drop("s").sort(key).equals(a.drop("s").sort(key))
    at2 = both.filter((pl.col("s") == 2) & (pl.col("n_keys") > 3))  # (rows with N <= s are skipped)
    assert at2.select(key).sort(key).equals(a.select(key).sort(key))


def test_head_subsets():
    rng = np.random.default_rng(0)
    assert head_subsets([3, 1, 2], 2, 10, rng) == [(1, 2), (1, 3), (2, 3)]
    got = head_subsets(list(range(10)), 4, 20, np.random.default_rng(1))
    assert len(got) == len(set(got)) == 20 and all(len(t) == 4 and list(t) == sorted(t) for t in got)
    assert got == head_subsets(list(range(10)), 4, 20, np.random.default_rng(1))


def test_group_bad_inputs(dump_g4, tmp_path):
    one_head = pl.read_parquet(dump_g4 / "rows-*.parquet").filter(pl.col("head").is_in([0, 4]))  # one per KV group
    one_head.write_parquet(tmp_path / "one.parquet")
    with pytest.raises(InputError, match="no KV group has two or more"):
        group_voting(tmp_path / "one.parquet", [2], tmp_path / "x.parquet")
    pl.DataFrame({"weights": [[0.5, 0.5]], "values": [[1.0, 2.0]], "value_dim": [1]}).write_parquet(tmp_path / "r.parquet")
    with pytest.raises(InputError, match="r.parquet: missing provenance column"):
        group_voting(tmp_path / "r.parquet", [2], tmp_path / "x.parquet")
    with pytest.raises(InputError, match="--s"):
        group_voting(dump_g4, [0], tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
    # refused before any work: a negative pool, an output that is a directory, inside the input
    # directory (the next read would take it for rows), or under a path that is a file
    with pytest.raises(InputError, match="--pool-mass"):
        group_voting(dump_g4, [2], tmp_path / "x.parquet", pool_mass=-1)
    (tmp_path / "adir").mkdir()
    with pytest.raises(InputError, match="adir: output path is a directory"):
        group_voting(dump_g4, [2], tmp_path / "adir")
    with pytest.raises(InputError, match="inside the input directory"):
        group_voting(dump_g4, [2], dump_g4 / "g.parquet")
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match="cannot write output"):
        group_voting(dump_g4, [2], tmp_path / "afile" / "x.parquet")
    assert not (tmp_path / "x.parquet").exists() and not (dump_g4 / "g.parquet").exists()


def test_cli_groups(dump_g4, tmp_path, monkeypatch, capsys):
    from forcedweight.cli import main

    monkeypatch.setattr(sys, "argv", ["forcedweight", "groups", str(dump_g4), "--s", "2", "--s", "3",
                                      "--out", str(tmp_path / "g.parquet")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    assert sorted(pl.read_parquet(tmp_path / "g.parquet")["s"].unique().to_list()) == [2, 3]
    monkeypatch.setattr(sys, "argv", ["forcedweight", "groups", str(tmp_path / "none"), "--s", "2", "--out", str(tmp_path / "h.parquet")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and "no such file" in capsys.readouterr().err


def test_groups_on_long_rows_use_the_pool_certify_uses(tmp_path, monkeypatch):
    # regression: at N = 200, s = 32 the unshrunk pool (52 keys, 1.26e14 subsets) made
    # `forcedweight groups` end in a ValueError; now it uses certify's pool, shrunk to fit
    from forcedweight.cli import main

    n, s, d = 200, 32, 8
    rng = np.random.default_rng(3)
    V = rng.normal(size=(n, d))  # heads of one KV group read the same values
    recs = []
    for h in range(2):
        p = np.exp(2.0 * rng.normal(size=n))
        p /= p.sum()
        recs.append(dict(weights=p, values=V.ravel(), value_dim=d, model="m", text_id=0, layer=1, head=h,
                         kv_head=0, query_pos=n - 1))
    src = tmp_path / "long.parquet"
    pq.write_table(rows.make_row_table(recs), src)
    full = candidate_pool(recs[0]["weights"], V, s)
    with pytest.raises(ValueError, match="subsets"):  # what groups used to do
        enumerate_best(recs[0]["weights"], V, full, s, max_subsets=CertifyOptions().max_subsets)
    out = tmp_path / "g.parquet"
    monkeypatch.setattr(sys, "argv", ["forcedweight", "groups", str(src), "--s", str(s), "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    got = pl.read_parquet(out)
    assert got.height == 2 and sorted(got["head"].to_list()) == [0, 1]
    opts = CertifyOptions(solver="none")
    for r in got.iter_rows(named=True):
        row = next(rr for rr in rows.iter_rows(src) if rr.extra["head"] == r["head"])
        rec = certify_row(row, s, opts)
        # C(pool, s) > max_subsets: the pool stays as configured, solved by the pool-restricted bnb
        assert rec["pool_size"] == full.size and comb(rec["pool_size"], s) > opts.max_subsets
        # the same pool and the same exact search: equal to the last bit
        assert r["es_pool"] == rec["es_pool"]
        # without the pool bnb the pool shrinks (the old rule): never a better pool optimum
        shrunk = certify_row(row, s, CertifyOptions(solver="none", pool_node_limit=0))
        assert shrunk["pool_size"] < full.size and comb(shrunk["pool_size"], s) <= opts.max_subsets
        assert rec["es_pool"] <= shrunk["es_pool"] * (1 + 1e-9)
        assert r["es_pool"] <= r["es_top"] * (1 + 1e-12) and r["cost_pool"] >= 1 - 1e-12


def test_groups_progress_counts_every_kv_group(dump_g4, tmp_path, monkeypatch):
    import forcedweight.certify.groups as groups_mod
    from forcedweight.io import progress as real_progress

    bars = []

    def spy(label, enabled=True, transient=False):
        bar = real_progress(label, enabled=False)
        bars.append(bar)
        return bar

    monkeypatch.setattr(groups_mod, "progress_bar", spy)
    out = group_voting(dump_g4, [2], tmp_path / "g.parquet", pool_mass=32)
    got = pl.read_parquet(out)
    task = bars[0].tasks[0]
    import forcedweight

    key = ["text_id", "layer", "kv_head", "query_pos"]
    n_groups = forcedweight.load_rows(dump_g4).select(key).unique().collect().height
    # one step per KV group at one query position of the input (groups with N <= s give no record)
    assert task.total == task.completed == n_groups >= got.select(key).unique().height > 0
