"""Policies that need no attention: ``random``, ``streaming_llm``, ``knorm``.

- ``random``: seeded uniform scores, one stream per (seed, layer, KV head) (kvpress RandomPress draws
  ``torch.rand`` with a global seed; ours is per segment, reproducible).
- ``streaming_llm``: score = position, with 4 sinks by default (kvpress StreamingLLMPress:
  ``n_sink = 4`` + the most recent entries).
- ``knorm``: ``-||k||`` of the post-RoPE keys held in the cache (kvpress KnormPress scores the cache's
  keys, which are post-RoPE).
"""

from __future__ import annotations

import numpy as np

from forcedweight.core import scores
from forcedweight.deploy.policies.base import Policy


class RandomPolicy(Policy):
    """Uniform random scores from ``default_rng([seed, layer * H_kv + head])``; query-agnostic."""

    name = "random"

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        n, h = prefill.n_tokens, prefill.n_kv_heads
        return [np.stack([scores.uniform_random(n, self.seed, layer * h + j) for j in range(h)])
                for layer in range(prefill.n_layers)]


class StreamingLLMPolicy(Policy):
    """Sinks + the most recent entries: score = position (``scores.position``), 4 sinks by default."""

    name = "streaming_llm"

    def __init__(self, sinks: int = 4, **kw):
        super().__init__(sinks=sinks, **kw)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        pos = scores.position(prefill.n_tokens)
        return [np.tile(pos, (prefill.n_kv_heads, 1)) for _ in range(prefill.n_layers)]


class KnormPolicy(Policy):
    """``-||k_i||`` of each KV head's post-RoPE cached keys (``scores.knorm``); query-agnostic."""

    name = "knorm"

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        return [scores.knorm(prefill.keys(layer).double().cpu().numpy()) for layer in range(prefill.n_layers)]
