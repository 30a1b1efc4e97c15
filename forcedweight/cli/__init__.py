"""The ``forcedweight`` command line (Typer). Thin: each command calls into the library.

Each subcommand lives in its own module of this package and exposes ``register(app)``;
bad input raised as ``InputError`` becomes one ``error:`` line and exit code 2, here only.
"""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path

# The analysis makes many small LAPACK calls (SVDs of a few dozen rows); a pool of BLAS threads
# per call only adds contention. Set before NumPy loads; a user's explicit setting wins.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# transformers' GGUF loader prints its own tqdm bar on every model load; the CLI shows rich
# progress bars of its own (and none with --no-progress), so tqdm is silenced unless asked for.
os.environ.setdefault("TQDM_DISABLE", "1")

import typer  # noqa: E402

from forcedweight.cli import audit, certify, contourkv, dump, evaluate, groups, instances, memory, pipeline, probabilistic, report, tasks  # noqa: E402
from forcedweight import __version__  # noqa: E402
from forcedweight.errors import InputError  # noqa: E402
from forcedweight.io import os_error  # noqa: E402

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Capture attention rows, certify the best kept subsets under forced weights, report, deploy.",
)


def check_paths(kwargs: dict) -> None:
    """Refuse a path argument that is not valid UTF-8 (Arrow and Parquet cannot name such a file)."""
    for name, value in kwargs.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, Path):
                try:
                    os.fsencode(v).decode("utf-8")
                except UnicodeDecodeError:
                    shown = os.fsencode(v).decode("utf-8", errors="replace")
                    raise InputError(f"{shown}: path of {name} is not valid UTF-8; "
                                     "rename it or use another path") from None


def _one_line_errors(command):
    """Wrap a command so that bad input (an InputError) prints ``error: ...`` and exits 2.

    The one place where the CLI turns library errors into its exit contract; it applies to every
    command and sub-command, whether run from the console script or through ``CliRunner``.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            check_paths(kwargs)
            return command(*args, **kwargs)
        except InputError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            typer.echo(f"error: {os_error(exc)}", err=True)  # disk full: one line naming the path
            raise typer.Exit(2) from None

    return wrapper


def _wrap_commands(typer_app: typer.Typer) -> None:
    for info in typer_app.registered_commands:
        info.callback = _one_line_errors(info.callback)
    for group in typer_app.registered_groups:
        _wrap_commands(group.typer_instance)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"forcedweight {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Capture attention rows, certify the best kept subsets under forced weights, report, deploy."""


for _module in (dump, certify, report, groups, instances, memory, probabilistic, pipeline, evaluate, tasks, audit, contourkv):
    _module.register(app)
_wrap_commands(app)


def main() -> None:
    app()
