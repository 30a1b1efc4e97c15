"""The inputs every allocator checks: per-layer scores stacked into segments, and a total budget.

A *segment* is one (layer, KV head); an allocator reads per-layer ``(H_kv, N)`` scores (higher = keep,
``+inf`` = must keep: sinks and recent window) and a budget of entries over all segments. Both the
registry (``deploy.allocate``) and ContourKV (``deploy.contourkv``, which the registry imports) check
them here, so the messages and the rules are one.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from forcedweight.errors import InputError


def stack_scores(scores: list[np.ndarray], who: str = "allocate") -> np.ndarray:
    """Per-layer (H_kv, N) scores → (L, H_kv, N) float64 (every layer the same shape, no NaN);
    InputError naming ``who`` otherwise."""
    if not scores:
        raise InputError(f"{who}: no layers to allocate over")
    shapes = {np.shape(s) for s in scores}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise InputError(f"{who}: every layer's scores must be (H_kv, N) of one shape, got {sorted(shapes)}")
    x = np.stack([np.asarray(s, dtype=np.float64) for s in scores])
    if np.isnan(x).any():
        raise InputError(f"{who}: scores contain NaN")
    return x


def check_budget(x: np.ndarray, budget) -> int:
    """The budget as an int in ``[+inf entries of x, x.size]`` for stacked scores x (L, H_kv, N);
    InputError naming ``--budget`` otherwise (a non-number, NaN, a fraction, out of range, below the
    sinks + recent window)."""
    L, H, N = x.shape
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real) or not math.isfinite(budget) \
            or int(budget) != budget:
        raise InputError(f"--budget: must be an integer number of entries, got {budget!r}")
    budget = int(budget)
    if not 0 <= budget <= L * H * N:
        raise InputError(f"--budget: {budget} entries outside [0, {L * H * N}] (= layers x KV heads x tokens)")
    need = int(np.isposinf(x).sum())
    if budget < need:
        raise InputError(f"--budget: {budget} entries is below the sinks + recent window ({need} entries)")
    return budget


__all__ = ["check_budget", "stack_scores"]
