"""The ``forcedweight`` command line (Typer). Thin: each command calls into the library.

Each subcommand lives in its own module of this package and exposes ``register(app)``.
"""

from __future__ import annotations

import importlib
import os
import sys

# The analysis makes many small LAPACK calls (SVDs of a few dozen rows); a pool of BLAS threads
# per call only adds contention. Set before NumPy loads; a user's explicit setting wins.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# transformers' GGUF loader prints its own tqdm bar on every model load; the CLI shows rich
# progress bars of its own (and none with --no-progress), so tqdm is silenced unless asked for.
os.environ.setdefault("TQDM_DISABLE", "1")

import typer  # noqa: E402

from forcedweight.rows import InputError  # noqa: E402

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Capture attention rows, certify the best kept subsets under forced weights, report, deploy.",
)

COMMAND_MODULES = ("dump", "certify", "report", "groups", "instances", "memory", "probabilistic", "pipeline")

for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"forcedweight.cli.{_name}")
    except ModuleNotFoundError as _exc:  # a command not built yet
        if _exc.name != f"forcedweight.cli.{_name}":
            raise
        continue
    _mod.register(app)


def fail(message: str, code: int = 2) -> None:
    """Print one clear line to stderr and exit non-zero."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def main() -> None:
    try:
        app()
    except InputError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
