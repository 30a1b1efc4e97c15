"""Memory audit: the bytes an eviction method holds, measured, for every policy x allocator x ratio.

For one example the context is prefilled once (``prefill_context``); every policy scores it once;
for every allocator and compression ratio the kept sets (``allocate`` then ``select``) are stored
three ways and measured:

- ``ragged``: ``RaggedKVCache.physical_bytes()`` after ``evict`` (kept K/V with spare rows + segment
  metadata: what the budget physically costs here);
- ``masked``: what mask-based per-head eviction holds (kvpress with per-head selections, e.g. AdaKV or
  DuoAttention masks): the FULL K/V tensors plus a mask ``[B, Hkv, N]`` per layer (bool by default, or
  the float additive mask of the query dtype), measured as the storages' bytes;
- ``nominal``: kept entries x (D + Dv) x element size (``RaggedKVCache.nominal_bytes()``).

``dense_bytes`` is the physical size of the full (unevicted) K/V tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from forcedweight.deploy.allocate import budget_for, check_compression_ratio, evict, make_allocator, select
from forcedweight.deploy.prefill import Prefill
from forcedweight.deploy.ragged_cache import physical_bytes

STORAGES = ("ragged", "masked", "nominal")


def keep_mask(keep: list[np.ndarray], n: int, device=None, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """The mask of one layer's kept sets: (1, H_kv, n); bool True = kept, or a float additive mask
    (0 = kept, -inf = evicted) when ``dtype`` is floating."""
    h = len(keep)
    seg = torch.arange(h).repeat_interleave(torch.tensor([len(k) for k in keep], dtype=torch.long))
    idx = torch.from_numpy(np.concatenate([np.asarray(k, dtype=np.int64) for k in keep]) if h else np.zeros(0, np.int64))
    kept = torch.zeros(h, n, dtype=torch.bool)
    kept[seg, idx] = True
    if dtype == torch.bool:
        return kept[None].to(device)
    out = torch.zeros(h, n, dtype=dtype).masked_fill(~kept, float("-inf"))
    return out[None].to(device)


def dense_tensors(dense_cache) -> list[torch.Tensor]:
    """Every layer's full keys and values of a transformers ``DynamicCache``."""
    return [t for layer in dense_cache.layers for t in (layer.keys, layer.values)]


def masked_bytes(dense_cache, keep: list[list[np.ndarray]], mask_dtype: torch.dtype = torch.bool) -> int:
    """Physical bytes of mask-over-full-cache storage: the full K/V plus one mask per layer.

    Parameters
    ----------
    dense_cache : DynamicCache with (1, H_kv, N, D) keys / values per layer.
    keep : per layer, per KV head sorted kept indices.
    """
    n = int(dense_cache.layers[0].keys.shape[2])
    masks = [keep_mask(k, n, dense_cache.layers[0].keys.device, mask_dtype) for k in keep]
    return physical_bytes(dense_tensors(dense_cache) + masks)


def kept_sets(alloc, scores: list[np.ndarray], total: int, prefill: Prefill) -> list[list[np.ndarray]]:
    """Per layer, per KV head kept indices of an allocator at a total budget (as the harness does: an
    allocator with ``needs_prefill`` (contourkv) chooses them with the prefill's rows)."""
    if getattr(alloc, "needs_prefill", False):
        return alloc.keep(scores, total, prefill=prefill)
    return select(scores, alloc.allocate(scores, total))


def memory_rows(prefill: Prefill, policies: dict, allocators, ratios, ex_id: str = "0",
                mask_dtype: torch.dtype = torch.bool, seed: int = 0) -> list[dict]:
    """The memory table rows of one prefilled example.

    A sampled policy (``selects``) chooses its own kept sets and bias, as the harness runs it
    (``select(prefill, r, seed)``, allocator ``sampled``): its ragged cache holds the bias, and its
    masked storage an additive float32 mask (``-inf`` evicted, the bias kept) instead of a bool one.

    Parameters
    ----------
    prefill : the example's context prefill (shared by every policy).
    policies : name -> Policy instance; allocators : allocator names; ratios : compression ratios.
    seed : the sampled policies' draws (the harness's ``--seed``).

    Returns
    -------
    list of dicts ``id, context_tokens, policy, allocator, compression_ratio, storage, bytes,
    dense_bytes, kept_entries`` (three storages per policy x allocator x ratio).
    """
    n, L, H = prefill.n_tokens, prefill.n_layers, prefill.n_kv_heads
    dense_bytes = physical_bytes(dense_tensors(prefill.cache))
    rows = []
    for name, pol in policies.items():
        cached = None
        sampled = getattr(pol, "selects", False)
        for r in ratios:
            r = check_compression_ratio(r)
            if not sampled and (cached is None or pol.depends_on_ratio):
                cached = pol.padded_scores(prefill, compression_ratio=r)
            for a in (["sampled"] if sampled else allocators):
                cache = prefill.ragged_cache()
                bias = None
                if sampled:
                    keep, bias, _ = pol.select(prefill, r, seed)
                else:
                    keep = kept_sets(make_allocator(a), cached, budget_for(n, L, H, r), prefill)
                evict(cache, keep, bias)
                measured = {"ragged": int(cache.physical_bytes()), "nominal": int(cache.nominal_bytes()),
                            "masked": int(masked_bytes(prefill.cache, keep,
                                                       mask_dtype if bias is None else torch.float32))}
                kept = int(cache.entries())
                del cache
                for st in STORAGES:
                    rows.append({"id": str(ex_id), "context_tokens": n, "policy": name, "allocator": a,
                                 "compression_ratio": r, "storage": st, "bytes": measured[st],
                                 "dense_bytes": int(dense_bytes), "kept_entries": kept})
    return rows


__all__ = ["STORAGES", "dense_tensors", "keep_mask", "kept_sets", "masked_bytes", "memory_rows"]
