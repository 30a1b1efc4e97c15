"""forcedweight report: tables against direct computation, figures, bad input, CLI."""

import math
import sys

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from forcedweight.report import figures
from forcedweight.core import stats as st
from forcedweight.report import build_report, compute_tables, load_results
from forcedweight.report.metrics import REQUIRED_COLUMNS
from forcedweight.errors import InputError

STATUS_P = [0.8, 0.08, 0.08, 0.04]


def fake_results(n_per=30, models=("m1",), layers=(0, 1), heads=(0,), s_values=(4, 8), seed=0, provenance=True):
    """A synthetic certify output table with the certify columns; kappa grows with dropped mass."""
    rng = np.random.default_rng(seed)
    recs, rid = [], 0
    for model in models:
        for layer in layers:
            for head in heads:
                for s in s_values:
                    for i in range(n_per):
                        dm = rng.beta(2, 5)
                        es_top = dm * rng.uniform(0.5, 1.5)
                        kappa = min(rng.exponential(0.04) * (0.3 + 2 * dm), 0.9)
                        es_best = es_top * (1 - kappa)
                        es_pool = es_best * (1 + rng.exponential(0.01) * (rng.random() < 0.3))
                        es_bal = es_top - rng.uniform(0.8, 1.0) * (es_top - es_best)
                        status = str(rng.choice(["optimal", "improved", "unsolved", "invalid"], p=STATUS_P))
                        lb = es_best * rng.uniform(0.5, 1.0) if status == "unsolved" else es_best
                        r = dict(
                            row_id=rid, s=s, n_keys=64, es_top=es_top, es_balance=es_bal, swaps=int(rng.integers(0, 4)),
                            es_pool=es_pool, es_best=es_best, best_set=list(range(s)), lower_bound=lb, status=status,
                            proved=status == "optimal", solver="bnb", closable_share=kappa, balancing_recovery=1.0,
                            dropped_mass=dm, ef_top=es_top / 1.2, pi_top=1.0 + rng.exponential(0.3) * s / 8,
                            es_geometric=es_top * rng.uniform(1, 3), es_leverage=es_top * rng.uniform(2, 20),
                            es_random=es_top * rng.uniform(2, 10), seconds=0.1, reason=None,
                        )
                        if provenance:
                            r.update(model=model, text_id=i % 3, layer=layer, head=head, kv_head=0, query_pos=10 + i)
                        if status == "invalid":
                            for k in ("es_top", "es_balance", "es_pool", "es_best", "lower_bound", "closable_share",
                                      "dropped_mass", "pi_top", "es_geometric", "es_leverage", "es_random"):
                                r[k] = None
                            r["reason"] = "weights contain NaN or inf"
                        recs.append(r)
                        rid += 1
    return pl.DataFrame(recs, infer_schema_length=None)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("res")
    df = fake_results()
    df.write_parquet(d / "results.parquet")
    return df, d / "results.parquet"


@pytest.fixture(scope="module")
def built(results, tmp_path_factory):
    df, path = results
    out = tmp_path_factory.mktemp("report")
    groups = _fake_groups()
    groups.write_parquet(out.parent / "groups.parquet")
    md = build_report(path, out, n_boot=300, seed=1, groups_path=out.parent / "groups.parquet",
                      command="forcedweight report results.parquet --out report")
    return df, out, md, groups


def _fake_groups():
    rng = np.random.default_rng(3)
    recs = []
    for s in (4, 8):
        for g in (2, 3):
            for i in range(40):
                ct = 1 + rng.exponential(0.05 * g)
                recs.append(dict(model="m1", s=s, g=g, cost_top=ct, cost_pool=ct * (1 + rng.exponential(0.1))))
    return pl.DataFrame(recs)


def _pooled(df, s):
    return df.filter((pl.col("s") == s) & (pl.col("status") != "invalid"))


