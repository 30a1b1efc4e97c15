"""The main job in one call: dump rows from a model, certify them at budget s, write the report.

``run_pipeline(out)`` with its defaults is what the README's first command runs on the embedded
SmolLM2-135M-Instruct: a small, CPU-sized slice of the model (every layer and head, a few query
positions per head on the first texts of the built-in corpus). Every stage is resumable, so a
rerun after an interruption picks up where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forcedweight.certify import CertifyOptions, certify_file
from forcedweight.dump import dump_rows
from forcedweight.dump.corpus import builtin_texts
from forcedweight.errors import InputError, check_seed
from forcedweight.io import check_output_dir, command_line
from forcedweight.report import build_report


@dataclass(frozen=True)
class PipelineOptions:
    """Options of the main job (see ``forcedweight pipeline --help``); checked on creation."""

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
    stats_s: tuple[int, ...] = (8, 32)

    def __post_init__(self):
        object.__setattr__(self, "s_values", tuple(int(s) for s in self.s_values))
        object.__setattr__(self, "stats_s", tuple(int(s) for s in self.stats_s))
        if self.max_texts < 1:
            raise InputError(f"--max-texts: must be >= 1, got {self.max_texts}")
        if not self.s_values or min(self.s_values) < 1:
            raise InputError(f"--s: budgets must be >= 1, got {list(self.s_values)}")
        if self.workers < 1:
            raise InputError(f"--workers must be >= 1, got {self.workers}")
        if self.positions < 1:
            raise InputError(f"--positions must be >= 1, got {self.positions}")
        check_seed(self.seed)

    def certify_options(self) -> CertifyOptions:
        return CertifyOptions(solver=self.solver, time_limit=self.time_limit, seed=self.seed)


def run_pipeline(out: str | Path, options: PipelineOptions | None = None, progress: bool = True,
                 force: bool = False) -> Path:
    """Run dump → certify → report into ``out``; returns the path of ``report.md``.

    A rerun resumes the dump and keeps a finished ``results.parquet`` whose input and options match
    (``certify``'s fingerprint); ``force`` certifies again.

    Layout: ``out/rows/`` (the dump), ``out/results.parquet`` (certify), ``out/report/``.
    """
    options = options or PipelineOptions()
    out = Path(out)
    rows_dir = out / "rows"
    results = out / "results.parquet"
    report_dir = out / "report"
    command = command_line()
    certify_options = options.certify_options()  # checked before the dump (minutes of work)
    check_output_dir(out)

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
        force=force,
    )
    return build_report(results, report_dir, seed=options.seed, command=command)
