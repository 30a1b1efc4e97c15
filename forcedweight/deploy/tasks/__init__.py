"""Evaluation tasks: RULER-style synthetic examples and held-out continuation (written offline in
kvpress's dataset columns), the task-file reader, and RULER's scoring rules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from forcedweight.deploy.tasks.continuation import continuation
from forcedweight.deploy.tasks.files import COLUMNS, REQUIRED, read_tasks, write_tasks
from forcedweight.deploy.tasks.ruler import KINDS, fit
from forcedweight.deploy.tasks.scoring import (CONTINUATION_TASK, higher_is_better, metric_for_task, score_answer,
                                               string_match_all, string_match_part)
from forcedweight.errors import InputError, check_seed
from forcedweight.io import output_lock

ALL_KINDS = KINDS + (CONTINUATION_TASK,)


def check_task_options(kinds: Sequence[str], tokens: int, n: int, max_new_tokens: int | None = None) -> None:
    """InputError naming the option unless every kind is known, ``tokens >= 16``, ``n >= 1`` and
    ``max_new_tokens`` (when given) ``>= 0`` (``evaluate`` refuses a negative one in a task file)."""
    if tokens < 16:
        raise InputError(f"--tokens must be >= 16, got {tokens}")
    if n < 1:
        raise InputError(f"--n must be >= 1, got {n}")
    if max_new_tokens is not None and max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    if not kinds:
        raise InputError("--kinds: give at least one task kind")
    for kind in kinds:
        if kind not in ALL_KINDS:
            raise InputError(f"--kinds: unknown task kind {kind!r} (known: {', '.join(ALL_KINDS)})")


def make_tasks(tokenizer, kinds: Sequence[str], tokens: int, n: int, seed: int = 0,
               max_new_tokens: int | None = None, continuation_tokens: int = 128) -> list[dict]:
    """``n`` examples of every kind in ``kinds`` at about ``tokens`` tokens (see the module docs).

    ``max_new_tokens`` overrides RULER's per-task generation length when given.
    """
    check_task_options(kinds, tokens, n, max_new_tokens)
    out = []
    for kind in kinds:
        for i in range(n):
            if kind == CONTINUATION_TASK:
                ex = continuation(tokens, tokenizer, seed, i, continuation_tokens)
            else:
                ex = fit(kind, tokens, tokenizer, seed, i)
                if max_new_tokens is not None:
                    ex["max_new_tokens"] = int(max_new_tokens)
            out.append(ex)
    return out


def write_task_file(tokenizer, kinds: Sequence[str], tokens: int, n: int, out: str | os.PathLike, seed: int = 0,
                    max_new_tokens: int | None = None) -> Path:
    """:func:`make_tasks` written to ``out`` (``.jsonl`` or ``.parquet``), holding ``io.output_lock(out)``
    (a second run writing the same file meanwhile is refused)."""
    check_seed(seed)
    with output_lock(out, "tasks"):  # (the suffix is checked by write_tasks before any work)
        return write_tasks(make_tasks(tokenizer, kinds, tokens, n, seed, max_new_tokens), out)


__all__ = ["ALL_KINDS", "COLUMNS", "CONTINUATION_TASK", "REQUIRED", "check_task_options", "continuation", "fit",
           "higher_is_better", "make_tasks", "metric_for_task", "read_tasks", "score_answer", "string_match_all",
           "string_match_part", "write_task_file", "write_tasks"]
