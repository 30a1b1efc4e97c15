"""Paper-ready tables, figures and ``report.md`` from the output of ``certify`` (SPEC §5, §7).

``build_report`` reads a results file or directory (only the columns it needs, through
``polars.scan_parquet``), groups rows by family ``(model, layer, head, s)`` and pooled per
``(model, s)``, and writes under ``out_dir``:

- ``tables/<name>.csv`` and ``tables/<name>.parquet`` for ``status_counts``, ``medians``,
  ``bounds``, ``substitution``, ``prediction`` and (with ``groups_path``) ``groups``;
- ``figures/<name>.png`` and ``.pdf`` (see ``forcedweight.figures``);
- ``report.md`` with the headline numbers pooled per (model, s) and the command that ran.

Every write is atomic. Statistics that are undefined for a small family are ``NaN`` with a
``note``; unusable input (missing file, empty results, columns of another tool) raises
``InputError`` before anything is written.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from forcedweight import stats as st
from forcedweight.rows import InputError, atomic_path, list_parquet_files, open_parquet, write_table_atomic

#: Columns of ``certify`` output that the report needs; missing ones mean another tool/version.
REQUIRED_COLUMNS = (
    "row_id", "s", "status", "es_top", "es_balance", "swaps", "es_pool", "es_best",
    "lower_bound", "dropped_mass", "pi_top",
)
#: Provenance columns; absent ones are filled (model "unknown", layer/head -1).
FAMILY_COLUMNS = ("model", "layer", "head")
STATUSES = ("optimal", "improved", "unsolved", "invalid")
#: ``es_*`` columns that are not selectors.
NOT_SELECTORS = ("es_pool", "es_best")
#: Columns of ``forcedweight groups`` output that the report needs.
GROUP_COLUMNS = ("model", "s", "g", "cost_top", "cost_pool")
KEYS = ["scope", "model", "layer", "head", "s"]


def _check_files(path, required: Sequence[str], what: str) -> list[Path]:
    files = list_parquet_files(path)
    total = 0
    for f in files:
        pf = open_parquet(f)
        missing = [c for c in required if c not in pf.schema_arrow.names]
        if missing:
            raise InputError(
                f"{f}: not {what} output (missing column(s) {', '.join(missing)}); "
                f"was it written by another tool or version?"
            )
        total += pf.metadata.num_rows
    if total == 0:
        raise InputError(f"{path}: no rows (empty {what} output)")
    return files


def load_results(path: str | os.PathLike) -> pl.DataFrame:
    """Read the columns the report needs from ``certify`` output (a file or a directory).

    Returns a DataFrame with ``model`` (str), ``layer``, ``head``, ``s``, ``row_id`` (Int64),
    ``status`` (str) and the ``es_*``/statistic columns as Float64.
    """
    files = _check_files(path, REQUIRED_COLUMNS, "certify")
    frames = []
    for f in files:
        lf = pl.scan_parquet(f)
        names = lf.collect_schema().names()
        sel = [c for c in names if c in REQUIRED_COLUMNS or c in FAMILY_COLUMNS or c.startswith("es_") or c in ("pi_best", "solver_improved")]
        frames.append(lf.select(sel))
    df = pl.concat(frames, how="diagonal_relaxed").collect()
    fill = {"model": pl.lit("unknown"), "layer": pl.lit(-1), "head": pl.lit(-1)}
    df = df.with_columns([fill[c].alias(c) for c in FAMILY_COLUMNS if c not in df.columns])
    floats = [c for c in df.columns if c.startswith("es_") or c in ("swaps", "lower_bound", "dropped_mass", "pi_top", "pi_best")]
    return df.with_columns(
        pl.col("model").cast(pl.Utf8).fill_null("unknown"),
        pl.col("layer").cast(pl.Int64).fill_null(-1),
        pl.col("head").cast(pl.Int64).fill_null(-1),
        pl.col("s").cast(pl.Int64),
        pl.col("row_id").cast(pl.Int64),
        pl.col("status").cast(pl.Utf8),
        *[pl.col(c).cast(pl.Float64) for c in floats],
    )


def selector_columns(df: pl.DataFrame) -> list[str]:
    """``es_*`` columns that hold a selector's error (top, balance, geometric, leverage, ...)."""
    return [c for c in df.columns if c.startswith("es_") and c not in NOT_SELECTORS]


