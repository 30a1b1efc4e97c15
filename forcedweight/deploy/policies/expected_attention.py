"""``expected_attention`` (kvpress ExpectedAttentionPress): attention that future queries are expected to
pay each entry, from statistics of the context's queries.

Per layer (shapes: d the head dim, G the GQA group size):

1. pre-RoPE queries ``q_t`` of the context positions ``t >= n_sink`` (the Prefill's post-RoPE queries
   with RoPE undone, ``Prefill.unrotate``), their mean ``mu`` (H_q, d) and biased covariance ``C``
   (H_q, d, d) (divided by the number of queries);
2. the RoPE rotation averaged over the next ``n_future_positions`` positions ``N .. N+511``,
   ``R = mean_t (diag(cos_t) + diag(sin_t) P)`` with ``P`` the ``rotate_half`` matrix; ``mu <- R mu``,
   ``C <- R C R^T``;
3. for every post-RoPE key ``k_i`` (i >= n_sink) of the query head's KV head, the expected logit
   ``mu.k_i / sqrt(d) + k_i^T C k_i / (2 d)``, softmaxed over i, averaged over the G heads of the group;
4. times ``||v_i||`` (``use_vnorm``; after adding ``epsilon``), and the first ``n_sink`` entries padded
   with the layer's max + 1 (never pruned).

Query-agnostic: the statistics are the context's own queries.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from forcedweight.deploy.policies.base import Policy
from forcedweight.errors import InputError


def averaged_rope_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``mean_t (diag(cos_t) + diag(sin_t) P)``, (d, d), from cos/sin (T, d); P maps x to rotate_half(x)."""
    d = cos.shape[-1]
    eye = torch.eye(d, dtype=cos.dtype, device=cos.device)
    P = torch.zeros(d, d, dtype=cos.dtype, device=cos.device)
    P[d // 2:, : d // 2] = torch.eye(d // 2)
    P[: d // 2, d // 2:] = -torch.eye(d // 2)
    return (cos[:, :, None] * eye + sin[:, :, None] * P).mean(dim=0)


class ExpectedAttentionPolicy(Policy):
    """kvpress ExpectedAttentionPress (defaults: n_future_positions 512, n_sink 4, covariance, v-norm)."""

    name = "expected_attention"

    def __init__(self, n_future_positions: int = 512, n_sink: int = 4, use_covariance: bool = True,
                 use_vnorm: bool = True, epsilon: float = 0.0, **kw):
        super().__init__(**kw)
        if int(n_future_positions) < 1 or int(n_sink) < 0:
            raise InputError("policy expected_attention: n_future_positions >= 1 and n_sink >= 0 needed")
        self.n_future_positions, self.n_sink = int(n_future_positions), int(n_sink)
        self.use_covariance, self.use_vnorm, self.epsilon = bool(use_covariance), bool(use_vnorm), float(epsilon)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        n, g = prefill.n_tokens, prefill.group_size
        sink = min(self.n_sink, n - 1)
        cos, sin = prefill.rope(np.arange(n, n + self.n_future_positions))
        R = averaged_rope_matrix(cos, sin)  # (d, d) float64
        out = []
        for layer in range(prefill.n_layers):
            q = prefill.unrotate(prefill.queries[layer])[:, sink:]  # (H_q, N - sink, d) pre-RoPE
            mu = q.mean(dim=1)  # (H_q, d)
            keys = prefill.keys(layer).double()[:, sink:].repeat_interleave(g, dim=0)  # (H_q, M, d)
            d = keys.shape[-1]
            logits = torch.einsum("hd,hmd->hm", mu @ R.T, keys) / math.sqrt(d)
            if self.use_covariance:
                c = q - mu[:, None]
                cov = torch.einsum("hti,htj->hij", c, c) / q.shape[1]
                cov = R @ cov @ R.T
                logits = logits + torch.einsum("hmi,hij,hmj->hm", keys, cov, keys) / d / 2
            sc = torch.softmax(logits, dim=-1)
            sc = sc.reshape(-1, g, sc.shape[-1]).mean(dim=1)  # (H_kv, M)
            if self.use_vnorm:
                sc = (sc + self.epsilon) * prefill.values(layer).double()[:, sink:].norm(dim=-1)
            sc = sc.cpu().numpy()
            fill = float(sc.max()) + 1.0
            out.append(np.concatenate([np.full((sc.shape[0], sink), fill), sc], axis=-1))
        return out
