"""``forcedweight pipeline``: the main job (dump → certify → report) in one command."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("pipeline")
    def pipeline(
        out: Path = typer.Option(Path("dumps/default"), "--out", help="Output directory (rows/, results.parquet, report/)."),
        model: Optional[str] = typer.Option(None, "--model", help="Local HF directory or .gguf file; default: embedded SmolLM2-135M-Instruct."),
        s: List[int] = typer.Option([8], "--s", help="Budget(s) to certify (repeatable)."),
        layers: Optional[str] = typer.Option(None, "--layers", help="Layers, e.g. 0,3,5-7 (default: all)."),
        heads: Optional[str] = typer.Option(None, "--heads", help="Query heads (default: all)."),
        positions: int = typer.Option(4, "--positions", help="Query positions sampled per (text, layer, head)."),
        max_texts: int = typer.Option(2, "--max-texts", help="How many texts of the built-in corpus to run."),
        seed: int = typer.Option(0, "--seed", help="Seed of the position sampling, the random selector and the bootstrap."),
        solver: str = typer.Option("auto", "--solver", help="auto|bnb|scip|cpsat|none"),
        time_limit: float = typer.Option(2.0, "--time-limit", help="Per-row solver time limit (s)."),
        workers: int = typer.Option(1, "--workers", help="Local worker processes for certify."),
        force: bool = typer.Option(False, "--force", help="Certify again even when results.parquet is finished with the same rows and options."),
    ) -> None:
        """Dump rows from the model, certify them at budget s, and write the report (resumable)."""
        from forcedweight.pipeline import PipelineOptions, run_pipeline

        opts = PipelineOptions(
            model=model, s_values=tuple(s), layers=layers, heads=heads, positions=positions,
            max_texts=max_texts, seed=seed, solver=solver, time_limit=time_limit, workers=workers,
        )
        report = run_pipeline(out, opts, force=force)
        typer.echo(f"report: {report}")
