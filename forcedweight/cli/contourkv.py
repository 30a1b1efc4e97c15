"""``forcedweight contourkv paired|enforcement|merge``: the ContourKV experiments of issue 12 (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from forcedweight.cli.options import split_list, torch_threads

app = typer.Typer(no_args_is_help=True, help="ContourKV: paired comparison at matched bytes; enforcement experiment.")


def _ratios(values: Optional[List[str]]) -> list[float]:
    from forcedweight.errors import InputError

    out = []
    for item in values or ["0.5,0.75,0.9"]:
        for v in str(item).split(","):
            try:
                out.append(float(v))
            except ValueError:
                raise InputError(f"--compression-ratio: {v!r} is not a number") from None
    return out


@app.command("paired")
def paired(
    tasks: Path = typer.Option(..., "--tasks", help="Task file (the issue-11 benchmark's)."),
    out: Path = typer.Option(..., "--out", help="Output directory (groups in OUT/<group>/, merged results, tables)."),
    model: str = typer.Option("smollm2", "--model"),
    compression_ratio: Optional[List[str]] = typer.Option(None, "--compression-ratio", help="Default 0.5,0.75,0.9."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples"),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="An evaluate output dir of the same tasks: opponents' rows read from it."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only these groups (contourkv, kvzip, uniform), then merge."),
    threads: int = typer.Option(1, "--threads"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """ContourKV (kvzip, snapkv scores) against kvzip global/uniform/adakv, snapkv, expected_attention, compactor."""
    from forcedweight.deploy.contourkv_experiment import paired_experiment

    torch_threads(threads)
    groups = split_list(only) or None
    typer.echo(str(paired_experiment(model, tasks, out, _ratios(compression_ratio), max_examples, baseline, groups,
                                     progress=progress)))


@app.command("merge")
def merge(out: Path = typer.Argument(..., help="The paired experiment's output directory."),
          compression_ratio: Optional[List[str]] = typer.Option(None, "--compression-ratio"),
          baseline: Optional[Path] = typer.Option(None, "--baseline")) -> None:
    """Merge the finished groups and write the report and the ContourKV tables (every ratio the run
    holds, unless --compression-ratio picks some)."""
    from forcedweight.deploy.contourkv_experiment import merge as run

    typer.echo(str(run(out, _ratios(compression_ratio) if compression_ratio else None, baseline)))


@app.command("enforcement")
def enforcement(
    tasks: Path = typer.Option(..., "--tasks"),
    out: Path = typer.Option(..., "--out"),
    model: str = typer.Option("smollm2", "--model"),
    policy: str = typer.Option("kvzip", "--policy"),
    allocator: str = typer.Option("global", "--allocator"),
    compression_ratio: Optional[List[str]] = typer.Option(None, "--compression-ratio"),
    max_examples: Optional[int] = typer.Option(None, "--max-examples"),
    threads: int = typer.Option(1, "--threads"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """One fixed selection stored ragged / masked / token union / token top-k: score and physical bytes."""
    from forcedweight.deploy.contourkv_experiment import enforcement_experiment

    torch_threads(threads)
    typer.echo(str(enforcement_experiment(model, tasks, out, policy, allocator, _ratios(compression_ratio), max_examples,
                                            progress=progress)))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="contourkv")
