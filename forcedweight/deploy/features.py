"""The attention features of one layer's call that the deploy path (the context Prefill, the ragged
cache's attention) implements, read from the call itself (issue 18, item 2), and the ones it refuses.

Implemented (:func:`layer_features`), with transformers' eager definitions:

- ``softcap`` (Gemma 2): scaled logits ``s -> c * tanh(s / c)`` before the mask and the softmax;
- learned sinks (gpt-oss: the ``s_aux`` argument / the module's ``sinks`` parameter, one logit per
  query head): the sink joins the softmax's denominator and carries no value;
- ``sliding_window`` ``W`` (Mistral, Gemma 2/3, Phi-3, Qwen2 with ``use_sliding_window``, gpt-oss): a
  query at position ``p`` sees keys at positions ``> p - W`` (transformers' ``sliding_window_overlay``:
  ``kv_idx > q_idx - sliding_window``), causal as well.

Refused with one line naming the layer (:func:`refuse_unsupported`): bidirectional attention
(``module.is_causal`` False), chunked attention (``attention_chunk_size``), ALiBi / a positional bias
argument, sinks that are not one logit per query head, a soft-cap or window that is not a positive number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from forcedweight.errors import InputError

_UNSUPPORTED_ARGS = {
    "attention_chunk_size": "chunked attention",
    "alibi": "an ALiBi positional bias",
    "position_bias": "a positional attention bias",
}


@dataclass(frozen=True)
class Features:
    """What one layer's attention adds to plain causal softmax.

    Attributes
    ----------
    softcap : float or None.
    sinks : Tensor [Hq] or None (the module's parameter; not copied).
    window : int or None, the sliding window W (keys at positions > p - W are seen by a query at p).
    """

    softcap: float | None = None
    sinks: torch.Tensor | None = None
    window: int | None = None

    @property
    def plain(self) -> bool:
        return self.softcap is None and self.sinks is None and self.window is None

    def names(self) -> list[str]:
        """What the layer adds, in words (for the messages of the paths that support plain layers only)."""
        return [n for n, v in (("attention-logit soft-cap", self.softcap), ("learned sinks", self.sinks),
                               ("a sliding window", self.window)) if v is not None]


def _name(module) -> str:
    return f"layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__})"


def refuse_unsupported(module, kwargs: dict, n_tokens: int | None = None, where: str = "the ragged cache") -> None:
    """Raise InputError if layer ``module``'s attention call needs a feature ``where`` lacks.

    Parameters
    ----------
    module : the attention module (its ``layer_idx`` and class name go into the message).
    kwargs : the keyword arguments of the attention call.
    n_tokens : unused (kept for callers; every window length is implemented now).
    """
    name = _name(module)
    if not getattr(module, "is_causal", True):
        raise InputError(f"--model: {name}: bidirectional attention is not supported by {where}")
    for arg, what in _UNSUPPORTED_ARGS.items():
        if kwargs.get(arg) is not None:
            raise InputError(f"--model: {name}: {what} ({arg}) is not supported by {where}")
    cap = kwargs.get("softcap")
    if cap is not None and not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > 0):
        raise InputError(f"--model: {name}: attention-logit soft-cap {cap!r} is not a positive number ({where})")
    window = kwargs.get("sliding_window")
    if window is not None and not (isinstance(window, int) and window >= 1):
        raise InputError(f"--model: {name}: sliding window {window!r} is not a positive integer ({where})")


def layer_features(module, kwargs: dict, n_heads: int, where: str = "the ragged cache") -> Features:
    """The features of layer ``module``'s attention call (``kwargs``), after :func:`refuse_unsupported`.

    ``n_heads`` is the query head count Hq (sinks must be one logit per query head).
    """
    refuse_unsupported(module, kwargs, None, where)
    sinks = kwargs.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
        sinks = module.sinks
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.numel() != n_heads:
            shape = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
            raise InputError(
                f"--model: {_name(module)}: learned sinks of shape {shape} are not one logit per query head "
                f"({n_heads}): not supported by {where}"
            )
        sinks = sinks.detach().reshape(n_heads)
    cap = kwargs.get("softcap")
    window = kwargs.get("sliding_window")
    return Features(None if cap is None else float(cap), sinks, None if window is None else int(window))


def causal_mask(q_len: int, k_len: int, device) -> torch.Tensor:
    """Bool (q_len, k_len) bottom-right causal mask, True = may attend: new token i (at position
    k_len - q_len + i) sees the keys up to it. SDPA's own ``is_causal`` is top-left (wrong over a past)."""
    rows = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    return torch.arange(k_len, device=device)[None, :] <= rows


def feature_attention(query, key, value, scaling: float, q_pos, k_pos, features: Features, bias=None,
                      valid=None):
    """Attention with soft-cap, sinks and a sliding window, as transformers' eager attention computes it.

    Parameters
    ----------
    query : Tensor [B, Hq, L, D]; key : [B, Hkv, T, D]; value : [B, Hkv, T, Dv] (Hq a multiple of Hkv).
    q_pos : Tensor [L] or [B, L] int, the queries' positions; k_pos : Tensor [T] or [B, T] int (or [B, Hkv, T]).
    features : :class:`Features` (window None: causal only).
    bias : optional [B, Hkv, T] float, added to the (capped) logits.
    valid : optional bool [B, Hkv, T]: False entries are padding (never seen).

    Returns
    -------
    Tensor [B, L, Hq, Dv] (transformers' attention-function layout), in query's dtype.
    """
    B, Hq, L, D = query.shape
    Hkv, T = key.shape[1], key.shape[2]
    G = Hq // Hkv
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    q = query.to(acc).reshape(B, Hkv, G, L, D)
    logits = torch.matmul(q, key.to(acc).unsqueeze(2).transpose(-1, -2)) * scaling  # [B, Hkv, G, L, T]
    if features.softcap is not None:
        logits = torch.tanh(logits / features.softcap) * features.softcap
    if bias is not None:
        logits = logits + bias.to(acc)[:, :, None, None, :]
    qp = q_pos.reshape(-1 if q_pos.dim() == 1 else B, 1, 1, L, 1) if q_pos.dim() <= 2 else q_pos
    kp = k_pos.reshape(1, 1, 1, 1, T) if k_pos.dim() == 1 else (
        k_pos.reshape(B, 1, 1, 1, T) if k_pos.dim() == 2 else k_pos.reshape(B, Hkv, 1, 1, T))
    allowed = kp <= qp
    if features.window is not None:
        allowed = allowed & (kp > qp - features.window)
    if valid is not None:
        allowed = allowed & valid[:, :, None, None, :]
    logits = logits.masked_fill(~allowed, float("-inf"))
    if features.sinks is not None:
        sink = features.sinks.to(device=logits.device, dtype=acc).reshape(1, Hkv, G, 1, 1).expand(B, Hkv, G, L, 1)
        logits = torch.cat([logits, sink], dim=-1)
    m = logits.amax(-1, keepdim=True)
    m = m.masked_fill(torch.isneginf(m), 0)
    w = torch.exp(logits - m)
    w = w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(acc).tiny)
    w = w[..., :T]  # the sink's share carries no value
    out = torch.matmul(w, value.to(acc).unsqueeze(2))  # [B, Hkv, G, L, Dv]
    return out.reshape(B, Hq, L, -1).transpose(1, 2).contiguous().to(query.dtype)


__all__ = ["Features", "causal_mask", "feature_attention", "layer_features", "refuse_unsupported"]
