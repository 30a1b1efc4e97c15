"""Allocators: turn per-(layer, KV head) scores and one total budget into kept counts (docs/concepts.md).

An allocator returns an (L, H_kv) int64 array of counts that sums to the budget exactly, each count
at most N and at least the segment's *floor* = its number of ``+inf`` scores (the sinks and recent
window padded by ``Policy.padded_scores``); a budget that cannot hold the floors raises InputError.
The kept entries are then each segment's top-``count`` scores (``select``, through
``core.operator.top_s``: ties to the lower index).

- ``uniform``: every segment keeps the same count; the remainder ``budget mod (L*H_kv)`` goes one each
  to the first segments in (layer, head) order.
- ``adakv`` (FFY0/AdaKV, kvpress AdaKVPress): each layer keeps its uniform share of the budget,
  chosen by one top-k across the layer's heads, after every head first keeps its top
  ``floor(alpha * share_per_head)`` entries (at least 1 when the share is positive), alpha = 0.2.
- ``global`` (KVzip): one threshold over all layers and heads: the budget's top scores over the
  flattened (layer, head, entry) array, ties to the lower flattened index (= ``rank_order``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from forcedweight.core.operator import rank_order, top_s
from forcedweight.deploy.contourkv import ContourKVAllocator
from forcedweight.deploy.segment_scores import check_budget, stack_scores
from forcedweight.errors import InputError


def floors(scores: list[np.ndarray]) -> np.ndarray:
    """(L, H_kv) int64: each segment's count of ``+inf`` scores (entries it must keep)."""
    return np.isposinf(stack_scores(scores)).sum(axis=-1).astype(np.int64)


def _check_floors(counts: np.ndarray, x: np.ndarray) -> np.ndarray:
    fl = np.isposinf(x).sum(axis=-1)
    bad = np.argwhere(counts < fl)
    if bad.size:
        layer, head = (int(v) for v in bad[0])
        raise InputError(
            f"--budget: segment (layer {layer}, KV head {head}) gets {int(counts[layer, head])} entries, "
            f"below its sinks + recent window ({int(fl[layer, head])})"
        )
    return counts


class Allocator:
    """Base class: ``allocate(scores, budget) -> (L, H_kv) int64`` counts (see the module docstring)."""

    name: ClassVar[str] = "allocator"

    def __init__(self, **options):
        if options:
            raise InputError(f"allocator {self.name}: unknown option(s) {', '.join(sorted(options))}")

    def allocate(self, scores: list[np.ndarray], budget: int) -> np.ndarray:
        raise NotImplementedError


def uniform_counts(n_segments: int, budget: int) -> np.ndarray:
    """(n_segments,) int64: ``budget // n`` each, the remainder one each to the first segments."""
    base, rem = divmod(int(budget), int(n_segments))
    counts = np.full(n_segments, base, dtype=np.int64)
    counts[:rem] += 1
    return counts


class UniformAllocator(Allocator):
    """Every (layer, KV head) keeps the same count (remainder to the first segments in order)."""

    name = "uniform"

    def allocate(self, scores, budget):
        x = stack_scores(scores)
        budget = check_budget(x, budget)
        L, H, _ = x.shape
        return _check_floors(uniform_counts(L * H, budget).reshape(L, H), x)


