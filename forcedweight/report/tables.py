"""The report's tables: per family (model, layer, head, s) and pooled per (model, s).

``compute_tables`` returns ``status_counts``, ``medians``, ``bounds``, ``substitution`` and
``prediction`` as polars frames; ``group_summary`` the group-voting table; ``write_table`` writes
one as CSV and Parquet atomically. Row metrics come from ``forcedweight.report.metrics``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from forcedweight.core import stats as st
from forcedweight.errors import InputError
from forcedweight.io import atomic_path, list_parquet_files, open_parquet, write_table_atomic

from forcedweight.report.metrics import KEYS, STATUSES, _np, hard_row_auc, no_eviction, row_metrics, statistic_rows

#: Cluster bootstraps of the pooled medians: resample whole texts, or whole (layer, head) families.
CLUSTERINGS = ("text", "family")
#: Hard-row thresholds at which the dropped-mass AUC is also reported.
AUC_THRESHOLDS = (0.01, 0.05, 0.1, 0.2)


def cluster_labels(valid: pl.DataFrame) -> dict[str, np.ndarray]:
    """Cluster label per row: ``text`` = (model, text_id) when text ids are known; ``family`` =
    (model, layer, head) when there is more than one family. Arrays of shape (n,)."""
    out = {}
    if "text_id" in valid.columns and valid.get_column("text_id").null_count() < valid.height:
        out["text"] = (valid.get_column("model") + ":" + valid.get_column("text_id").cast(pl.Utf8).fill_null("?")).to_numpy()
    fam = (valid.get_column("model") + ":" + valid.get_column("layer").cast(pl.Utf8) + ":"
           + valid.get_column("head").cast(pl.Utf8)).to_numpy()
    if len(set(fam)) > 1:
        out["family"] = fam
    return out


def _group_tables(key: dict, df: pl.DataFrame, hard_threshold: float, n_boot: int, seed: int):
    """All statistics of one group: rows for the counts, medians, bounds, substitution, prediction tables."""
    counts = {s_: int((df.get_column("status") == s_).sum()) for s_ in STATUSES}
    unknown = df.height - sum(counts.values())
    n_no_evict = int(df.filter((pl.col("status") != "invalid") & no_eviction(df)).height)
    count_row = {**key, "n_rows": df.height, **{f"n_{s_}": c for s_, c in counts.items()}, "n_other_status": unknown,
                 "n_no_eviction": n_no_evict}
    valid = statistic_rows(df)
    excluded = f"{n_no_evict} row(s) with N <= s (nothing evicted) excluded" if n_no_evict else ""
    m = row_metrics(df)
    medians = []
    top, best = _np(valid, "es_top"), _np(valid, "es_best")
    defined = np.isfinite(top) & np.isfinite(best)
    pooled = key.get("scope") == "pooled"
    clusters = cluster_labels(valid) if pooled else {}
    for name, values in m.items():
        reason = ""
        keep = np.ones(values.shape, dtype=bool)
        if name == "balancing_recovery":  # undefined where E(top) = ES*: nothing to recover
            nz = int(np.sum(defined & (top - best <= 0)))
            reason = f"{nz} row(s) with no gap (E(top) = ES*) excluded" if nz else ""
            keep = ~(defined & (top - best <= 0))
        elif name.startswith("ratio_"):  # undefined where ES* = 0
            nz = int(np.sum(best == 0))
            reason = f"{nz} row(s) with ES* = 0 excluded (ratio undefined)" if nz else ""
            keep = best != 0
        values = values[keep]
        ci = st.bootstrap_median_ci(values, n_boot=n_boot, seed=seed)
        note = "; ".join(x for x in (excluded, reason, ci.note) if x)
        rec = {**key, "metric": name, "n": ci.n, "median": ci.median, "ci_lo": ci.lo, "ci_hi": ci.hi}
        for cname in CLUSTERINGS:  # cluster bootstrap beside the row bootstrap (pooled rows only)
            lo = hi = np.nan
            if cname in clusters:
                cci = st.cluster_bootstrap_median_ci(values, clusters[cname][keep], n_boot=n_boot, seed=seed)
                lo, hi = cci.lo, cci.hi
            rec[f"ci_lo_{cname}"], rec[f"ci_hi_{cname}"] = lo, hi
        medians.append({**rec, "note": note})

    n_valid = valid.height
    pess = st.pessimistic_closable_share(
        _np(valid, "es_top"), _np(valid, "es_best"), _np(valid, "lower_bound"), valid.get_column("status").to_numpy()
    )
    # rows where the pool and the swaps were beaten, or might be (unsolved): pessimistic
    open_rows = valid.get_column("status").is_in(["improved", "unsolved"])
    if "solver_improved" in valid.columns:
        open_rows = open_rows | valid.get_column("solver_improved").fill_null(False)
    k_open = int(open_rows.sum())
    open_lo, open_hi = st.wilson_interval(k_open, n_valid)
    k_hard = int(np.sum(pess > hard_threshold))
    hard_lo, hard_hi = st.wilson_interval(k_hard, n_valid)
    med_hi, note = st.wilson_upper_median_share(
        _np(valid, "es_top"), _np(valid, "es_best"), _np(valid, "lower_bound"), valid.get_column("status").to_numpy()
    )
    bounds = {
        **key,
        "n_valid": n_valid,
        "improved_share": k_open / n_valid if n_valid else np.nan,
        "improved_share_wilson_lo": open_lo,
        "improved_share_wilson_hi": open_hi,
        "hard_share_pessimistic": k_hard / n_valid if n_valid else np.nan,
        "hard_share_wilson_lo": hard_lo,
        "hard_share_wilson_hi": hard_hi,
        # (a row whose κ is NaN, e.g. a null es_top, is left out here as by the Wilson bound)
        "median_kappa_pessimistic": float(np.median(pess[~np.isnan(pess)])) if np.any(~np.isnan(pess)) else np.nan,
        "median_kappa_wilson_upper": med_hi,
        "median_kappa_wilson_coverage": st.wilson_median_coverage(int(np.sum(~np.isnan(pess)))) if n_valid else np.nan,
        "note": "; ".join(x for x in (excluded, note if n_valid else "no valid rows") if x),
    }
    sub = st.substitution_sensitivity(
        _np(valid, "es_top"), _np(valid, "es_balance"), _np(valid, "es_pool"), _np(valid, "es_best")
    )
    substitution = {**key, **sub, "note": "" if sub["n"] else "no valid rows"}

    auc = hard_row_auc(m, hard_threshold)
    rho = st.spearman(m["dropped_mass"], _np(valid, "es_pool"))
    prediction = {
        **key,
        "hard_threshold": hard_threshold,
        "auc": auc.auc, "auc_lo": auc.lo, "auc_hi": auc.hi, "auc_se": auc.se,
        "n_hard": auc.n_pos, "n_easy": auc.n_neg,
        "spearman_rho": rho.rho, "spearman_p": rho.pvalue, "spearman_n": rho.n,
        **{f"auc_hard_{t:g}": hard_row_auc(m, t).auc for t in AUC_THRESHOLDS},
        "note": "; ".join(x for x in (auc.note, rho.note) if x),
    }
    return count_row, medians, bounds, substitution, prediction


def _iter_groups(df: pl.DataFrame):
    """Yield (key, group) for every family, then every pooled (model, s)."""
    for keys, g in sorted(df.group_by(["model", "layer", "head", "s"]), key=lambda kv: kv[0]):
        yield {"scope": "family", "model": keys[0], "layer": keys[1], "head": keys[2], "s": keys[3]}, g
    for keys, g in sorted(df.group_by(["model", "s"]), key=lambda kv: kv[0]):
        yield {"scope": "pooled", "model": keys[0], "layer": None, "head": None, "s": keys[1]}, g


def _frame(records: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(records, infer_schema_length=None).with_columns(
        pl.col("layer").cast(pl.Int64), pl.col("head").cast(pl.Int64)
    )


def compute_tables(df: pl.DataFrame, hard_threshold: float = 0.05, n_boot: int = 2000, seed: int = 0) -> dict[str, pl.DataFrame]:
    """The report's tables (one DataFrame each) from a loaded results frame; pure computation."""
    out: dict[str, list] = {k: [] for k in ("status_counts", "medians", "bounds", "substitution", "prediction")}
    for key, g in _iter_groups(df):
        c, meds, b, sub, pred = _group_tables(key, g, hard_threshold, n_boot, seed)
        out["status_counts"].append(c)
        out["medians"].extend(meds)
        out["bounds"].append(b)
        out["substitution"].append(sub)
        out["prediction"].append(pred)
    _family_spearman(out["prediction"])
    tables = {k: _frame(v) for k, v in out.items()}
    # selectors whose inputs are missing everywhere (all-NaN ratios) are left out, not shown as NaN rows
    med = tables["medians"]
    ratio = med.filter(pl.col("metric").str.starts_with("ratio_"))
    empty = sorted(set(ratio.group_by("metric").agg(pl.col("n").max().alias("n")).filter(pl.col("n") == 0)["metric"].to_list()))
    if empty:
        tables["medians"] = med.filter(~pl.col("metric").is_in(empty))
    tables["left_out"] = pl.DataFrame({"metric": empty, "reason": ["no row has this selector's inputs (all null)"] * len(empty)},
                                      schema={"metric": pl.Utf8, "reason": pl.Utf8})
    return tables


