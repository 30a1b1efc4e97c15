"""Storages of one fixed per-head selection, answered through the model (the enforcement experiment).

- **ragged** (enforced): ``RaggedKVCache`` after ``evict`` — only the kept entries stay in memory;
- **masked** (how mask-based pipelines store it): the full dense cache kept, plus a bool mask per
  (layer, KV head, entry); the evicted entries are masked out of every later attention call by an
  additive ``-inf`` bias (:func:`masked_attention_forward`, registered with transformers'
  ``AttentionInterface`` as ``"forcedweight_masked"``). It answers exactly like the ragged cache and
  holds the full cache's bytes;
- **token** storage (a cache laid out per token, all heads together, as a dense non-ragged cache):
  :func:`token_cache` keeps, per layer, a set of token positions for every head. The *union* over the
  heads of a per-head selection meets the nominal per-head count on every head but holds more
  entries than the nominal budget (unenforced); :func:`token_topk` enforces the nominal budget on
  the same scores at token level (``budget / H_kv`` tokens, rounded down, shared over the layers in
  proportion to their budgets; per layer those of largest head-maximum score).

Bytes are the sizes of the storages held (``ragged_cache.physical_bytes``), masks included.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from forcedweight.compat import attention_implementation
from forcedweight.core.operator import top_s
from forcedweight.deploy.contourkv import largest_remainder
from forcedweight.deploy.features import layer_features
from forcedweight.deploy.ragged_cache import physical_bytes
from forcedweight.errors import InputError

ATTENTION_NAME = "forcedweight_masked"
# per layer (H_kv, N_context) bool keep masks, or None (causal attention over everything held)
_KEEP: contextvars.ContextVar[list | None] = contextvars.ContextVar("forcedweight_masked_keep", default=None)


def masked_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA attention with a bottom-right causal mask and, when masks are active, ``-inf`` on the
    context entries the query's KV head evicted.

    Parameters
    ----------
    query : (B, H_q, L, d); key, value : (B, H_kv, T, d) dense (the context's N entries first).
    """
    feats = layer_features(module, kwargs, query.shape[1], "the masked and token storages")
    if not feats.plain:  # SDPA below has no soft-cap or sinks, the mask no window, the cache clone truncates
        raise InputError(f"--model: layer {getattr(module, 'layer_idx', '?')} has {', '.join(feats.names())}: "
                         "the masked and token storages answer for plain causal attention only (the ragged cache "
                         "supports it)")
    keep = _KEEP.get()
    _, hq, q_len, _ = query.shape
    t = key.shape[2]
    rows = torch.arange(q_len, device=query.device)[:, None] + (t - q_len)
    allowed = (torch.arange(t, device=query.device)[None, :] <= rows)[None]  # (1, L, T)
    if keep is not None:
        k = keep[int(module.layer_idx)].to(query.device)  # (H_kv, N)
        full = torch.ones(k.shape[0], t, dtype=torch.bool, device=query.device)
        full[:, : k.shape[1]] = k
        allowed = allowed & full.repeat_interleave(hq // k.shape[0], dim=0)[:, None, :]  # (H_q, L, T)
    mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(~allowed, float("-inf"))
    return sdpa_attention_forward(module, query, key, value, mask[None], dropout=dropout, scaling=scaling, **kwargs)


AttentionInterface.register(ATTENTION_NAME, masked_attention_forward)


@contextlib.contextmanager
def masked_attention(model, keep: list | None):
    """Run ``model`` with :func:`masked_attention_forward` and ``keep`` (per layer (H_kv, N) bool)."""
    with attention_implementation(model, ATTENTION_NAME, (_KEEP, keep)):
        yield


def keep_masks(keep: list[list[np.ndarray]], n: int) -> list[torch.Tensor]:
    """Per layer (H_kv, N) bool masks of kept index arrays per KV head."""
    out = []
    for heads in keep:
        m = torch.zeros(len(heads), n, dtype=torch.bool)
        for h, k in enumerate(heads):
            m[h, torch.as_tensor(np.asarray(k, dtype=np.int64))] = True
        out.append(m)
    return out


@dataclass
class MaskedStorage:
    """The full dense cache plus the kept-entry masks (per layer (H_kv, N) bool)."""

    cache: DynamicCache
    keep: list[torch.Tensor]

    def physical_bytes(self) -> int:
        """Bytes of the dense K/V storages and the masks."""
        ts = [t for layer in self.cache.layers for t in (layer.keys, layer.values)]
        return physical_bytes(ts) + physical_bytes(self.keep)

    def entries(self) -> int:
        return int(sum(int(m.sum()) for m in self.keep))


def _clone(cache: DynamicCache, model, select=None) -> DynamicCache:
    out = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        k, v = layer.keys, layer.values
        if select is not None:
            idx = torch.as_tensor(np.asarray(select[i], dtype=np.int64), device=k.device)
            k, v = k.index_select(2, idx), v.index_select(2, idx)
        out.update(k.clone().contiguous(), v.clone().contiguous(), i)
    return out


def masked_storage(prefill, keep: list[list[np.ndarray]]) -> MaskedStorage:
    """The masked storage of ``keep`` (per layer, per KV head index arrays) over a copy of the
    Prefill's cache."""
    return MaskedStorage(_clone(prefill.cache, prefill.model), keep_masks(keep, prefill.n_tokens))


def token_union(keep: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Per layer the sorted union over the KV heads of their kept positions."""
    return [np.unique(np.concatenate([np.asarray(k, dtype=np.int64) for k in heads])) for heads in keep]


def token_topk(scores: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Per layer the positions of largest head-maximum score (``top_s``: ties to the lower index), as
    many tokens as the layer's share of the nominal budget: ``floor(counts.sum() / H_kv)`` tokens in
    all, split over the layers in proportion to ``counts[layer].sum()`` by largest remainders
    (``contourkv.largest_remainder``; no layer above its N). So ``H_kv`` × the tokens kept never
    exceeds ``counts.sum()`` — the nominal budget enforced at token level.

    Parameters
    ----------
    scores : per layer (H_kv, N) scores, higher = keep.
    counts : (L, H_kv) int, the per-head counts of the selection.
    """
    counts = np.asarray(counts, dtype=np.int64)
    tokens = largest_remainder(int(counts.sum()) // counts.shape[1], counts.sum(axis=1).astype(np.float64),
                               np.array([s.shape[1] for s in scores], dtype=np.int64))
    return [top_s(np.max(s, axis=0), int(t)) for s, t in zip(scores, tokens)]


def token_cache(prefill, tokens: list[np.ndarray]) -> DynamicCache:
    """A dense cache holding, per layer, the context entries at ``tokens[layer]`` for every head
    (post-RoPE keys, so positions stay those of the context)."""
    return _clone(prefill.cache, prefill.model, tokens)


def dense_bytes(cache: DynamicCache) -> int:
    """Bytes of a DynamicCache's K/V storages."""
    return physical_bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])


__all__ = ["ATTENTION_NAME", "MaskedStorage", "dense_bytes", "keep_masks", "masked_attention",
           "masked_attention_forward", "masked_storage", "token_cache", "token_topk", "token_union"]