def test_tables_and_figures_written(built):
    _, out, md, _ = built
    for name in ("status_counts", "medians", "bounds", "substitution", "prediction", "groups"):
        for ext in ("csv", "parquet"):
            assert (out / "tables" / f"{name}.{ext}").stat().st_size > 0
        assert pl.read_csv(out / "tables" / f"{name}.csv").height == pl.read_parquet(out / "tables" / f"{name}.parquet").height
    for name in ("cdf_closable_share_m1", "roc_dropped_mass_m1", "selector_ratios_m1", "pi_vs_s", "group_cost_m1"):
        for ext in ("png", "pdf"):
            assert (out / "figures" / f"{name}.{ext}").stat().st_size > 1000
    text = md.read_text()
    assert "forcedweight report results.parquet --out report" in text
    assert "figures/roc_dropped_mass_m1.png" in text and "tables/medians.csv" in text
    assert not list(out.rglob(".*.tmp"))  # atomic writes leave no temporaries


def test_pooled_medians_match_direct(built):
    df, out, _, _ = built
    med = pl.read_parquet(out / "tables" / "medians.parquet")
    for s in (4, 8):
        v = _pooled(df, s)
        kappa = ((v["es_top"] - v["es_best"]) / v["es_top"]).to_numpy()
        row = med.filter((pl.col("scope") == "pooled") & (pl.col("s") == s) & (pl.col("metric") == "closable_share"))
        assert row["median"][0] == pytest.approx(np.median(kappa), abs=1e-15)
        ci = st.bootstrap_median_ci(kappa, n_boot=300, seed=1)
        assert (row["ci_lo"][0], row["ci_hi"][0]) == pytest.approx((ci.lo, ci.hi), abs=1e-15)
        ratio = med.filter((pl.col("scope") == "pooled") & (pl.col("s") == s) & (pl.col("metric") == "ratio_leverage"))
        assert ratio["median"][0] == pytest.approx(np.median((v["es_leverage"] / v["es_best"]).to_numpy()), rel=1e-12)
        pi = med.filter((pl.col("scope") == "pooled") & (pl.col("s") == s) & (pl.col("metric") == "pi_top"))
        assert pi["median"][0] == pytest.approx(float(v["pi_top"].median()), rel=1e-12)
    # one row per family and metric: 2 layers x 1 head x 2 budgets families + 2 pooled
    assert med.filter(pl.col("metric") == "swaps").height == 4 + 2


def test_counts_bounds_prediction_match_direct(built):
    df, out, _, _ = built
    counts = pl.read_parquet(out / "tables" / "status_counts.parquet").filter(pl.col("scope") == "pooled")
    bounds = pl.read_parquet(out / "tables" / "bounds.parquet").filter(pl.col("scope") == "pooled")
    pred = pl.read_parquet(out / "tables" / "prediction.parquet").filter(pl.col("scope") == "pooled")
    for s in (4, 8):
        all_s = df.filter(pl.col("s") == s)
        c = counts.filter(pl.col("s") == s).row(0, named=True)
        for status in ("optimal", "improved", "unsolved", "invalid"):
            assert c[f"n_{status}"] == (all_s["status"] == status).sum()
        v = _pooled(df, s)
        b = bounds.filter(pl.col("s") == s).row(0, named=True)
        k = int(v["status"].is_in(["improved", "unsolved"]).sum())
        ref = sps.binomtest(k, v.height).proportion_ci(method="wilson")
        assert b["improved_share_wilson_hi"] == pytest.approx(ref.high, abs=1e-12)
        # rows not proved optimal (unsolved, improved) at their proved bound, never above es_best
        lb = np.where(v["status"].is_in(["unsolved", "improved"]), np.minimum(v["lower_bound"], v["es_best"]),
                      v["es_best"])
        pess = (v["es_top"].to_numpy() - lb) / v["es_top"].to_numpy()
        assert b["median_kappa_wilson_upper"] == st.wilson_median_upper_bound(pess)[0]
        assert b["median_kappa_wilson_upper"] >= b["median_kappa_pessimistic"]
        # its exact coverage for n rows, from the binomial formula directly
        j = st.wilson_median_rank(len(pess))
        exact = sum(math.comb(len(pess), i) for i in range(j)) / 2 ** len(pess)
        assert b["median_kappa_wilson_coverage"] == pytest.approx(exact, rel=1e-12)
        p = pred.filter(pl.col("s") == s).row(0, named=True)
        kappa = ((v["es_top"] - v["es_best"]) / v["es_top"]).to_numpy()
        hard = kappa > 0.05
        dm = v["dropped_mass"].to_numpy()
        u = sps.mannwhitneyu(dm[hard], dm[~hard]).statistic
        assert p["auc"] == pytest.approx(u / (hard.sum() * (~hard).sum()), abs=1e-12)
        assert p["spearman_rho"] == pytest.approx(sps.spearmanr(dm, v["es_pool"].to_numpy()).statistic, abs=1e-12)
        assert (p["n_hard"], p["n_easy"]) == (hard.sum(), (~hard).sum())


