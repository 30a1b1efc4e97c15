"""Parsing of the options the commands share (``--policy a,b --policy c``, ``--s 8,32``, ``--tasks``/``--out``)."""

from __future__ import annotations

from typing import List, Optional

from forcedweight.errors import InputError


def split_list(values: Optional[List[str]]) -> list[str]:
    """Repeated options, each possibly comma-separated (``--policy a,b --policy c``)."""
    return [v.strip() for item in (values or []) for v in str(item).split(",") if v.strip()]


def numbers(values: Optional[List[str]], option: str, kind=float) -> list:
    """``split_list`` parsed as numbers (``kind`` float or int); InputError naming the option."""
    out = []
    for v in split_list(values):
        try:
            out.append(kind(v))
        except ValueError:
            raise InputError(f"{option}: {v!r} is not {'an integer' if kind is int else 'a number'}") from None
    return out


def torch_threads(threads: Optional[int], option: str = "--threads") -> None:
    """Set torch's intra-op threads from ``--threads`` (None: leave torch's default); InputError below 1."""
    if threads is None:
        return
    if threads < 1:
        raise InputError(f"{option} must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


def require_tasks_and_out(tasks, out) -> None:
    """The generation commands' (evaluate, audit) two required paths: InputError naming the missing one."""
    if tasks is None:
        raise InputError("--tasks: give a task file (forcedweight tasks writes one)")
    if out is None:
        raise InputError("--out: give an output directory")
