"""``forcedweight certify``: best kept subsets per (row, s), certified over all N keys (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer



def certify(
    rows: Path = typer.Argument(..., help="Rows: a Parquet file or a directory of them (docs/concepts.md)."),
    s: List[int] = typer.Option(..., "--s", help="Budget (repeat for several: --s 4 --s 8)."),
    out: Path = typer.Option(..., "--out", help="Results Parquet file (written atomically)."),
    pool_mass: int = typer.Option(12, "--pool-mass", help="Top-mass keys beyond s in the candidate pool."),
    pool_error: int = typer.Option(8, "--pool-error", help="Keys of largest single-key error in the pool."),
    solver: str = typer.Option("auto", "--solver", help="auto (mitm on integral 1-D rows, else bnb), bnb, scip, cpsat or none."),
    time_limit: float = typer.Option(10.0, "--time-limit", help="Solver seconds per (row, s)."),
    node_limit: Optional[int] = typer.Option(None, "--node-limit", help="Cap on bnb search nodes per (row, s): statuses and bounds reproducible on any machine (with a --time-limit not reached first)."),
    refine_work: float = typer.Option(5e8, "--refine-work", help="Budget (key-steps, deterministic) for refining the lower bound of a row the search left open; runs after the limit, up to --bound-time (about 1 s per open row at N ~ 1,000 at the default, 6-7 s at 2e9); 0 = off."),
    bound_time: Optional[float] = typer.Option(None, "--bound-time", help="Seconds the lower bound of a row left open by --time-limit may take after it (default: a fifth of the limit, at least 2 s; none with --node-limit). Raise it with --refine-work for higher bounds on open rows."),
    workers: int = typer.Option(1, "--workers", help="Local worker processes."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Record bad rows as status=invalid instead of stopping."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler address (runs the shards there)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random selector."),
    max_subsets: int = typer.Option(4_000_000, "--max-subsets", help="Cap on C(pool, s) (default keeps the full pool of 28 at s = 8); larger pools are shrunk."),
    chunk_rows: int = typer.Option(64, "--chunk-rows", help="Rows per shard (unit of work and of resume)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="Take the rows of an unfinished dump (manifest complete: false)."),
    force: bool = typer.Option(False, "--force", help="Certify again even when OUT is finished with the same input and options (else it is kept)."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Memory one (row, s) may ask of the solver, e.g. 8G (default: half the RAM); rows above it are refused (status=invalid with --skip-invalid)."),
) -> None:
    """Find and certify the best kept subsets under forced weights; one output row per (row_id, s)."""
    from forcedweight.certify import CertifyOptions, certify_file
    from forcedweight.certify.options import parse_memory

    options = CertifyOptions(pool_mass=pool_mass, pool_error=pool_error, solver=solver,
                             time_limit=time_limit, seed=seed, max_subsets=max_subsets, node_limit=node_limit,
                             refine_work=refine_work, bound_time=bound_time, max_memory=parse_memory(max_memory))
    path = certify_file(rows, out, s, options, workers=workers, scheduler=scheduler,
                        skip_invalid=skip_invalid, progress=progress, chunk_rows=chunk_rows,
                        allow_incomplete=allow_incomplete, force=force)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("certify")(certify)
