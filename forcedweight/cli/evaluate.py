"""``forcedweight evaluate``: eviction policies inside real generation, budget physically enforced (thin);
``forcedweight evaluate report DIR``: the report of a finished run."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from forcedweight.cli.options import numbers, require_tasks_and_out, split_list, torch_threads


def evaluate(
    action: Optional[List[str]] = typer.Argument(None, help="'report DIR [--out REPORT_DIR]': only write the report of a finished run."),
    model: str = typer.Option("smollm2", "--model", help="smollm2 (embedded), a model directory or a .gguf file."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="Task file (JSONL or Parquet, kvpress columns)."),
    policy: Optional[List[str]] = typer.Option(None, "--policy", help="Policy (repeat or comma-separate; none = full cache)."),
    allocator: Optional[List[str]] = typer.Option(None, "--allocator", help="Allocator: uniform (default), adakv, global."),
    method: Optional[List[str]] = typer.Option(None, "--method", help="Further POLICY/ALLOCATOR pairs (e.g. snapkv/adakv), beyond --policy x --allocator."),
    compression_ratio: Optional[List[str]] = typer.Option(None, "--compression-ratio", help="Fraction of context entries evicted, in [0, 1) (repeat or comma-separate)."),
    budget: Optional[List[str]] = typer.Option(None, "--budget", help="Mean kept entries per KV head (instead of --compression-ratio)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (results.parquet, report/)."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Only the first N examples."),
    query_aware: bool = typer.Option(False, "--query-aware", help="Compress context + question (kvpress compress_questions)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random policy (and of the sampled policies' draws)."),
    tau: str = typer.Option("1", "--tau", help="Correction temperature of the sampled-<proposal> policies (inf = uncorrected)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Torch threads (default: torch's)."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write DIR/report/ at the end."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
) -> None:
    """Prefill once per example, score, evict in the ragged cache, answer greedily; one row per method.

    ``forcedweight evaluate report DIR`` writes the report of a finished run (DIR/report, or --out).
    """
    from forcedweight.deploy.evaluate import evaluate as run
    from forcedweight.deploy.policies.sampled import parse_tau
    from forcedweight.errors import InputError

    if action:
        if action[0] != "report" or len(action) != 2:
            raise InputError(f"evaluate: unexpected argument(s) {' '.join(action)} (only: report DIR)")
        _report(Path(action[1]), out)
        return

    require_tasks_and_out(tasks, out)
    torch_threads(threads)
    path = run(model, tasks, out, split_list(policy), split_list(allocator) or ["uniform"],
               compression_ratios=numbers(compression_ratio, "--compression-ratio") or None,
               budgets=numbers(budget, "--budget") or None, max_examples=max_examples,
               query_aware=query_aware, seed=seed, methods=split_list(method), progress=progress, report=report,
               policy_options={p: {"tau": parse_tau(tau)} for p in split_list(policy) + [m.split("/")[0] for m in split_list(method)]
                               if p.startswith("sampled-")})
    typer.echo(str(path))


def _report(results: Path, out: Optional[Path]) -> None:
    """Tables per task x ratio, score against physical bytes, paired comparisons (report.md)."""
    from forcedweight.deploy.evaluate_report import write_report

    base = results if results.is_dir() else results.parent
    typer.echo(str(write_report(results, out or base / "report")))


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
