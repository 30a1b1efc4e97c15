"""``compactor`` (Chari & Van Durme 2025; kvpress CompactorPress): approximate leverage of the context's
keys blended with non-causal chunked attention.

Per layer, on the entries between ``sink_size_start = 8`` sinks and ``sink_size_end = 4`` recent ones
(positions ``[8, N - 4)``):

- leverage (kvpress LeverageScorePress): pre-RoPE keys (the cache's keys with RoPE undone), centred
  over the sequence, times a right Gaussian sketch ``Phi`` (d, 48) / sqrt(48) (seeded: one draw per
  (seed, layer, KV head)); ``G = X^T X``; leverage ``diag(X (G + j I)^{-1} X^T)`` clamped at 0 with
  kvpress's Cholesky jitter (``j = 1e-2``, then 1e-1, 1, ... until it factors); z-scored over the layer;
- non-causal chunked attention (kvpress NonCausalAttnPress): the post-RoPE queries and keys of the
  slice tiled in chunks of 256 (the last chunk zero-padded as kvpress does), unscaled ``q.k`` logits,
  softmax inside each chunk, summed over the chunk's queries; averaged over the GQA group; times
  ``||v||``; ``avg_pool1d(3, stride 1, padding 1)``; z-scored over the layer;
- score = ``blending * leverage + attention``, ``blending = compression_ratio`` (kvpress's default;
  0.35 when no ratio is given or the option ``blending`` to fix it), the 8 + 4 protected entries padded
  with the layer's max.

Query-agnostic. ``depends_on_ratio`` is True: call ``score(prefill, compression_ratio=r)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from forcedweight.deploy.policies.base import Policy
from forcedweight.errors import InputError


def sketch(seed: int, layer: int, kv_heads: int, d: int, k: int) -> torch.Tensor:
    """The right Gaussian sketch of one layer, (H_kv, d, k) float64, ``N(0, 1/k)`` entries."""
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(layer)) & 0x7FFFFFFFFFFFFFFF)
    return torch.randn(kv_heads, d, k, generator=gen, dtype=torch.float64) / math.sqrt(k)


def sketched_leverage(keys: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """kvpress ``LeverageScorePress.compute_leverage_scores`` on keys (H, S, d), sketch (H, d, k) → (H, S)."""
    X = (keys - keys.mean(dim=-2, keepdim=True)) @ phi  # (H, S, k)
    G = X.transpose(-2, -1) @ X
    G = 0.5 * (G + G.transpose(-2, -1))
    eye = torch.eye(G.shape[-1], dtype=G.dtype)
    jitter = 1e-2
    for _ in range(5):
        Lc, info = torch.linalg.cholesky_ex(G + jitter * eye, upper=False)
        if bool((info == 0).all()):
            break
        jitter = 10.0 * jitter
    else:
        raise InputError("policy compactor: Cholesky of the sketched key Gram matrix failed")
    inv_xt = torch.cholesky_solve(X.transpose(-2, -1), Lc, upper=False)  # (H, k, S)
    return (X * inv_xt.transpose(-2, -1)).sum(dim=-1).clamp_min(0)


def noncausal_chunked_attention(q: torch.Tensor, k: torch.Tensor, chunk: int) -> torch.Tensor:
    """kvpress ``NonCausalAttnPress.non_causal_chunked_attn``: q, k (H, S, d) → column sums (H, S).

    Unscaled logits; the sequence is zero-padded to a multiple of ``chunk``; in the last chunk padded
    query rows have logits 0 and padded key columns -1e-9 (kvpress's masking, kept as is).
    """
    H, S, d = k.shape
    S_pad = math.ceil(S / chunk) * chunk
    pad = S_pad - S
    qp = torch.cat([q, q.new_zeros(H, pad, d)], dim=1)
    kp = torch.cat([k, k.new_zeros(H, pad, d)], dim=1)
    last = (S // chunk) * chunk if pad > 0 else ((S - 1) // chunk) * chunk
    invalid = torch.arange(last, S_pad) >= S  # (chunk,)
    n_chunks = S_pad // chunk
    dots = qp.view(H, n_chunks, chunk, d) @ kp.view(H, n_chunks, chunk, d).transpose(-2, -1)
    dots[:, -1].masked_fill_(invalid[None, :, None], 0)
    dots[:, -1].masked_fill_(invalid[None, None, :], -1e-9)
    return torch.softmax(dots, dim=-1).sum(dim=-2).reshape(H, S_pad)[:, :S]


def _z(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / x.std().clamp_min(1e-6)


class CompactorPolicy(Policy):
    """kvpress CompactorPress (sinks 8 + 4, chunk 256, sketch 48, blending = compression ratio)."""

    name = "compactor"
    depends_on_ratio = True

    def __init__(self, sink_size_start: int = 8, sink_size_end: int = 4, chunk_size: int = 256,
                 sketch_dimension: int = 48, blending: float | None = None, **kw):
        super().__init__(**kw)
        if min(int(sink_size_start), int(sink_size_end)) < 0 or int(chunk_size) < 1 or int(sketch_dimension) < 1:
            raise InputError("policy compactor: sink sizes >= 0, chunk_size >= 1 and sketch_dimension >= 1 needed")
        self.sink_size_start, self.sink_size_end = int(sink_size_start), int(sink_size_end)
        self.chunk_size, self.sketch_dimension = int(chunk_size), int(sketch_dimension)
        self.blending = None if blending is None else float(blending)

    def score(self, prefill, compression_ratio: float | None = None) -> list[np.ndarray]:
        n, g = prefill.n_tokens, prefill.group_size
        left = min(self.sink_size_start, n)
        right = min(self.sink_size_end, max(0, n - left))
        blend = self.blending if self.blending is not None else compression_ratio
        blend = 0.35 if blend is None else float(blend)
        out = []
        for layer in range(prefill.n_layers):
            if n - left - right < 2:  # nothing to rank
                out.append(np.zeros((prefill.n_kv_heads, n)))
                continue
            mid = slice(left, n - right)
            pre_keys = prefill.unrotate(prefill.keys(layer))[:, mid]  # (H_kv, M, d)
            phi = sketch(self.seed, layer, prefill.n_kv_heads, pre_keys.shape[-1], self.sketch_dimension)
            lev = _z(sketched_leverage(pre_keys.cpu(), phi))
            q = prefill.queries[layer][:, mid].double().cpu()
            k = prefill.keys(layer)[:, mid].double().cpu()
            a = noncausal_chunked_attention(q, k.repeat_interleave(g, dim=0), self.chunk_size)
            a = a.view(prefill.n_kv_heads, g, -1).mean(dim=1)
            a = a * prefill.values(layer)[:, mid].double().cpu().norm(dim=-1)
            a = _z(F.avg_pool1d(a[None], kernel_size=3, padding=1, stride=1)[0])
            sc = blend * lev + a
            out.append(F.pad(sc, (left, right), value=float(sc.max())).numpy())
        return out
