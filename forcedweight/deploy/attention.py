"""The ``"forcedweight_ragged"`` attention function, registered with ``transformers.AttentionInterface``.

With a :class:`~forcedweight.deploy.ragged_cache.RaggedKVCache` the layer's ``update`` returns a
:class:`~forcedweight.deploy.ragged_cache.RaggedKV` view instead of dense tensors, and this function
computes attention on it:

- decode (query length 1): :func:`forcedweight.kernels.segment_decode` over the segments in place in
  the cache's buffers (Triton on CUDA, PyTorch on CPU: a strided view when the layout is uniform),
  bias included; nothing proportional to the entries held is copied;
- prefill / several new tokens: causal attention with torch SDPA. With an empty past this is plain
  causal attention over the new tokens' states; after a past exists, each segment's kept entries (with
  their bias) are gathered, padded to a common length and masked, and new token ``i`` also sees new
  tokens ``<= i``.

Attention-logit soft-capping, learned sinks and a sliding window shorter than the tokens processed
are refused with one line naming them (:func:`forcedweight.deploy.features.refuse_unsupported`).

Without a ragged cache (dense tensors) it falls back to transformers' SDPA attention. Padding masks are
not supported (transformers builds no mask for a custom attention name): batch only equal-length prompts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from forcedweight.deploy.features import refuse_unsupported
from forcedweight.deploy.ragged_cache import RaggedKV
from forcedweight.kernels import segment_decode
from forcedweight.kernels.torch_decode import segment_decode_torch

ATTENTION_NAME = "forcedweight_ragged"


def ragged_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention over a :class:`RaggedKV` view (see the module docstring).

    Parameters
    ----------
    query : Tensor [B, Hq, L, D]
    key, value : RaggedKV (ragged cache), or dense Tensors [B, Hkv, N, D] (fallback to SDPA)

    Returns
    -------
    (out [B, L, Hq, Dv], None)
    """
    # soft-cap, sinks and a window shorter than the tokens processed are refused (deploy.features)
    refuse_unsupported(module, kwargs, key.seen if isinstance(key, RaggedKV) else key.shape[2])
    if not isinstance(key, RaggedKV):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    view = key
    B, Hq, L, D = query.shape
    scale = D**-0.5 if scaling is None else scaling
    if L == 1:
        backend = getattr(getattr(module, "config", None), "ragged_decode_backend", None)
        if backend == "torch" or (backend is None and not query.is_cuda):  # the cache built the extents:
            out, _ = segment_decode_torch(  # nothing to validate, straight to the PyTorch path
                query[:, :, 0, :], view.k, view.v, view.starts, view.lengths, view.bias, scale,
                host=(view.host_starts, view.host_lengths), return_lse=False,
            )
            return out.unsqueeze(1), None
        out, _ = segment_decode(
            query[:, :, 0, :], view.k, view.v, view.starts, view.lengths, view.bias, sm_scale=scale,
            check=False, host=(view.host_starts, view.host_lengths), return_lse=False,  # the cache built them
            max_len=view.max_len, backend=backend,
        )
        return out.to(query.dtype).unsqueeze(1), None
    return _prefill(query, view, scale), None


def _prefill(query, view: RaggedKV, scale: float):
    """Causal attention of L new tokens over each segment's past entries plus the new tokens."""
    B, Hq, L, D = query.shape
    S, Hkv = view.batch * view.kv_heads, view.kv_heads
    G = Hq // Hkv
    Dv = view.v.shape[1]
    P = view.max_len - L  # the longest past
    if P == 0:  # no past anywhere (a prompt): plain causal attention over the new states
        out = F.scaled_dot_product_attention(query, view.new_k.to(query.dtype), view.new_v.to(query.dtype),
                                             is_causal=True, scale=scale, enable_gqa=G > 1)
        return out.transpose(1, 2).contiguous()
    dev = query.device
    past = view.lengths - L  # [S]
    # padded [S, P + L] slots: past entries left-aligned in [0, past_s), new tokens at [P, P + L)
    slot = torch.arange(P + L, device=dev)
    pos_in_seg = torch.where(slot[None, :] < P, slot[None, :], slot[None, :] - P + past[:, None])  # [S, P+L]
    valid = (slot[None, :] < past[:, None]) | (slot[None, :] >= P)
    src = torch.where(valid, view.starts[:, None] + pos_in_seg, 0)
    flat = src.reshape(-1)
    kp = view.k.index_select(0, flat).view(S, P + L, D).masked_fill(~valid[..., None], 0)  # [S, P+L, D]
    vp = view.v.index_select(0, flat).view(S, P + L, Dv).masked_fill(~valid[..., None], 0)
    q = query.reshape(S, G, L, D)
    causal = slot[None, :] <= (P + torch.arange(L, device=dev))[:, None]  # [L, P+L]
    allowed = valid[:, None, :] & causal[None]  # [S, L, P+L]
    mask = torch.zeros(S, L, P + L, dtype=query.dtype, device=dev)
    if view.bias is not None:
        mask = mask + view.bias[flat].view(S, P + L).masked_fill(~valid, 0).to(query.dtype)[:, None, :]
    mask = mask.masked_fill(~allowed, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, kp[:, None].expand(S, G, P + L, D), vp[:, None].expand(S, G, P + L, Dv),
        attn_mask=mask[:, None], scale=scale,
    )
    return out.reshape(B, Hq, L, Dv).transpose(1, 2).contiguous()


def register() -> str:
    """Register the attention function with ``transformers.AttentionInterface``; return its name."""
    AttentionInterface.register(ATTENTION_NAME, ragged_attention_forward)
    return ATTENTION_NAME


def use_ragged_attention(model, backend: str | None = None):
    """Register the function and switch ``model`` to it (no change to the model's classes).

    ``backend`` ("triton", "torch", "reference"; None: by device) is stored on the model config as
    ``ragged_decode_backend`` and used for decode steps.
    """
    model.set_attn_implementation(register())
    model.config.ragged_decode_backend = backend
    for sub in model.modules():  # attention modules may hold their own (text) config
        cfg = getattr(sub, "config", None)
        if cfg is not None and cfg is not model.config:
            cfg.ragged_decode_backend = backend
    return model


register()
