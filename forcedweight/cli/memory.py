"""``forcedweight memory``: the quick memory audit (one random selection stored as a mask over a full cache
versus ragged), printed as a table; optional JSON output. The memory part of ``forcedweight audit``
(``--part memory``) measures the same storages for real policies, allocators and ratios."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer


#: the compression ratio audited when neither --budget nor --compression-ratio is given
DEFAULT_RATIO = 0.5


def memory(
    model: str = typer.Option("tiny", "--model", help="tiny (random test model), smollm2 (embedded), or a model directory / .gguf."),
    tokens: int = typer.Option(512, "--tokens", help="Prompt length N (seeded random token ids)."),
    budget: Optional[int] = typer.Option(None, "--budget", help="Kept entries per KV head (s)."),
    compression_ratio: Optional[float] = typer.Option(
        None, "--compression-ratio", help="Evicted fraction per KV head, in [0, 1): s = round((1 - r) * N) (default 0.5 when no --budget)."),
    old_ratio: Optional[float] = typer.Option(None, "--ratio", hidden=True, help="Renamed: --compression-ratio."),
    seed: int = typer.Option(0, "--seed", help="Seed for the token ids, the tiny model and the selection."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the audit as JSON here."),
) -> None:
    """Physical bytes of one random per-head selection: full cache, mask over the full cache, ragged cache.

    The single-selection form of ``forcedweight audit --part memory`` (real policies, allocators, ratios).
    """
    from forcedweight.deploy.memory import audit_memory, format_audit
    from forcedweight.errors import InputError
    from forcedweight.io import atomic_path, check_output_file, output_lock

    if old_ratio is not None:
        raise InputError(f"--ratio {old_ratio} (the kept fraction) was renamed: give --compression-ratio "
                         f"{1 - old_ratio:g}, the evicted fraction (kvpress's meaning), or --budget")
    if out is not None:
        check_output_file(out)  # an unwritable --out fails before the audit
    if budget is None and compression_ratio is None:
        compression_ratio = DEFAULT_RATIO  # no option: the audit at half the cache evicted
    with output_lock(out, "memory") if out is not None else contextlib.nullcontext():
        result = audit_memory(model, tokens, budget=budget, compression_ratio=compression_ratio, seed=seed)
        if out is not None:
            with atomic_path(out) as tmp:
                Path(tmp).write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(format_audit(result))
    typer.echo("note: one random selection; `forcedweight audit --part memory --policy P --compression-ratio R` "
               "audits real policies", err=True)


def register(app: typer.Typer) -> None:
    app.command("memory")(memory)