def test_group_table_matches_direct(built):
    _, out, md, groups = built
    t = pl.read_parquet(out / "tables" / "groups.parquet")
    assert t.height == 4
    for r in t.iter_rows(named=True):
        part = groups.filter((pl.col("s") == r["s"]) & (pl.col("g") == r["g"]))
        assert r["cost_top_median"] == pytest.approx(float(part["cost_top"].median()), rel=1e-12)
        assert r["cost_pool_median"] == pytest.approx(float(part["cost_pool"].median()), rel=1e-12)
        assert r["cost_top_lo"] <= r["cost_top_median"] <= r["cost_top_hi"]
    assert "Group voting" in md.read_text()


def test_report_reproducible_and_directory_input(results, tmp_path):
    df, path = results
    d = tmp_path / "dir"
    d.mkdir()
    df.head(70).write_parquet(d / "a.parquet")
    df.slice(70).write_parquet(d / "b.parquet")
    t1 = compute_tables(load_results(path), n_boot=100, seed=5)
    t2 = compute_tables(load_results(d), n_boot=100, seed=5)
    for name in t1:
        assert t1[name].equals(t2[name]), name


def test_cdf_figure_without_finite_values_has_no_legend_and_no_warning():
    # every row invalid (κ all NaN): the report used to print matplotlib's "No artists with labels" warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = figures.cdf_figure({8: np.array([np.nan, np.nan])}, "m")
    assert fig.axes[0].get_legend() is None and len(fig.axes[0].get_lines()) == 0


def test_figures_have_expected_axes():
    rng = np.random.default_rng(0)
    fig = figures.cdf_figure({4: rng.random(20), 8: rng.random(20)}, "m")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "closable share κ" and ax.get_ylabel() == "fraction of rows ≤ κ"
    assert len(ax.get_lines()) == 2
    assert fig.get_size_inches()[0] == pytest.approx(3.3)
    y = rng.random(50) < 0.4
    s = rng.random(50) + y
    fpr, tpr = st.roc_curve(s, y)
    fig = figures.roc_figure({8: (fpr, tpr, 0.8)}, "m", 0.05)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("false positive rate", "true positive rate")
    assert "AUC 0.80" in ax.get_legend().get_texts()[0].get_text()
    fig = figures.selector_figure({"top-mass": {4: 1 + rng.random(10)}, "leverage": {4: 5 + rng.random(10)}}, "m")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "E(selector) / ES*"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["top-mass", "leverage"]
    med = pl.DataFrame({"model": ["m", "m"], "s": [4, 8], "median": [1.1, 1.3], "ci_lo": [1.0, 1.2], "ci_hi": [1.2, 1.5]})
    ax = figures.pi_figure(med).axes[0]
    assert ax.get_xlabel() == "budget s (kept keys)" and ax.get_ylabel() == "median π (top-mass)"
    from forcedweight.report import group_summary

    ax = figures.groups_figure(group_summary(_fake_groups(), n_boot=20), "m1").axes[0]
    assert ax.get_xlabel().startswith("group size g") and ax.get_ylabel() == "median cost (×)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "3"]
    assert len(ax.get_legend().get_texts()) == 4  # 2 budgets x (own top-mass, ES_pool)


