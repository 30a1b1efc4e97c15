"""``forcedweight tasks``: write RULER-style and continuation task files offline (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def tasks(
    model: str = typer.Option("smollm2", "--model", help="Model whose tokenizer measures the lengths."),
    kinds: List[str] = typer.Option(..., "--kinds", help="Task kinds, comma-separated or repeated (niah_single_1, ..., vt, cwe, fwe, continuation)."),
    tokens: int = typer.Option(1000, "--tokens", help="Target length in tokens (context + question + answer prefix)."),
    n: int = typer.Option(12, "--n", help="Examples per kind."),
    seed: int = typer.Option(0, "--seed", help="Seed of every draw."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Override RULER's generation length."),
    out: Path = typer.Option(..., "--out", help="Output file (.jsonl or .parquet), written atomically."),
) -> None:
    """Seeded synthetic examples in kvpress's dataset columns."""
    from forcedweight.deploy.tasks import check_task_options, write_task_file
    from forcedweight.deploy.tasks.files import task_file_kind
    from forcedweight.io import check_output_file
    from forcedweight.cli.options import split_list
    from forcedweight.models import loaded_model

    from forcedweight.errors import InputError, check_seed

    names = split_list(kinds)
    check_task_options(names, tokens, n, max_new_tokens)  # before the model loads
    check_seed(seed)
    task_file_kind(out)
    check_output_file(out)
    loaded = loaded_model(model, "forcedweight tasks", note=lambda msg: typer.echo(msg, err=True))
    window = getattr(loaded.model.config, "max_position_embeddings", None)
    if window is not None and tokens > window:  # evaluate would refuse every example of the file
        raise InputError(f"--tokens: {tokens} exceeds the model's window of {window}")
    typer.echo(str(write_task_file(loaded.tokenizer, names, tokens, n, out, seed, max_new_tokens)))


def register(app: typer.Typer) -> None:
    app.command("tasks")(tasks)
