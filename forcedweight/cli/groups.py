"""``forcedweight groups``: frozen-head group voting under GQA over dumped rows (thin wrapper of ``group_voting``)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer


def groups(
    rows: Path = typer.Argument(..., help="Dumped rows: a Parquet file or directory (dump --all-positions)."),
    s: List[int] = typer.Option(..., "--s", help="Budget (repeatable)."),
    out: Path = typer.Option(..., "--out", help="Output Parquet file (one record per group, subset, head, s)."),
    pool_mass: int = typer.Option(12, "--pool-mass", help="Top-mass keys beyond s in the ES_pool candidate pool."),
    pool_error: int = typer.Option(8, "--pool-error", help="Keys with the largest single-key error in the pool."),
    max_subsets: int = typer.Option(64, "--max-subsets", help="Subsets per group and size g; sampled with --seed above it."),
    seed: int = typer.Option(0, "--seed", help="Seed of the subset sampling."),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="Take the rows of an unfinished dump (manifest complete: false)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
) -> None:
    """Cost of one shared kept set per KV group (top-s of summed weights) over own top-mass and ES_pool."""
    from forcedweight.certify.groups import group_voting

    path = group_voting(rows, s, out, pool_mass=pool_mass, pool_error=pool_error, max_subsets=max_subsets, seed=seed,
                        allow_incomplete=allow_incomplete, progress=progress)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("groups")(groups)