def test_family_with_one_row_gives_nan_with_note(tmp_path):
    df = fake_results(n_per=12, layers=(0,), s_values=(4,), seed=2)
    df = df.filter(pl.col("status") == "optimal")
    lonely = df.head(1).with_columns(pl.lit(7, dtype=pl.Int64).alias("layer"))
    pl.concat([df, lonely]).write_parquet(tmp_path / "r.parquet")
    md = build_report(tmp_path / "r.parquet", tmp_path / "out", n_boot=50)
    med = pl.read_parquet(tmp_path / "out" / "tables" / "medians.parquet")
    row = med.filter((pl.col("layer") == 7) & (pl.col("metric") == "closable_share")).row(0, named=True)
    assert row["n"] == 1 and np.isnan(row["ci_lo"]) and "no interval" in row["note"]
    pred = pl.read_parquet(tmp_path / "out" / "tables" / "prediction.parquet").filter(pl.col("layer") == 7)
    assert np.isnan(pred["auc"][0]) and "AUC undefined" in pred["note"][0]
    bounds = pl.read_parquet(tmp_path / "out" / "tables" / "bounds.parquet").filter(pl.col("layer") == 7)
    assert np.isnan(bounds["median_kappa_wilson_upper"][0]) and "too small" in bounds["note"][0]
    assert md.exists()


def test_family_of_invalid_rows_only(tmp_path):
    df = fake_results(n_per=8, layers=(0,), s_values=(4,), seed=3)
    nulls = [pl.lit(None, dtype=pl.Float64).alias(c) for c in ("es_top", "es_balance", "es_pool", "es_best", "dropped_mass")]
    bad = df.head(3).with_columns(pl.lit(9, dtype=pl.Int64).alias("layer"), pl.lit("invalid").alias("status"), *nulls)
    pl.concat([df, bad]).write_parquet(tmp_path / "r.parquet")
    tables = compute_tables(load_results(tmp_path / "r.parquet"), n_boot=20)
    b = tables["bounds"].filter(pl.col("layer") == 9).row(0, named=True)
    assert b["n_valid"] == 0 and np.isnan(b["improved_share"]) and b["note"] == "no valid rows"
    m = tables["medians"].filter(pl.col("layer") == 9)
    assert m["median"].is_nan().all() and m["note"].str.contains("no finite values").all()
    assert tables["status_counts"].filter(pl.col("layer") == 9)["n_invalid"][0] == 3


def test_pessimistic_bounds_take_improved_rows_at_their_bound_and_skip_nan_kappa(tmp_path):
    df = fake_results(n_per=9, layers=(0,), s_values=(4,), seed=5).filter(pl.col("status") == "optimal").head(6)
    # two improved rows whose proofs reach only half of es_best, and one row with a null es_top
    df = df.with_columns(
        pl.when(pl.int_range(pl.len()) < 2).then(pl.lit("improved")).otherwise(pl.col("status")).alias("status"),
        pl.when(pl.int_range(pl.len()) < 2).then(pl.col("es_best") / 2).otherwise(pl.col("lower_bound")).alias("lower_bound"),
        pl.when(pl.int_range(pl.len()) == 5).then(None).otherwise(pl.col("es_top")).alias("es_top"))
    df.write_parquet(tmp_path / "r.parquet")
    b = compute_tables(load_results(tmp_path / "r.parquet"), n_boot=20)["bounds"].row(0, named=True)
    v = df.head(5)
    lb = np.where(np.arange(5) < 2, v["es_best"].to_numpy() / 2, v["es_best"].to_numpy())
    pess = (v["es_top"].to_numpy() - lb) / v["es_top"].to_numpy()
    # the median was NaN with a null es_top among the rows (the Wilson bound left it out already)
    assert b["median_kappa_pessimistic"] == pytest.approx(np.median(pess), rel=1e-12)
    assert b["median_kappa_wilson_upper"] == st.wilson_median_upper_bound(pess)[0]


