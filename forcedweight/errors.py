"""The errors every layer raises: bad input is one line naming the file, option or row at fault.

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


__all__ = ["InputError", "RowError"]
