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

The layer's attention features come from its own call (:func:`forcedweight.deploy.features.layer_features`):

- soft-capping (Gemma 2) and learned sinks (gpt-oss) go to the decode kernel (``softcap=``, ``sinks=``)
  and to the prefill's explicit attention (:func:`forcedweight.deploy.features.feature_attention`);
- a sliding window ``W``: the cache layer learns it (if the cache was not built with it), keeps each
  entry's position and drops, before each update, the entries no new query can see; a decode step
  then attends every entry held (all inside its window), and a multi-token update masks by position
  (a query at ``p`` sees held entries at positions ``> p - W``, transformers' window).

What the deploy path does not implement (bidirectional or chunked attention, ALiBi) is refused with
one line naming it (:func:`forcedweight.deploy.features.refuse_unsupported`).

Without a ragged cache (dense tensors) it falls back to transformers' SDPA attention. Padding masks are
not supported (transformers builds no mask for a custom attention name): batch only equal-length prompts;
a model switched by :func:`use_ragged_attention` refuses a batch whose ``attention_mask`` pads a row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from forcedweight.deploy.features import Features, causal_mask, feature_attention, layer_features
from forcedweight.deploy.ragged_cache import RaggedKV
from forcedweight.errors import InputError
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
    feats = layer_features(module, kwargs, query.shape[1])
    if not isinstance(key, RaggedKV):
        if feats.plain:
            q_len, k_len = query.shape[2], key.shape[2]
            if attention_mask is None and q_len > 1 and k_len != q_len:  # a chunk over a past: bottom-right
                attention_mask = causal_mask(q_len, k_len, query.device)[None, None]
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        return _dense_features(query, key, value, attention_mask, scaling, feats), None
    view = key
    if feats.window is not None and view.layer is not None and view.layer.set_window(feats.window):
        # the layer learned its window now: drop what this update's first query cannot see, then re-view
        view.layer.trim(view.seen - view.new_len)
        view = view.layer.view(view.new_k, view.new_v)
    B, Hq, L, D = query.shape
    scale = D**-0.5 if scaling is None else scaling
    sinks = None if feats.sinks is None else feats.sinks.to(device=query.device, dtype=torch.float32)
    if L == 1:  # every entry held is inside the window (the cache dropped the others before the update)
        backend = getattr(getattr(module, "config", None), "ragged_decode_backend", None)
        if backend == "torch" or (backend is None and not query.is_cuda):  # the cache built the extents:
            out, _ = segment_decode_torch(  # nothing to validate, straight to the PyTorch path
                query[:, :, 0, :], view.k, view.v, view.starts, view.lengths, view.bias, scale,
                host=(view.host_starts, view.host_lengths), return_lse=False, softcap=feats.softcap, sinks=sinks,
            )
            return out.unsqueeze(1), None
        out, _ = segment_decode(
            query[:, :, 0, :], view.k, view.v, view.starts, view.lengths, view.bias, sm_scale=scale,
            check=False, host=(view.host_starts, view.host_lengths), return_lse=False,  # the cache built them
            max_len=view.max_len, backend=backend, softcap=feats.softcap, sinks=sinks,
        )
        return out.to(query.dtype).unsqueeze(1), None
    return _prefill(query, view, scale, feats), None


def _dense_features(query, key, value, attention_mask, scaling, feats: Features):
    """Dense K/V (no ragged cache) with soft-cap / sinks / window: keys are the last T positions, the
    queries the last L of them (a DynamicCache, full or sliding, holds contiguous positions)."""
    if attention_mask is not None and attention_mask.dim() != 4:
        raise InputError("ragged attention: a padding mask is not supported with soft-cap, sinks or a window")
    L, T = query.shape[2], key.shape[2]
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    pos = torch.arange(T, device=query.device)
    return feature_attention(query, key, value, scale, pos[T - L:], pos, feats)


def _prefill(query, view: RaggedKV, scale: float, feats: Features = Features()):
    """Causal attention of L new tokens over each segment's past entries plus the new tokens (with the
    layer's soft-cap, sinks and window: a query at ``p`` sees held entries at positions ``> p - W``)."""
    B, Hq, L, D = query.shape
    S, Hkv = view.batch * view.kv_heads, view.kv_heads
    G = Hq // Hkv
    Dv = view.v.shape[1]
    P = view.max_len - L  # the longest past
    first = view.seen - L  # position of the first new token
    if P == 0 and feats.plain:  # no past anywhere (a prompt): plain causal attention over the new states
        out = F.scaled_dot_product_attention(query, view.new_k.to(query.dtype), view.new_v.to(query.dtype),
                                             is_causal=True, scale=scale, enable_gqa=G > 1)
        return out.transpose(1, 2).contiguous()
    if P == 0:
        pos = torch.arange(first, first + L, device=query.device)
        return feature_attention(query, view.new_k, view.new_v, scale, pos, pos, feats)
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
    if not feats.plain:
        if view.pos is not None:  # held positions; new tokens at first .. first + L - 1
            kpos = view.pos.index_select(0, flat.cpu()).to(device=dev, dtype=torch.int64).view(S, P + L)
        else:  # no window: positions only order the keys (past before new), which is all the mask needs
            kpos = torch.where(slot[None, :] < P, first - 1, first + slot[None, :] - P).expand(S, P + L)
        bias = None
        if view.bias is not None:
            bias = view.bias[flat].view(S, P + L).masked_fill(~valid, 0).view(B, Hkv, P + L)
        qpos = torch.arange(first, first + L, device=dev)
        return feature_attention(query, kp.view(B, Hkv, P + L, D), vp.view(B, Hkv, P + L, Dv), scale, qpos,
                                 kpos.reshape(B, Hkv, P + L), feats, bias=bias, valid=valid.view(B, Hkv, P + L))
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


def _refuse_padding(module, args, kwargs):
    """Forward pre-hook of a model switched to ragged attention: transformers passes a custom attention
    function no mask, so a padded batch (a 2-D ``attention_mask`` with a 0) would attend its padding."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[0] > 1 and _padded(mask.bool()):
        raise InputError("ragged attention: a padded batch (an attention_mask with zeros) is not supported; "
                         "batch only equal-length prompts")
    return None


def _padded(mask: torch.Tensor) -> bool:
    """Whether a [B, T] bool mask pads a row: a run of zeros at its start or its end. (generate() infers a
    mask from the pad token id, so a prompt that merely holds that id has zeros inside: not padding; and one
    sequence alone is never padded.)"""
    zeros = (~mask).int()
    leading = zeros.cumprod(dim=1).sum(dim=1)  # zeros before a row's first 1
    trailing = zeros.flip(1).cumprod(dim=1).sum(dim=1)  # and after its last
    return bool(((leading > 0) | (trailing > 0)).any())


def use_ragged_attention(model, backend: str | None = None):
    """Register the function and switch ``model`` to it (no change to the model's classes).

    ``backend`` ("triton", "torch", "reference"; None: by device) is stored on the model config as
    ``ragged_decode_backend`` and used for decode steps.
    """
    model.set_attn_implementation(register())
    model.config.ragged_decode_backend = backend
    if not getattr(model, "_forcedweight_padding_hook", False):
        model.register_forward_pre_hook(_refuse_padding, with_kwargs=True)
        model._forcedweight_padding_hook = True
    for sub in model.modules():  # attention modules may hold their own (text) config
        cfg = getattr(sub, "config", None)
        if cfg is not None and cfg is not model.config:
            cfg.ragged_decode_backend = backend
    return model


register()
