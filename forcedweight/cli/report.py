"""``forcedweight report``: paper tables, figures and report.md from ``certify`` output (thin wrapper of ``build_report``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def report(
    results: Path = typer.Argument(..., help="certify output: a Parquet file or a directory of them."),
    out: Path = typer.Option(..., "--out", help="Output directory (tables/, figures/, report.md)."),
    hard_threshold: float = typer.Option(0.05, "--hard-threshold", help="A row is hard when its closable share exceeds this."),
    groups: Optional[Path] = typer.Option(None, "--groups", help="Output of 'forcedweight groups' to include."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    n_boot: int = typer.Option(2000, "--n-boot", help="Bootstrap resamples per interval."),
) -> None:
    """Medians with bootstrap intervals, Wilson bounds, substitution sensitivity, dropped-mass AUC, figures."""
    from forcedweight.io import command_line
    from forcedweight.report import build_report

    path = build_report(results, out, hard_threshold=hard_threshold, groups_path=groups, n_boot=n_boot, seed=seed,
                        command=command_line())
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
