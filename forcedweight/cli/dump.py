"""``forcedweight dump``: capture attention rows from a model over texts (thin wrapper of ``dump_rows``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def dump(
    out: Path = typer.Option(..., "--out", help="Output directory (created; rerun with the same options to resume)."),
    model: str = typer.Option("smollm2", "--model", help="'smollm2' (embedded default), a local HF directory or a .gguf file (families: docs/families.md)."),
    text_file: Optional[List[Path]] = typer.Option(None, "--text-file", help="A plain-text file, one text each (repeatable)."),
    texts: Optional[Path] = typer.Option(None, "--texts", help="A .parquet or .jsonl file with a 'text' column."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Layers, e.g. 0,3,5-7 (default: all)."),
    heads: Optional[str] = typer.Option(None, "--heads", help="Query heads, e.g. 0-2 (default: all)."),
    positions: int = typer.Option(4, "--positions", help="Query positions sampled per (text, layer, head), from positions >= 1."),
    all_positions: bool = typer.Option(False, "--all-positions", help="Capture every query position >= 1."),
    seed: int = typer.Option(0, "--seed", help="Seed of the position sampling."),
    with_keys: bool = typer.Option(False, "--with-keys", help="Also store post-RoPE keys, query and scaled logits."),
    stats_s: Optional[List[int]] = typer.Option(None, "--stats-s", help="Budget s for the dropped-mass table (repeatable)."),
    dtype: str = typer.Option("float32", "--dtype", help="Model dtype: float32, float16, bfloat16 (weights are float32 softmax)."),
    max_texts: Optional[int] = typer.Option(None, "--max-texts", help="Use only the first N texts."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: cuda when available)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Capture attention rows (weights, values, provenance) into Parquet shards, resumably."""
    from forcedweight.dump import builtin_texts, dump_rows, read_text_files, read_texts_table
    from forcedweight.errors import InputError

    chosen: list[str] = []
    if text_file:
        chosen += read_text_files(text_file)
    if texts is not None:
        chosen += read_texts_table(texts)
    if not chosen:
        chosen = builtin_texts()
    if max_texts is not None:
        if max_texts < 1:
            raise InputError(f"--max-texts: must be >= 1, got {max_texts}")
        chosen = chosen[:max_texts]
    path = dump_rows(
        model, chosen, out, layers=layers, heads=heads, positions=positions, all_positions=all_positions,
        seed=seed, with_keys=with_keys, stats_s=tuple(stats_s or ()), progress=progress, dtype=dtype, device=device,
    )
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("dump")(dump)
