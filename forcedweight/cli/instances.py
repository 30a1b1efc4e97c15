"""``forcedweight instances``: NP-hard instance generators with proved answers (thin wrappers)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

instances_app = typer.Typer(
    no_args_is_help=True,
    help="Generate hardness instances with proved answers (balanced partition, KVEVICTION).",
)

_M = typer.Option(..., "--m", help="Number of integers = keys N (even, at most 48).")
_COUNT = typer.Option(..., "--count", help="Number of instances (rows); kinds are assigned round-robin.")
_SEED = typer.Option(0, "--seed", help="Seed; instance i is drawn from SeedSequence(\\[seed, m, i]).")
_OUT = typer.Option(..., "--out", help="Output directory (created).")
_BITS = typer.Option(None, "--bits", help="Bits per integer (default min(ceil(log2 C(m, m/2)) - 1, the most whose rounding bound stays below 1/(2m))).")
_KINDS = typer.Option("yes,no,near_miss", "--kinds", help="Comma-separated kinds among yes, no, near_miss.")
_PROGRESS = typer.Option(True, "--progress/--no-progress", help="Show a progress bar.")


_EVEN = typer.Option(True, "--even-total/--any-total",
                     help="no/near_miss instances with an even total (parity decides nothing; default), or any total.")


@instances_app.command("partition")
def partition(m: int = _M, count: int = _COUNT, seed: int = _SEED, out: Path = _OUT,
              bits: Optional[int] = _BITS, kinds: str = _KINDS, progress: bool = _PROGRESS,
              even_total: bool = _EVEN) -> None:
    """ZEROES rows from balanced partition: uniform masses 1/m, values a_i, s = m/2."""
    from forcedweight.instances.partition import write_partition

    typer.echo(str(write_partition(out, m, count, seed, bits=bits, kinds=kinds, progress=progress,
                                   even_total=even_total)))


@instances_app.command("kveviction")
def kveviction(m: int = _M, count: int = _COUNT, seed: int = _SEED, out: Path = _OUT,
               bits: Optional[int] = _BITS, kinds: str = _KINDS, progress: bool = _PROGRESS,
               even_total: bool = _EVEN) -> None:
    """PARTITION -> KVEVICTION (paper 000): d = 1, all-ones keys and query, r = 1/2, epsilon = 0."""
    from forcedweight.instances.kveviction import write_kveviction

    typer.echo(str(write_kveviction(out, m, count, seed, bits=bits, kinds=kinds, progress=progress,
                                    even_total=even_total)))


def register(app: typer.Typer) -> None:
    app.add_typer(instances_app, name="instances")