def _family_spearman(prediction: list[dict]) -> None:
    """Add to each pooled prediction row the median over its families (same model and s) of their
    Spearman(D, ES_pool) (``spearman_family_median``, finite ones only; ``spearman_families`` counts
    them); NaN on family rows."""
    for rec in prediction:
        rec["spearman_family_median"], rec["spearman_families"] = np.nan, 0
        if rec["scope"] != "pooled":
            continue
        rhos = [r["spearman_rho"] for r in prediction if r["scope"] == "family" and r["model"] == rec["model"]
                and r["s"] == rec["s"] and np.isfinite(r["spearman_rho"])]
        if rhos:
            rec["spearman_family_median"], rec["spearman_families"] = float(np.median(rhos)), len(rhos)

def group_summary(gdf: pl.DataFrame, n_boot: int = 2000, seed: int = 0) -> pl.DataFrame:
    """Median group-voting cost (over own top-mass error and over ES_pool) with intervals, by (model, s, g)."""
    recs = []
    for (model, s, g), part in sorted(gdf.group_by(["model", "s", "g"]), key=lambda kv: kv[0]):
        top = st.bootstrap_median_ci(_np(part, "cost_top"), n_boot=n_boot, seed=seed)
        pool = st.bootstrap_median_ci(_np(part, "cost_pool"), n_boot=n_boot, seed=seed)
        note = "; ".join(f"{n}: {x}" for n, x in (("cost_top", top.note), ("cost_pool", pool.note)) if x)
        recs.append({
            "model": model, "s": s, "g": g, "n": part.height,
            "cost_top_median": top.median, "cost_top_lo": top.lo, "cost_top_hi": top.hi,
            "cost_pool_median": pool.median, "cost_pool_lo": pool.lo, "cost_pool_hi": pool.hi,
            "note": note,
        })
    return pl.DataFrame(recs, infer_schema_length=None)


def write_table(df: pl.DataFrame, base: Path, metadata: dict[bytes, bytes] | None = None) -> list[Path]:
    """Write ``base.csv`` and ``base.parquet`` atomically; ``metadata`` goes into the Parquet schema."""
    csv, parquet = base.with_suffix(".csv"), base.with_suffix(".parquet")
    with atomic_path(csv) as tmp:
        df.write_csv(tmp)
    table = df.to_arrow()
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    write_table_atomic(table, parquet)
    return [csv, parquet]