def adakv_layer(x: np.ndarray, layer_budget: int, alpha: float) -> np.ndarray:
    """AdaKV inside one layer: x (H, N) scores, layer budget → (H,) int64 counts.

    Every head keeps its top ``n_safe = floor(alpha * (layer_budget // H))`` entries (at least 1 when
    ``layer_budget // H > 0`` and alpha > 0), then the rest of the layer's budget is the top scores
    over all heads' remaining entries (ties to the lower (head, entry) index). The ``+inf`` entries
    (sinks, recent window) rank above the protected ones, so a budget that holds every head's
    ``+inf`` entries keeps them all, whatever the other heads' protected entries.
    """
    H, N = x.shape
    share = layer_budget // H
    n_safe = int(share * alpha)
    if alpha > 0:
        n_safe = max(1, n_safe) if share > 0 else 0
    y = x.copy()
    for h in range(H):
        if n_safe:
            top = top_s(x[h], n_safe)
            y[h, top[~np.isposinf(x[h, top])]] = np.finfo(np.float64).max  # protected (as kvpress)
    kept = rank_order(y.reshape(-1))[:layer_budget]
    return np.bincount(kept // N, minlength=H).astype(np.int64)


class AdaKVAllocator(Allocator):
    """Per layer, one top-k across its heads with a per-head floor of ``alpha`` of the uniform share."""

    name = "adakv"

    def __init__(self, alpha: float = 0.2, **options):
        super().__init__(**options)
        if not 0.0 <= float(alpha) <= 1.0:
            raise InputError(f"allocator adakv: alpha must be in [0, 1], got {alpha!r}")
        self.alpha = float(alpha)

    def allocate(self, scores, budget):
        x = stack_scores(scores)
        budget = check_budget(x, budget)
        L, H, _ = x.shape
        per_layer = uniform_counts(L * H, budget).reshape(L, H).sum(axis=1)
        for layer in range(L):
            need = int(np.isposinf(x[layer]).sum())
            if per_layer[layer] < need:
                raise InputError(f"--budget: layer {layer} gets {int(per_layer[layer])} entries, "
                                 f"below its sinks + recent window ({need})")
        counts = np.stack([adakv_layer(x[layer], int(per_layer[layer]), self.alpha) for layer in range(L)])
        return _check_floors(counts, x)


class GlobalAllocator(Allocator):
    """One threshold over all layers and heads (KVzip): the budget's top scores overall."""

    name = "global"

    def allocate(self, scores, budget):
        x = stack_scores(scores)
        budget = check_budget(x, budget)
        L, H, N = x.shape
        kept = rank_order(x.reshape(-1))[:budget]
        return _check_floors(np.bincount(kept // N, minlength=L * H).astype(np.int64).reshape(L, H), x)


ALLOCATORS: dict[str, type[Allocator]] = {c.name: c for c in (UniformAllocator, AdaKVAllocator, GlobalAllocator,
                                                            ContourKVAllocator)}


def make_allocator(name: str, **options) -> Allocator:
    """The allocator ``name`` built with ``options`` (InputError naming it when unknown)."""
    cls = ALLOCATORS.get(name)
    if cls is None:
        raise InputError(f"--allocator: unknown allocator {name!r} (known: {', '.join(sorted(ALLOCATORS))})")
    return cls(**options)


def check_compression_ratio(compression_ratio) -> float:
    """``compression_ratio`` as a float in [0, 1) (the fraction evicted); InputError naming the option."""
    try:
        r = float(compression_ratio)
    except (TypeError, ValueError):
        raise InputError(f"--compression-ratio: {compression_ratio!r} is not a number") from None
    if not 0.0 <= r < 1.0:
        raise InputError(f"--compression-ratio: {compression_ratio!r} outside [0, 1) (the fraction evicted)")
    return r


def budget_for(n_tokens: int, n_layers: int, n_kv_heads: int, compression_ratio: float) -> int:
    """Total kept entries at ``compression_ratio`` (fraction evicted, in [0, 1)).

    Per (layer, KV head) kvpress keeps ``max(1, int(N * (1 - r)))`` (``compute_n_kept``); the total is
    that times ``n_layers * n_kv_heads``, so ``uniform`` reproduces kvpress's per-head count exactly.
    """
    r = check_compression_ratio(compression_ratio)
    if int(n_tokens) < 1:
        raise InputError("--compression-ratio: empty context")
    per_head = max(1, int(int(n_tokens) * (1 - r)))
    return per_head * int(n_layers) * int(n_kv_heads)


def select(scores: list[np.ndarray], counts: np.ndarray) -> list[list[np.ndarray]]:
    """Kept indices per layer, per KV head: each segment's top-``count`` scores (``core.operator.top_s``),
    sorted int64 arrays."""
    counts = np.asarray(counts)
    if counts.shape != (len(scores), np.shape(scores[0])[0]):
        raise InputError(f"select: counts of shape {counts.shape} do not match the scores' (L, H_kv)")
    return [[top_s(np.asarray(s[h], dtype=np.float64), int(counts[layer, h])) for h in range(s.shape[0])]
            for layer, s in enumerate(scores)]


def budget_ratio(budget: float, n_tokens: int) -> float:
    """The compression ratio a ``--budget`` of kept entries per KV head asks for on ``n_tokens`` entries:
    ``1 - min(round(budget), N) / N`` (a sampled policy draws at it; the report tables and pairs by it)."""
    return 1.0 - min(round(float(budget)), int(n_tokens)) / int(n_tokens)


def evict(cache, keep: list[list[np.ndarray]], bias: list | None = None) -> None:
    """Evict ``cache`` (a RaggedKVCache holding batch 1) to ``keep``: ``cache.evict(layer, keep[layer],
    bias[layer])`` (``bias``: per layer, per KV head float32 arrays, a sampled policy's; None: no bias)."""
    for layer, heads in enumerate(keep):
        cache.evict(layer, [torch.as_tensor(np.asarray(k, dtype=np.int64)) for k in heads],
                    None if bias is None else bias[layer])


__all__ = ["ALLOCATORS", "AdaKVAllocator", "Allocator", "GlobalAllocator", "UniformAllocator", "adakv_layer",
           "budget_for", "budget_ratio", "evict", "floors", "make_allocator", "select", "uniform_counts"]
