"""The errors every layer raises: bad input is one line naming the file, option or row at fault.
Also the one check every seeded command shares (``check_seed``).

Kernels, the cache, the deploy harness and the row contract all depend on this module only, never
on each other, to report bad input. The CLI turns an ``InputError`` into ``error: <message>`` and
exit code 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: a message of one line naming the file, option or row at fault."""


class RowError(InputError):
    """A single row breaks the contract; ``row_id`` names it, ``reason`` says how."""

    def __init__(self, row_id: int, reason: str, source: str | None = None):
        self.row_id = int(row_id)
        self.reason = reason
        self.source = source
        where = f" in {source}" if source else ""
        super().__init__(f"row {self.row_id}{where}: {reason}")


def check_seed(seed, option: str = "--seed") -> int:
    """The seed as an int in ``[0, 2**63)`` (NumPy's ``SeedSequence`` refuses negatives, Parquet's int64
    columns larger ones); InputError naming ``option`` otherwise."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__") or not 0 <= int(seed) < 2**63:
        raise InputError(f"{option} must be an integer in [0, 2**63), got {seed!r}")
    return int(seed)


__all__ = ["InputError", "RowError", "check_seed"]