def _np(df: pl.DataFrame, col: str) -> np.ndarray:
    return df.get_column(col).to_numpy().astype(np.float64)


def row_metrics(df: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per-row statistics of the valid (non-``invalid``) rows of one group, float64 arrays (n,)."""
    valid = df.filter(pl.col("status") != "invalid")
    top, bal, best = _np(valid, "es_top"), _np(valid, "es_balance"), _np(valid, "es_best")
    out = {
        "closable_share": st.closable_share(top, best),
        "balancing_recovery": st.balancing_recovery(top, bal, best),
        "swaps": _np(valid, "swaps"),
        "pi_top": _np(valid, "pi_top"),
        "dropped_mass": _np(valid, "dropped_mass"),
    }
    if "pi_best" in df.columns:
        out["pi_best"] = _np(valid, "pi_best")
    for col in selector_columns(df):
        out["ratio_" + col[3:]] = st.selector_ratio(_np(valid, col), best)
    return out


def _group_tables(key: dict, df: pl.DataFrame, hard_threshold: float, n_boot: int, seed: int):
    """All statistics of one group: rows for the counts, medians, bounds, substitution, prediction tables."""
    counts = {s_: int((df.get_column("status") == s_).sum()) for s_ in STATUSES}
    unknown = df.height - sum(counts.values())
    count_row = {**key, "n_rows": df.height, **{f"n_{s_}": c for s_, c in counts.items()}, "n_other_status": unknown}
    valid = df.filter(pl.col("status") != "invalid")
    m = row_metrics(df)
    medians = []
    top, best = _np(valid, "es_top"), _np(valid, "es_best")
    defined = np.isfinite(top) & np.isfinite(best)
    for name, values in m.items():
        reason = ""
        if name == "balancing_recovery":  # undefined where E(top) = ES*: nothing to recover
            nz = int(np.sum(defined & (top - best <= 0)))
            reason = f"{nz} row(s) with no gap (E(top) = ES*) excluded" if nz else ""
            values = values[~(defined & (top - best <= 0))]
        elif name.startswith("ratio_"):  # undefined where ES* = 0
            nz = int(np.sum(best == 0))
            reason = f"{nz} row(s) with ES* = 0 excluded (ratio undefined)" if nz else ""
            values = values[best != 0]
        ci = st.bootstrap_median_ci(values, n_boot=n_boot, seed=seed)
        note = "; ".join(x for x in (reason, ci.note) if x)
        medians.append({**key, "metric": name, "n": ci.n, "median": ci.median, "ci_lo": ci.lo, "ci_hi": ci.hi, "note": note})

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
        "median_kappa_pessimistic": float(np.median(pess)) if n_valid else np.nan,
        "median_kappa_wilson_upper": med_hi,
        "note": note if n_valid else "no valid rows",
    }
    sub = st.substitution_sensitivity(
        _np(valid, "es_top"), _np(valid, "es_balance"), _np(valid, "es_pool"), _np(valid, "es_best")
    )
    substitution = {**key, **sub, "note": "" if sub["n"] else "no valid rows"}

    kappa = m["closable_share"]
    hard = kappa > hard_threshold
    auc = st.auc_mann_whitney(m["dropped_mass"][np.isfinite(kappa)], hard[np.isfinite(kappa)])
    rho = st.spearman(m["dropped_mass"], _np(valid, "es_pool"))
    prediction = {
        **key,
        "hard_threshold": hard_threshold,
        "auc": auc.auc, "auc_lo": auc.lo, "auc_hi": auc.hi, "auc_se": auc.se,
        "n_hard": auc.n_pos, "n_easy": auc.n_neg,
        "spearman_rho": rho.rho, "spearman_p": rho.pvalue, "spearman_n": rho.n,
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
    return {k: _frame(v) for k, v in out.items()}


def load_groups(path: str | os.PathLike) -> pl.DataFrame:
    """Read ``forcedweight groups`` output (a file or a directory)."""
    files = _check_files(path, GROUP_COLUMNS, "forcedweight groups")
    df = pl.concat([pl.scan_parquet(f).select(GROUP_COLUMNS) for f in files], how="vertical_relaxed").collect()
    return df.with_columns(
        pl.col("model").cast(pl.Utf8), pl.col("s").cast(pl.Int64), pl.col("g").cast(pl.Int64),
        pl.col("cost_top").cast(pl.Float64), pl.col("cost_pool").cast(pl.Float64),
    )


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


def write_table(df: pl.DataFrame, base: Path) -> list[Path]:
    """Write ``base.csv`` and ``base.parquet`` atomically."""
    csv, parquet = base.with_suffix(".csv"), base.with_suffix(".parquet")
    with atomic_path(csv) as tmp:
        df.write_csv(tmp)
    write_table_atomic(df.to_arrow(), parquet)
    return [csv, parquet]


def default_command() -> str:
    """The command line of this process, quoted (used when the caller gives none)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(("forcedweight", "__main__.py")):
        argv[0] = "forcedweight"
    return shlex.join(argv)


def build_report(
    results_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    hard_threshold: float = 0.05,
    groups_path: str | os.PathLike | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    command: str | None = None,
) -> Path:
    """Compute every table and figure from ``certify`` output and write them under ``out_dir``.

    Parameters
    ----------
    results_path : a results Parquet file or a directory of them.
    out_dir : created if needed; ``tables/``, ``figures/`` and ``report.md`` go inside.
    hard_threshold : a row is hard when its closable share exceeds this (for the ROC/AUC).
    groups_path : optional output of ``forcedweight groups`` (adds the group-voting table/figure).
    n_boot, seed : bootstrap resamples and seed (the same seed gives the same intervals).
    command : the command line recorded in ``report.md`` (default: this process's argv).

    Returns
    -------
    Path of ``report.md``.
    """
    from forcedweight import figures

    if not 0 <= hard_threshold < 1:
        raise InputError(f"--hard-threshold: {hard_threshold} is outside [0, 1)")
    if n_boot < 1:
        raise InputError(f"--n-boot: {n_boot} must be >= 1")
    df = load_results(results_path)
    gdf = load_groups(groups_path) if groups_path is not None else None
    tables = compute_tables(df, hard_threshold, n_boot, seed)
    if gdf is not None:
        tables["groups"] = group_summary(gdf, n_boot, seed)

    out = Path(out_dir)
    tdir, fdir = out / "tables", out / "figures"
    for d in (tdir, fdir):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--out: cannot create {d} ({exc.strerror or exc})") from None
    written_tables = {name: write_table(t, tdir / name) for name, t in tables.items()}
    written_figures = figures.write_all(df, tables, fdir, hard_threshold)
    text = render_markdown(
        tables, out, written_tables, written_figures, results_path, groups_path,
        command or default_command(), hard_threshold, n_boot, seed,
    )
    target = out / "report.md"
    with atomic_path(target) as tmp:
        Path(tmp).write_text(text)
    return target


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "NaN"
    return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _ci(m, lo, hi) -> str:
    return f"{_fmt(m)} [{_fmt(lo)}, {_fmt(hi)}]"


def render_markdown(tables, out, written_tables, written_figures, results_path, groups_path,
                    command, hard_threshold, n_boot, seed) -> str:
    """``report.md``: headline table pooled per (model, s), then links and the command."""
    pooled = {name: t.filter(pl.col("scope") == "pooled") for name, t in tables.items() if "scope" in t.columns}
    med = pooled["medians"]

    def metric(model, s, name):
        r = med.filter((pl.col("model") == model) & (pl.col("s") == s) & (pl.col("metric") == name))
        return _ci(r["median"][0], r["ci_lo"][0], r["ci_hi"][0]) if r.height else "NaN"

    lines = [
        "# forcedweight report", "",
        f"Results: `{results_path}`" + (f"; groups: `{groups_path}`" if groups_path else ""), "",
        "Medians with percentile-bootstrap 95% intervals "
        f"({n_boot} resamples, seed {seed}); hard = closable share > {hard_threshold}.", "",
        "## Headline numbers (pooled per model and budget)", "",
        "| model | s | rows (opt/impr/unsolved/invalid) | median κ [95% CI] | κ median Wilson upper (pessimistic) "
        "| Δ median κ, pool → best | solver-improved + unsolved share (Wilson hi) "
        "| balancing recovery | π (top) | AUC dropped mass → hard [95% CI] | Spearman(D, ES_pool) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    counts, bounds, pred, subst = pooled["status_counts"], pooled["bounds"], pooled["prediction"], pooled["substitution"]
    for c in counts.iter_rows(named=True):
        model, s = c["model"], c["s"]
        b = bounds.filter((pl.col("model") == model) & (pl.col("s") == s)).row(0, named=True)
        p = pred.filter((pl.col("model") == model) & (pl.col("s") == s)).row(0, named=True)
        d = subst.filter((pl.col("model") == model) & (pl.col("s") == s)).row(0, named=True)
        lines.append(
            f"| {model} | {s} | {c['n_rows']} ({c['n_optimal']}/{c['n_improved']}/{c['n_unsolved']}/{c['n_invalid']}) "
            f"| {metric(model, s, 'closable_share')} | {_fmt(b['median_kappa_wilson_upper'])} "
            f"| {_fmt(d['delta_median_kappa'])} | {_fmt(b['improved_share'])} ({_fmt(b['improved_share_wilson_hi'])}) "
            f"| {metric(model, s, 'balancing_recovery')} | {metric(model, s, 'pi_top')} "
            f"| {_ci(p['auc'], p['auc_lo'], p['auc_hi'])} | {_fmt(p['spearman_rho'])} |"
        )
    if "groups" in tables and tables["groups"].height:
        lines += ["", "## Group voting (shared kept set per KV group)", "",
                  "| model | s | g | rows | cost / own top-mass [95% CI] | cost / ES_pool [95% CI] |", "|---|---|---|---|---|---|"]
        for r in tables["groups"].iter_rows(named=True):
            lines.append(
                f"| {r['model']} | {r['s']} | {r['g']} | {r['n']} | {_ci(r['cost_top_median'], r['cost_top_lo'], r['cost_top_hi'])} "
                f"| {_ci(r['cost_pool_median'], r['cost_pool_lo'], r['cost_pool_hi'])} |"
            )
    lines += ["", "## Tables", ""]
    for name, paths in written_tables.items():
        lines.append(f"- {name}: " + ", ".join(f"[{p.name}]({p.relative_to(out).as_posix()})" for p in paths))
    lines += ["", "## Figures", ""]
    for name, paths in written_figures.items():
        png = [p for p in paths if p.suffix == ".png"]
        lines.append(f"- {name}: " + ", ".join(f"[{p.name}]({p.relative_to(out).as_posix()})" for p in paths))
        if png:
            lines.append(f"  ![{name}]({png[0].relative_to(out).as_posix()})")
    lines += ["", "## Definitions", "",
              "- κ = (E(top) − ES*)/E(top), ES* = best known value (solver improvements substituted); 0 when E(top) = 0.",
              "- Pessimistic κ: unsolved rows take ES* = their proved lower bound (1 when none), i.e. counted as improved "
              "as far as the proof allows; the Wilson upper bound is the smallest observed κ whose share of rows at or "
              "below it has a Wilson 95% lower end ≥ 1/2.",
              "- Selector ratio E(selector)/ES*; rows with ES* = 0 excluded and counted in the note.",
              "- AUC = Mann–Whitney U/(n_hard·n_easy) of the top-mass dropped mass, ties half; DeLong 95% interval.",
              "", "## Command", "", "```", command, "```", ""]
    return "\n".join(lines)