def test_undefined_ratios_and_recoveries_are_excluded_with_notes():
    df = fake_results(n_per=20, layers=(0,), s_values=(4,), seed=4).filter(pl.col("status") == "optimal")
    top, best, bal = (df[c].to_numpy().copy() for c in ("es_top", "es_best", "es_balance"))
    best[:2] = bal[:2] = top[:2]  # rows 0, 1: top-mass optimal, no gap
    top[2] = best[2] = bal[2] = 0.0  # row 2: ES* = 0 = E(top), no gap either
    df = df.with_columns(pl.Series("es_top", top), pl.Series("es_best", best), pl.Series("es_balance", bal),
                         pl.Series("es_pool", best))
    tables = compute_tables(df, n_boot=20)
    med = tables["medians"].filter(pl.col("scope") == "pooled")
    rec = med.filter(pl.col("metric") == "balancing_recovery").row(0, named=True)
    assert rec["n"] == df.height - 3 and rec["note"] == "3 row(s) with no gap (E(top) = ES*) excluded"
    ratio = med.filter(pl.col("metric") == "ratio_geometric").row(0, named=True)
    assert ratio["n"] == df.height - 1 and ratio["note"] == "1 row(s) with ES* = 0 excluded (ratio undefined)"
    kappa = med.filter(pl.col("metric") == "closable_share").row(0, named=True)
    assert kappa["n"] == df.height and kappa["note"] == ""  # kappa = 0 where E(top) = 0
    assert kappa["median"] == pytest.approx(np.median(np.where(top > 0, (top - best) / np.where(top > 0, top, 1), 0)))


def test_rows_with_nothing_evicted_are_excluded_and_counted(tmp_path):
    df = fake_results(n_per=40, layers=(0,), s_values=(4,), seed=5).filter(pl.col("status") == "optimal")
    n_keys = df["n_keys"].to_numpy().copy()
    top, best = df["es_top"].to_numpy().copy(), df["es_best"].to_numpy().copy()
    n_keys[:5] = 4  # N = s: every key kept, E = 0 for every selector
    top[:5] = best[:5] = 0.0
    df = df.with_columns(pl.Series("n_keys", n_keys), pl.Series("es_top", top), pl.Series("es_best", best),
                         pl.Series("es_pool", best), pl.Series("es_balance", top))
    df.write_parquet(tmp_path / "r.parquet")
    tables = compute_tables(load_results(tmp_path / "r.parquet"), n_boot=20)
    counts = tables["status_counts"].filter(pl.col("scope") == "pooled").row(0, named=True)
    assert counts["n_no_eviction"] == 5 and counts["n_rows"] == df.height
    kappa = tables["medians"].filter((pl.col("scope") == "pooled") & (pl.col("metric") == "closable_share")).row(0, named=True)
    rest = slice(5, None)
    assert kappa["n"] == df.height - 5 and "5 row(s) with N <= s (nothing evicted) excluded" in kappa["note"]
    assert kappa["median"] == pytest.approx(np.median((top[rest] - best[rest]) / top[rest]), rel=1e-12)
    b = tables["bounds"].filter(pl.col("scope") == "pooled").row(0, named=True)
    assert b["n_valid"] == df.height - 5 and "nothing evicted" in b["note"]


