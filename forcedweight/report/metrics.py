"""Loading ``certify`` and ``groups`` output, and the per-row metrics every table and figure uses.

``row_metrics`` is the one place where a results frame becomes closable share, balancing recovery,
π and selector ratios (through ``forcedweight.core.stats``), so the tables and the figures never
compute them twice; ``hard_row_auc`` is the one dropped-mass → hard-row AUC/ROC.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from forcedweight.core import stats as st
from forcedweight.errors import InputError
from forcedweight.io import atomic_path, check_column_types, list_parquet_files, open_parquet, read_guard, write_table_atomic

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
TEXT_COLUMNS = ("status", "model")  # the other required columns hold numbers


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
        check_column_types(f, pf.schema_arrow, {c: "text" if c in TEXT_COLUMNS else "numbers" for c in required},
                           "; was it written by another tool or version?")
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
        sel = [c for c in names if c in REQUIRED_COLUMNS or c in FAMILY_COLUMNS or c.startswith("es_") or c in ("pi_best", "solver_improved", "n_keys", "text_id")]
        frames.append(lf.select(sel))
    with read_guard(path):
        df = pl.concat(frames, how="diagonal_relaxed").collect()
    fill = {"model": pl.lit("unknown"), "layer": pl.lit(-1), "head": pl.lit(-1)}
    df = df.with_columns([fill[c].alias(c) for c in FAMILY_COLUMNS if c not in df.columns])
    floats = [c for c in df.columns if c.startswith("es_") or c in ("swaps", "lower_bound", "dropped_mass", "pi_top", "pi_best")]
    for c in ("n_keys", "text_id"):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias(c))
    for c in ("row_id", "s", "status"):  # every row needs these (the other columns may be null)
        if df.get_column(c).null_count():
            i = int(df.get_column(c).is_null().arg_max())
            raise InputError(f"{path}: row {i} of the certify output has no {c}")
    bad = df.filter(~pl.col("status").cast(pl.Utf8).is_in(STATUSES))
    if bad.height:
        raise InputError(f"{path}: unknown status {bad.get_column('status')[0]!r} (known: {', '.join(STATUSES)})")
    return df.with_columns(
        pl.col("n_keys").cast(pl.Int64),
        pl.col("text_id").cast(pl.Int64),
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


def no_eviction(df: pl.DataFrame) -> pl.Expr:
    """Rows where nothing can be evicted (``n_keys <= s``: every key is kept, κ = 0 by construction)."""
    if "n_keys" not in df.columns:
        return pl.lit(False)
    return pl.col("n_keys").is_not_null() & (pl.col("n_keys") <= pl.col("s"))


def statistic_rows(df: pl.DataFrame) -> pl.DataFrame:
    """The rows every statistic is computed on: not ``invalid``, and something evicted (N > s).

    Rows with N <= s keep every key (E = 0 for every selector) and would enter the medians as
    κ = 0; they are excluded and counted (``n_no_eviction`` in ``status_counts``).
    """
    return df.filter((pl.col("status") != "invalid") & ~no_eviction(df))


def row_metrics(df: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per-row statistics of ``statistic_rows(df)`` (valid, N > s) of one group, float64 arrays (n,)."""
    valid = statistic_rows(df)
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

def load_groups(path: str | os.PathLike) -> pl.DataFrame:
    """Read ``forcedweight groups`` output (a file or a directory)."""
    files = _check_files(path, GROUP_COLUMNS, "forcedweight groups")
    with read_guard(path):
        df = pl.concat([pl.scan_parquet(f).select(GROUP_COLUMNS) for f in files], how="vertical_relaxed").collect()
    return df.with_columns(
        pl.col("model").cast(pl.Utf8), pl.col("s").cast(pl.Int64), pl.col("g").cast(pl.Int64),
        pl.col("cost_top").cast(pl.Float64), pl.col("cost_pool").cast(pl.Float64),
    )


def hard_row_auc(metrics: dict[str, np.ndarray], hard_threshold: float, with_curve: bool = False):
    """AUC (Mann–Whitney, DeLong interval) of the top-mass dropped mass for hard rows.

    ``hard`` = closable share above ``hard_threshold``; rows with a non-finite κ or D are left out.
    Returns the ``stats.AUCResult``, and with ``with_curve`` also ``(fpr, tpr)`` (None when the AUC
    is undefined).
    """
    kappa, dropped = metrics["closable_share"], metrics["dropped_mass"]
    ok = np.isfinite(kappa) & np.isfinite(dropped)
    hard = kappa[ok] > hard_threshold
    auc = st.auc_mann_whitney(dropped[ok], hard)
    if not with_curve:
        return auc
    curve = st.roc_curve(dropped[ok], hard) if np.isfinite(auc.auc) else None
    return auc, curve
