"""The dropped-mass statistic on a cache (paper 004 §2.3, §4): per (layer, KV head), the attention mass
that a kept set leaves out.

For one attention row ``p`` (a causal softmax over the context's N entries) and a kept set ``K``,
the dropped mass is ``1 - sum_{j in K} p_j``. For a (layer, KV head) segment it is the mean over the
rows the scoring pass already computes (here the last ``window`` context queries, as SnapKV reads
them) and over the KV head's ``G`` query heads (GQA).

Two computations, equal up to rounding:

- :func:`dropped_mass` from attention probabilities already at hand (``Prefill.attention`` rows,
  float64): O(N) per row once the row exists;
- :func:`dropped_mass_onepass` straight from queries and keys in one pass: the row's logits
  ``q . K^T`` (O(N d)), their softmax and the kept entries' sum (O(N)) — nothing kept beyond the
  call. Its cost against one dense attention layer is measured by ``benchmarks/bench_contourkv.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from forcedweight.errors import InputError

WINDOW = 64  #: rows of the statistic: the last WINDOW context queries (SnapKV's observation window)


def window_rows(prefill, window: int = WINDOW) -> list[np.ndarray]:
    """Per layer (H_q, W, N) float64 attention of the last ``W = min(window, N)`` context queries."""
    n = prefill.n_tokens
    w = max(1, min(int(window), n))
    return [prefill.attention(layer, slice(n - w, None)) for layer in range(prefill.n_layers)]


def keep_mask(keep: list[np.ndarray], n: int) -> np.ndarray:
    """(H_kv, N) bool from kept index lists per KV head."""
    mask = np.zeros((len(keep), n), dtype=bool)
    for h, k in enumerate(keep):
        mask[h, np.asarray(k, dtype=np.int64)] = True
    return mask


def dropped_mass(rows: np.ndarray, keep: list[np.ndarray]) -> np.ndarray:
    """Dropped mass per KV head of one layer.

    Parameters
    ----------
    rows : (H_q, R, N) attention probabilities (each row sums to 1 over the entries it sees).
    keep : H_kv kept index arrays (query head h reads KV head ``h // (H_q // H_kv)``).

    Returns
    -------
    (H_kv,) float64: ``1 - mean_{g, r} sum_{j in keep[h]} rows[h*G + g, r, j]``.
    """
    rows = np.asarray(rows, dtype=np.float64)
    hq, _, n = rows.shape
    hkv = len(keep)
    if hkv == 0 or hq % hkv:
        raise InputError(f"dropped mass: {hq} query heads do not group into {hkv} KV heads")
    g = hq // hkv
    mask = np.repeat(keep_mask(keep, n), g, axis=0)  # (H_q, N)
    kept = np.einsum("hrn,hn->hr", rows, mask.astype(np.float64))  # (H_q, R)
    return 1.0 - kept.reshape(hkv, g, -1).mean(axis=(1, 2))


def segment_dropped_mass(rows: list[np.ndarray], keep: list[list[np.ndarray]]) -> np.ndarray:
    """(L, H_kv) dropped mass of ``keep[layer][head]`` over each layer's ``rows[layer]`` (H_q, R, N)."""
    if len(rows) != len(keep):
        raise InputError(f"dropped mass: {len(rows)} layers of rows but {len(keep)} layers of kept sets")
    return np.stack([dropped_mass(r, k) for r, k in zip(rows, keep)])


def dropped_mass_onepass(query: torch.Tensor, key: torch.Tensor, kept: torch.Tensor, scaling: float,
                         positions: torch.Tensor | None = None) -> torch.Tensor:
    """Dropped mass per KV head from queries and keys, one pass over the keys per row.

    Parameters
    ----------
    query : (H_q, R, d) post-RoPE queries of the rows.
    key : (H_kv, N, d) post-RoPE keys.
    kept : (H_kv, N) bool, the kept entries.
    scaling : the attention scaling (``Prefill.scaling``).
    positions : (R,) long, each row's position (it sees keys ``<= position``); None = all N keys.

    Returns
    -------
    (H_kv,) tensor in the query's dtype: ``1 - mean_{g, r} sum_{j kept} softmax(q_r . K^T)_j``.
    """
    hq, r, d = query.shape
    hkv, n, _ = key.shape
    g = hq // hkv
    logits = torch.matmul(query.reshape(hkv, g * r, d), key.transpose(-1, -2)) * scaling  # (H_kv, G*R, N)
    logits = logits.reshape(hkv, g, r, n)
    if positions is not None:
        future = torch.arange(n, device=key.device)[None, :] > positions.to(key.device)[:, None]  # (R, N)
        logits = logits.masked_fill(future[None, None], float("-inf"))
    p = torch.softmax(logits, dim=-1)  # the rows themselves, never kept beyond this call
    kept_mass = (p * kept[:, None, None, :].to(p.dtype)).sum(dim=-1)  # (H_kv, G, R)
    return 1.0 - kept_mass.mean(dim=(1, 2))


__all__ = ["WINDOW", "dropped_mass", "dropped_mass_onepass", "keep_mask", "segment_dropped_mass", "window_rows"]