def test_missing_provenance_pools_everything(tmp_path):
    fake_results(n_per=10, provenance=False).write_parquet(tmp_path / "r.parquet")
    df = load_results(tmp_path / "r.parquet")
    assert df["model"].unique().to_list() == ["unknown"] and df["layer"].unique().to_list() == [-1]


def test_required_columns_are_certify_output_columns():
    # the report reads what certify writes: a renamed certify column must fail here, not in a user's run
    from forcedweight.certify import OUTPUT_COLUMNS

    assert set(REQUIRED_COLUMNS) <= {name for name, _ in OUTPUT_COLUMNS}


def test_bad_inputs_clear_errors_no_output(results, tmp_path):
    df, _ = results
    df.head(0).write_parquet(tmp_path / "empty.parquet")
    with pytest.raises(InputError, match="empty.parquet: no rows"):
        build_report(tmp_path / "empty.parquet", tmp_path / "o1")
    pl.DataFrame({"weights": [[0.5, 0.5]], "values": [[1.0, 2.0]], "value_dim": [1]}).write_parquet(tmp_path / "rows.parquet")
    with pytest.raises(InputError, match=r"rows.parquet: not certify output \(missing column\(s\) row_id, s, status"):
        build_report(tmp_path / "rows.parquet", tmp_path / "o2")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="junk.parquet: not a readable Parquet"):
        build_report(tmp_path / "junk.parquet", tmp_path / "o3")
    with pytest.raises(InputError, match="hard-threshold"):
        build_report(tmp_path / "rows.parquet", tmp_path / "o4", hard_threshold=1.5)
    # a null budget, a statistic stored as text, an unknown status: one line each (they were polars tracebacks)
    df.with_columns(pl.when(pl.col("row_id") == df["row_id"][3]).then(None).otherwise(pl.col("s")).alias("s")) \
        .write_parquet(tmp_path / "nulls.parquet")
    with pytest.raises(InputError, match="nulls.parquet: row 3 of the certify output has no s"):
        build_report(tmp_path / "nulls.parquet", tmp_path / "o5")
    df.with_columns(pl.col("es_top").cast(pl.Utf8)).write_parquet(tmp_path / "text.parquet")
    with pytest.raises(InputError, match="text.parquet: column es_top holds (large_)?string, not numbers"):
        build_report(tmp_path / "text.parquet", tmp_path / "o6")
    df.with_columns(pl.lit("done").alias("status")).write_parquet(tmp_path / "status.parquet")
    with pytest.raises(InputError, match="unknown status 'done'"):
        build_report(tmp_path / "status.parquet", tmp_path / "o7")
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 8))
    # a results file re-saved with its text columns as categories (polars Categorical) is still certify output
    df.with_columns(pl.col("status").cast(pl.Categorical)).write_parquet(tmp_path / "cat.parquet")
    assert build_report(tmp_path / "cat.parquet", tmp_path / "o8", n_boot=20).is_file()
    assert set(REQUIRED_COLUMNS) <= set(df.columns)


