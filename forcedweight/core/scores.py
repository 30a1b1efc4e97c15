"""Eviction score rules, defined once (higher score = keep).

The row selectors (``forcedweight.selectors``), the probabilistic proposals
(``forcedweight.probabilistic.proposals``) and the deploy policies (``forcedweight.deploy``) all
score entries through these functions, so e.g. "SnapKV" means the same numbers everywhere.
Every rule is a pure function over float64 arrays; leading batch axes (heads, layers) pass through:

- ``knorm``: ``-||k_i||`` (keys of small norm kept);
- ``accumulated_attention`` (H2O): the attention an entry received, summed over the query rows;
- ``last_query_attention`` (TOVA): the attention of the last query row;
- ``observation_window`` (SnapKV): the last ``window`` query rows' attention summed (or averaged),
  then 1-D pooled over neighbouring entries (max or average);
- ``position`` (StreamingLLM's order): later entries score higher (with sinks: ``pad_kept``);
- ``uniform_random``: seeded uniform scores (the random baseline), one stream per (seed, row);
- ``group_reduce``: query-head scores → one score per KV head under GQA (mean or max over a group);
- ``pad_kept``: sinks and a recent window as ``+inf`` padding of any score (the kvpress habit), so
  no rule special-cases them.

The tie rule that turns scores into a kept set is ``forcedweight.core.operator.top_s``.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import maximum_filter1d, uniform_filter1d


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def knorm(keys) -> np.ndarray:
    """``-||k_i||``: keys (..., N, d) → scores (..., N)."""
    return -np.linalg.norm(_arr(keys), axis=-1)


def accumulated_attention(attn) -> np.ndarray:
    """H2O: column sums of attention rows. attn (..., R, N) (zeros where a row cannot see) → (..., N)."""
    return _arr(attn).sum(axis=-2)


def last_query_attention(attn) -> np.ndarray:
    """TOVA: the last query row's attention. attn (..., R, N) → (..., N)."""
    return _arr(attn)[..., -1, :].copy()


def pool1d(x, kernel: int, pooling: str = "max") -> np.ndarray:
    """1-D pooling over the last axis with 'same' output length.

    ``max``: running maximum over ``kernel`` neighbours, edges repeated (``mode="nearest"``).
    ``avg``: running mean over ``kernel`` neighbours with zero padding counted in the mean, as
    ``torch.nn.functional.avg_pool1d(kernel, stride=1, padding=kernel // 2)`` (kvpress's SnapKV;
    ``kernel`` odd).
    """
    x = _arr(x)
    if kernel < 1:
        raise ValueError(f"pooling kernel must be >= 1, got {kernel}")
    if kernel == 1:
        return x.copy()
    if pooling == "max":
        return maximum_filter1d(x, size=kernel, axis=-1, mode="nearest")
    if pooling == "avg":
        if kernel % 2 == 0:
            raise ValueError(f"avg pooling needs an odd kernel, got {kernel}")
        return uniform_filter1d(x, size=kernel, axis=-1, mode="constant", cval=0.0)
    raise ValueError(f"pooling must be 'max' or 'avg', got {pooling!r}")


def observation_window(attn, window: int = 8, kernel: int = 5, pooling: str = "max",
                       reduce: str = "sum") -> np.ndarray:
    """SnapKV: the last ``window`` rows of attention (..., R, N), summed or averaged, then pooled.

    Returns (..., N). ``reduce="mean"`` divides by the window (kvpress averages); the order of the
    entries is the same either way.
    """
    a = _arr(attn)
    if window < 1:
        raise ValueError(f"observation window must be >= 1, got {window}")
    w = a[..., -window:, :]
    col = w.sum(axis=-2) if reduce == "sum" else w.mean(axis=-2)
    return pool1d(col, kernel, pooling)


def position(n: int) -> np.ndarray:
    """StreamingLLM's order: entry i scores i (the most recent kept first), shape (n,)."""
    return np.arange(int(n), dtype=np.float64)


def uniform_random(n: int, seed: int = 0, stream: int = 0) -> np.ndarray:
    """Random baseline scores, shape (n,): uniform on [0, 1) from ``default_rng([seed, stream])``
    (seed taken mod 2**32, stream mod 2**48), so each (seed, row) has its own reproducible draw."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(stream) & 0xFFFFFFFFFFFF])
    return rng.random(int(n))


def group_reduce(scores, group_size: int, how: str = "mean") -> np.ndarray:
    """Query-head scores (..., H_q, N) → KV-head scores (..., H_q // G, N), heads ``g*G .. g*G+G-1``
    forming KV group g (transformers' ``repeat_kv`` layout); ``how`` = "mean" or "max"."""
    x = _arr(scores)
    hq = x.shape[-2]
    if group_size < 1 or hq % group_size:
        raise ValueError(f"{hq} query heads do not split into groups of {group_size}")
    x = x.reshape(*x.shape[:-2], hq // group_size, group_size, x.shape[-1])
    if how == "mean":
        return x.mean(axis=-2)
    if how == "max":
        return x.max(axis=-2)
    raise ValueError(f"group reduction must be 'mean' or 'max', got {how!r}")


def pad_kept(scores, sinks: int = 0, recent: int = 0) -> np.ndarray:
    """Pad scores (..., N) with ``+inf`` on the first ``sinks`` and the last ``recent`` entries."""
    sc = np.array(scores, dtype=np.float64)
    n = sc.shape[-1]
    if sinks:
        sc[..., : min(int(sinks), n)] = np.inf
    if recent:
        sc[..., max(0, n - int(recent)) :] = np.inf
    return sc


__all__ = ["accumulated_attention", "group_reduce", "knorm", "last_query_attention", "observation_window",
           "pad_kept", "pool1d", "position", "uniform_random"]
