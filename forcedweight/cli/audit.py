"""``forcedweight audit``: memory, query-leak and selection-ceiling audits of eviction methods (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from forcedweight.cli.options import numbers, require_tasks_and_out, split_list, torch_threads


def audit(
    model: str = typer.Option("smollm2", "--model", help="smollm2 (embedded), a model directory or a .gguf file."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="Task file (JSONL or Parquet; forcedweight tasks writes one)."),
    policy: Optional[List[str]] = typer.Option(None, "--policy", help="Eviction policy (repeat or comma-separate)."),
    compression_ratio: Optional[List[str]] = typer.Option(None, "--compression-ratio", help="Fraction evicted, in [0, 1) (memory, leak)."),
    allocator: Optional[List[str]] = typer.Option(None, "--allocator", help="Allocator(s) for memory and leak: uniform (default), adakv, global."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory."),
    part: Optional[List[str]] = typer.Option(None, "--part", help="memory, leak, ceiling (default: all three)."),
    layers: Optional[List[str]] = typer.Option(None, "--layers", help="Ceiling: restricted layers (default: all)."),
    s: Optional[List[str]] = typer.Option(None, "--s", help="Ceiling: kept entries per query head (default 8,32,128)."),
    selection: Optional[List[str]] = typer.Option(None, "--selection", help="Ceiling: top, balancing, best, targeted (default: all)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Ceiling: restrict only the first N query rows after the context."),
    solver: str = typer.Option("bnb", "--solver", help="Ceiling: certify's solver for the best set."),
    time_limit: float = typer.Option(0.1, "--time-limit", help="Ceiling: solver seconds per (row, head)."),
    threshold: float = typer.Option(0.5, "--threshold", help="Ceiling: targeted switch, balancing where top-mass drops more mass."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Only the first N examples."),
    memory_examples: int = typer.Option(1, "--memory-examples", help="Examples measured by the memory audit."),
    ceiling_examples: Optional[int] = typer.Option(None, "--ceiling-examples", help="Examples run by the ceiling (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random policy."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Torch threads (default: torch's)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars on stderr."),
) -> None:
    """Memory (ragged vs masked vs nominal bytes), query leak (question visible or not) and the selection
    ceiling inside generation; writes DIR/memory.parquet, leak.parquet, ceiling.parquet, report.md."""
    from forcedweight.deploy.audit.ceiling import SELECTIONS
    from forcedweight.deploy.audit.run import PARTS, audit as run

    require_tasks_and_out(tasks, out)
    torch_threads(threads)
    layer_list = numbers(layers, "--layers", int) or None
    path = run(model, tasks, out, split_list(policy), numbers(compression_ratio, "--compression-ratio"),
               split_list(allocator) or ["uniform"], split_list(part) or list(PARTS), layer_list,
               numbers(s, "--s", int) or [8, 32, 128], split_list(selection) or list(SELECTIONS), steps, solver,
               time_limit, threshold, max_examples, memory_examples, ceiling_examples, seed, progress)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)
