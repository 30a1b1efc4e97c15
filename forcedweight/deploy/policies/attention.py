"""Policies scored from the context's own attention: ``tova``, ``h2o``, ``snapkv``.

The attention rows are the Prefill's (``Prefill.attention``: causal float64 softmax of the captured
post-RoPE queries, equal to the model's eager attention probabilities); the rules are
``forcedweight.core.scores``'s.

- ``tova`` (kvpress TOVAPress): the last context query's attention, averaged over the query heads
  (``heads="all"``, kvpress's and TOVA's own: every KV head gets the same scores; ``heads="group"``
  averages over each KV group's G heads instead); the last entry is padded with the layer's max + 1
  (kvpress: it is never pruned).
- ``h2o``: accumulated attention (``scores.accumulated_attention``) over all the context's queries,
  averaged over each KV group; ``normalize=True`` divides entry i's sum by the N - i queries that
  see it (kvpress ObservedAttentionPress).
- ``snapkv`` (kvpress SnapKVPress): the last ``window = 64`` queries' attention over the entries
  before the window, averaged over the window, ``avg_pool1d(kernel 5, stride 1, padding 2)`` with
  zero padding counted (``scores.observation_window(pooling="avg", reduce="mean")``), averaged over
  each KV group; the window is padded with the layer's max + 1. A context of at most ``window``
  tokens uses a window of N - 1 (kvpress asserts instead).
"""

from __future__ import annotations

import numpy as np

from forcedweight.core import scores
from forcedweight.deploy.policies.base import Policy
from forcedweight.errors import InputError

_ROW_CHUNK = 256  # query rows per attention block (H2O), bounding memory at H_q * 256 * N floats


def _pad_right(x: np.ndarray, n_pad: int) -> np.ndarray:
    """kvpress's ``F.pad(scores, (0, n_pad), value=scores.max() + 1)`` on a layer's (H_kv, M) scores."""
    fill = (float(x.max()) if x.size else 0.0) + 1.0
    return np.concatenate([x, np.full((x.shape[0], n_pad), fill)], axis=-1)


class TOVAPolicy(Policy):
    """Attention of the context's last query (kvpress TOVAPress); query-agnostic (sees the context)."""

    name = "tova"

    def __init__(self, heads: str = "all", **kw):
        super().__init__(**kw)
        if heads not in ("all", "group"):
            raise InputError(f"policy tova: heads must be 'all' or 'group', got {heads!r}")
        self.heads = heads

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        out = []
        h_kv, g = prefill.n_kv_heads, prefill.group_size
        for layer in range(prefill.n_layers):
            last = scores.last_query_attention(prefill.attention(layer, slice(-1, None)))  # (H_q, N)
            last = last[:, :-1]
            if self.heads == "all":
                sc = np.tile(last.mean(axis=0), (h_kv, 1))
            else:
                sc = scores.group_reduce(last, g, "mean")
            out.append(_pad_right(sc, 1))
        return out


class H2OPolicy(Policy):
    """Accumulated attention over the context's queries, GQA group mean; query-agnostic."""

    name = "h2o"

    def __init__(self, normalize: bool = False, **kw):
        super().__init__(**kw)
        self.normalize = bool(normalize)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        n, out = prefill.n_tokens, []
        for layer in range(prefill.n_layers):
            acc = np.zeros((prefill.n_heads, n))
            for r0 in range(0, n, _ROW_CHUNK):
                acc += scores.accumulated_attention(prefill.attention(layer, slice(r0, min(n, r0 + _ROW_CHUNK))))
            if self.normalize:
                acc = acc / np.arange(n, 0, -1, dtype=np.float64)
            out.append(scores.group_reduce(acc, prefill.group_size, "mean"))
        return out


class SnapKVPolicy(Policy):
    """kvpress SnapKVPress: observation window of the last ``window`` queries, avg-pooled, group mean."""

    name = "snapkv"

    def __init__(self, window: int = 64, kernel: int = 5, **kw):
        super().__init__(**kw)
        if int(window) < 1 or int(kernel) < 1 or int(kernel) % 2 == 0:
            raise InputError(f"policy snapkv: window >= 1 and an odd kernel >= 1 needed, got {window}, {kernel}")
        self.window, self.kernel = int(window), int(kernel)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        n = prefill.n_tokens
        w = min(self.window, n - 1)
        if w < 1:
            return [np.zeros((prefill.n_kv_heads, n)) for _ in range(prefill.n_layers)]
        out = []
        for layer in range(prefill.n_layers):
            attn = prefill.attention(layer, slice(n - w, None))[:, :, : n - w]  # (H_q, w, N - w)
            sc = scores.observation_window(attn, window=w, kernel=self.kernel, pooling="avg", reduce="mean")
            out.append(_pad_right(scores.group_reduce(sc, prefill.group_size, "mean"), w))
        return out
