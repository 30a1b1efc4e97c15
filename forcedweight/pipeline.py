"""The main job in one call: dump rows from a model, certify them at budget s, write the report.

``run_pipeline(out)`` with its defaults is what the README's first command runs on the embedded
SmolLM2-135M-Instruct: a small, CPU-sized slice of the model (every layer and head, a few query
positions per head on the first texts of the built-in corpus). Every stage is resumable, so a
rerun after an interruption picks up where it stopped.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PipelineOptions:
    """Options of the main job (see ``forcedweight pipeline --help``)."""

    model: str | None = None
    s_values: tuple[int, ...] = (8,)
    layers: str | None = None
    heads: str | None = None
    positions: int = 4
    max_texts: int = 2
    seed: int = 0
    solver: str = "auto"
    time_limit: float = 2.0
    workers: int = 1
    stats_s: tuple[int, ...] = field(default_factory=lambda: (8, 32))


def run_pipeline(out: str | Path, options: PipelineOptions | None = None, progress: bool = True) -> Path:
    """Run dump → certify → report into ``out``; returns the path of ``report.md``.

    Layout: ``out/rows/`` (the dump), ``out/results.parquet`` (certify), ``out/report/``.
    """
    from forcedweight.certify import CertifyOptions, certify_file
    from forcedweight.dumps import dump_rows
    from forcedweight.dumps.corpus import builtin_texts
    from forcedweight.report import build_report

    options = options or PipelineOptions()
    out = Path(out)
    rows_dir = out / "rows"
    results = out / "results.parquet"
    report_dir = out / "report"
    command = " ".join(shlex.quote(a) for a in sys.argv) if sys.argv else "run_pipeline(...)"

    # check every option before the dump (minutes of work) rather than after it
    from forcedweight.rows import InputError

    if options.max_texts < 1:
        raise InputError(f"--max-texts: must be >= 1, got {options.max_texts}")
    if not options.s_values or min(options.s_values) < 1:
        raise InputError(f"--s: budgets must be >= 1, got {list(options.s_values)}")
    if options.workers < 1:
        raise InputError(f"--workers must be >= 1, got {options.workers}")
    certify_options = CertifyOptions(solver=options.solver, time_limit=options.time_limit, seed=options.seed)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out: {out} exists and is not a directory")

    texts = builtin_texts()[: options.max_texts]
    dump_rows(
        options.model,
        texts,
        rows_dir,
        layers=options.layers,
        heads=options.heads,
        positions=options.positions,
        seed=options.seed,
        stats_s=options.stats_s,
        progress=progress,
    )
    certify_file(
        rows_dir,
        results,
        options.s_values,
        certify_options,
        workers=options.workers,
        skip_invalid=True,  # rows with N <= s (early query positions) are recorded as invalid, not fatal
        progress=progress,
    )
    return build_report(results, report_dir, seed=options.seed, command=command)
