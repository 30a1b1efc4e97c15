"""``build_report``: every table and figure from ``certify`` output, and ``report.md`` (docs/enumerate.md, docs/report.md).

``build_report`` reads a results file or directory (only the columns it needs, through
``polars.scan_parquet``), groups rows by family ``(model, layer, head, s)`` and pooled per
``(model, s)``, and writes under ``out_dir``:

- ``tables/<name>.csv`` and ``tables/<name>.parquet`` for ``status_counts``, ``medians``,
  ``bounds``, ``substitution``, ``prediction`` and (with ``groups_path``) ``groups``;
- ``figures/<name>.png`` and ``.pdf`` (see ``forcedweight.report.figures``);
- ``report.md`` with the headline numbers pooled per (model, s) and the command that ran.

Every write is atomic, and the whole report is staged and moved into place together. Statistics that are undefined for a small family are ``NaN`` with a
``note``; unusable input (missing file, empty results, columns of another tool) raises
``InputError`` before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from forcedweight.errors import InputError, check_seed
from forcedweight.io import atomic_path, command_line, output_lock, staged_outputs
from forcedweight.report import figures
from forcedweight.report.markdown import render_markdown
from forcedweight.report.provenance import REPORT_KEY, results_provenance, settings_lines
from forcedweight.report.metrics import load_groups, load_results
from forcedweight.report.tables import compute_tables, group_summary, write_table


#: what a report writes into its directory (a rebuild replaces all of it at once)
REPORT_OUTPUTS = ("tables", "figures", "report.md")


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
    if not 0 <= hard_threshold < 1:
        raise InputError(f"--hard-threshold: {hard_threshold} is outside [0, 1)")
    if n_boot < 1:
        raise InputError(f"--n-boot: {n_boot} must be >= 1")
    check_seed(seed)
    out = Path(out_dir)
    with output_lock(out, "report"):  # a second report on the same out_dir while this one runs is refused
        return _build(results_path, out, hard_threshold, groups_path, n_boot, seed, command)


def _build(results_path, out: Path, hard_threshold: float, groups_path, n_boot: int, seed: int,
           command: str | None) -> Path:
    df = load_results(results_path)
    gdf = load_groups(groups_path) if groups_path is not None else None
    tables = compute_tables(df, hard_threshold, n_boot, seed)
    if gdf is not None:
        tables["groups"] = group_summary(gdf, n_boot, seed)

    # the whole report (tables/, figures/, report.md) is staged and moved into place at once: a
    # failure (a full disk) leaves the previous report as it was, never tables without figures
    with staged_outputs(out, owned=REPORT_OUTPUTS) as stage:
        tdir, fdir = stage / "tables", stage / "figures"
        for d in (tdir, fdir):
            d.mkdir(parents=True, exist_ok=True)
        records = results_provenance(results_path)
        report_command = command or command_line()
        meta = {REPORT_KEY: json.dumps({"inputs": records, "report_command": report_command}).encode()}
        written_tables = {name: write_table(t, tdir / name, meta) for name, t in tables.items()}
        written_figures = figures.write_all(df, tables, fdir, hard_threshold)
        text = render_markdown(
            tables, stage, written_tables, written_figures, results_path, groups_path,
            report_command, hard_threshold, n_boot, seed, settings_lines(records),
        )
        with atomic_path(stage / "report.md") as tmp:
            Path(tmp).write_text(text)
    return out / "report.md"