def _cli(argv, monkeypatch, capsys):
    from forcedweight.cli import main

    monkeypatch.setattr(sys, "argv", ["forcedweight", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr()


def test_cli_report(results, tmp_path, monkeypatch, capsys):
    _, path = results
    code, cap = _cli(["report", str(path), "--out", str(tmp_path / "out"), "--n-boot", "50", "--seed", "2"], monkeypatch, capsys)
    assert code == 0 and cap.out.strip().endswith("report.md")
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"forcedweight report {path} --out {tmp_path / 'out'} --n-boot 50 --seed 2" in text
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "other.parquet")
    code, cap = _cli(["report", str(tmp_path / "other.parquet"), "--out", str(tmp_path / "o")], monkeypatch, capsys)
    assert code == 2 and cap.err.count("\n") == 1 and "other.parquet: not certify output" in cap.err


def test_cluster_intervals_auc_thresholds_family_spearman_match_direct(tmp_path):
    from forcedweight.report.tables import AUC_THRESHOLDS

    df = fake_results(n_per=24, layers=(0, 1, 2), s_values=(4,), seed=8).filter(pl.col("status") == "optimal")
    df.write_parquet(tmp_path / "r.parquet")
    loaded = load_results(tmp_path / "r.parquet")
    tables = compute_tables(loaded, n_boot=50, seed=2)
    top, best = loaded["es_top"].to_numpy(), loaded["es_best"].to_numpy()
    kappa = np.where(top == 0, 0.0, (top - best) / top)
    med = tables["medians"].filter((pl.col("scope") == "pooled") & (pl.col("metric") == "closable_share")).row(0, named=True)
    texts = np.array([f"m1:{t}" for t in loaded["text_id"]])
    fams = np.array([f"m1:{l}:{h}" for l, h in zip(loaded["layer"], loaded["head"])])
    for name, lab in (("text", texts), ("family", fams)):
        ref = st.cluster_bootstrap_median_ci(kappa, lab, n_boot=50, seed=2)
        assert med[f"ci_lo_{name}"] == pytest.approx(ref.lo, abs=1e-15)
        assert med[f"ci_hi_{name}"] == pytest.approx(ref.hi, abs=1e-15)
    fam_med = tables["medians"].filter((pl.col("scope") == "family") & (pl.col("metric") == "closable_share"))
    assert fam_med["ci_lo_text"].is_nan().all()  # cluster intervals only on pooled rows
    pred = tables["prediction"].filter(pl.col("scope") == "pooled").row(0, named=True)
    dm = loaded["dropped_mass"].to_numpy()
    checked = 0
    for t in AUC_THRESHOLDS:
        hard = kappa > t
        if 0 < hard.sum() < hard.size:  # Mann-Whitney directly
            direct = sps.mannwhitneyu(dm[hard], dm[~hard]).statistic / (hard.sum() * (~hard).sum())
            assert pred[f"auc_hard_{t:g}"] == pytest.approx(direct, rel=1e-12)
            checked += 1
    assert checked >= 2
    rhos = [sps.spearmanr(dm[loaded["layer"].to_numpy() == l], loaded["es_pool"].to_numpy()[loaded["layer"].to_numpy() == l]).statistic
            for l in (0, 1, 2)]
    assert pred["spearman_family_median"] == pytest.approx(np.median(rhos), rel=1e-12)
    assert pred["spearman_families"] == 3


def test_single_s_report_no_pi_curve_missing_selectors_left_out(tmp_path):
    df = fake_results(n_per=20, layers=(0,), s_values=(4,), seed=11)
    df = df.with_columns(pl.lit(None, dtype=pl.Float64).alias("es_quest"))  # no row has Quest's inputs
    df.write_parquet(tmp_path / "r.parquet")
    md = build_report(tmp_path / "r.parquet", tmp_path / "out", n_boot=20, command="forcedweight report r.parquet")
    text = md.read_text()
    assert not list((tmp_path / "out" / "figures").glob("pi_vs_s*"))  # one budget: no one-point curve
    assert "pi_vs_s" not in text
    med = pl.read_parquet(tmp_path / "out" / "tables" / "medians.parquet")
    assert "ratio_quest" not in med["metric"].to_list() and "ratio_geometric" in med["metric"].to_list()
    assert "Left out (no row has their inputs): `quest`." in text
    assert "## Settings" in text and "numpy " in text and "docs/concepts.md" in text
    for word in ("π = E/EF", "D = dropped mass", "ES_pool", "Balancing recovery", "Family ="):
        assert word in text
    # two budgets: the π-vs-s curve is drawn
    fake_results(n_per=20, layers=(0,), s_values=(4, 8), seed=11).write_parquet(tmp_path / "r2.parquet")
    build_report(tmp_path / "r2.parquet", tmp_path / "out2", n_boot=20, command="x")
    assert list((tmp_path / "out2" / "figures").glob("pi_vs_s*"))
