"""The context prefill shared by every eviction policy and budget (docs/concepts.md, the protocol's first step).

:func:`prefill_context` runs the context through the model once, with a dense ``DynamicCache``, and
records what every policy may look at: the cache (post-RoPE keys, values), every layer's post-RoPE
queries of the context, and the logits at the last position. The queries are captured by an
attention function registered with transformers' ``AttentionInterface`` under its own name
(``"forcedweight_prefill"``, switched on for the duration of the forward pass only, as
``forcedweight.dump.hook`` does): it hands each layer's post-RoPE ``query`` to a callback and returns
transformers' own SDPA output, so the forward pass is that of the model with SDPA attention. A layer
whose call carries a soft-cap (Gemma 2), learned sinks (gpt-oss) or a sliding window (Mistral, Gemma
2/3, Phi-3, Qwen2, gpt-oss) is computed as transformers' eager attention computes it
(:func:`forcedweight.deploy.features.feature_attention`: no mask is built for a custom attention name,
so the causal and window masks come from positions); the Prefill records each layer's features.

The Prefill's cache is a ``DynamicCache`` of full layers (built without the model config): a sliding
layer keeps all N context entries too, so every policy sees N entries per layer; the ragged copy
(:meth:`Prefill.ragged_cache`) is told each layer's window and drops what falls out of it.

:func:`capturing_attention` is the same mechanism for other forward passes (KVzip's reconstruction
passes); :func:`copy_dense_cache` clones a dense cache so such passes never touch the Prefill's.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from forcedweight.compat import attention_implementation, cache_kwargs
from forcedweight.deploy.features import Features, causal_mask, feature_attention, layer_features
from forcedweight.deploy.ragged_cache import RaggedKVCache
from forcedweight.errors import InputError

ATTENTION_NAME = "forcedweight_prefill"

# callback(layer, module, query (B, H_q, L, d), key (B, H_kv, T, d), value, scaling) -> None
Callback = Callable[[int, torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, float], None]
_ACTIVE: contextvars.ContextVar[Callback | None] = contextvars.ContextVar("forcedweight_prefill_cb", default=None)
# layer -> Features of its call, while prefill_context runs
_FEATURES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("forcedweight_prefill_features", default=None)


def prefill_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention function of the ``AttentionInterface``: report ``query``/``key``/``value`` to the active
    callback, then return transformers' SDPA attention (shapes (B, H, T, d)).

    Without a mask from transformers and with a past (``T > L``), an explicit bottom-right causal
    mask is passed, so reconstruction passes over a cache attend exactly as a plain causal model.
    With a soft-cap, sinks or a sliding window the attention is transformers' eager definition, the
    keys taken as the last T positions and the queries as the last L (a dense cache holds contiguous
    positions).
    """
    cb = _ACTIVE.get()
    feats = layer_features(module, kwargs, query.shape[1], "the context prefill")
    record = _FEATURES.get()
    if record is not None:
        record[int(getattr(module, "layer_idx", -1))] = feats
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if cb is not None:
        cb(int(getattr(module, "layer_idx", -1)), module, query, key, value, float(scaling))
    q_len, k_len = query.shape[2], key.shape[2]
    if not feats.plain:
        if attention_mask is not None:
            raise InputError("--model: the context prefill takes no attention mask with soft-cap, sinks or a window")
        pos = torch.arange(k_len, device=query.device)
        return feature_attention(query, key, value, float(scaling), pos[k_len - q_len:], pos, feats), None
    if attention_mask is None and q_len > 1 and k_len != q_len:
        attention_mask = causal_mask(q_len, k_len, query.device)[None, None]
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


AttentionInterface.register(ATTENTION_NAME, prefill_attention)


@contextlib.contextmanager
def capturing_attention(model, callback: Callback):
    """Run ``model`` with :func:`prefill_attention` and ``callback`` active, then restore its attention."""
    with attention_implementation(model, ATTENTION_NAME, (_ACTIVE, callback)):
        yield


def copy_dense_cache(cache: DynamicCache, model=None) -> DynamicCache:
    """A ``DynamicCache`` holding clones of every layer's keys and values (nothing shared)."""
    out = DynamicCache(config=model.config) if model is not None else DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.clone(), layer.values.clone(), i)
    return out


def _rotary(model):
    body = getattr(model, "model", None)
    rot = getattr(body, "rotary_emb", None) or getattr(model, "rotary_emb", None)
    if rot is None:
        raise InputError("--model: no rotary embedding found (model.model.rotary_emb): RoPE-based policies need it")
    return rot


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama ``rotate_half``: (x1, x2) → (-x2, x1) over the last axis."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


@dataclass
class Prefill:
    """The context run through the model once (shared by every policy and budget).

    Attributes
    ----------
    model : the causal LM (its attention implementation is left as it was).
    tokenizer : its tokenizer (may be None; KVzip needs one).
    context_ids : (1, N) long, the prefilled tokens.
    cache : DynamicCache, the context's K/V after the prefill; never mutated.
    queries : per layer (H_q, N, d) post-RoPE float32 queries of the context.
    logits_last : (vocab,) logits at the last context position.
    scaling : the layers' attention scaling.
    features : per layer, the :class:`~forcedweight.deploy.features.Features` of its attention call
        (soft-cap, sinks, sliding window); empty: plain causal attention everywhere.
    """

    model: "PreTrainedModel"  # noqa: F821
    tokenizer: object
    context_ids: torch.Tensor
    cache: DynamicCache
    queries: list[torch.Tensor]
    logits_last: torch.Tensor
    scaling: float = 0.0
    features: list = None

    @property
    def windows(self) -> list:
        """Per layer its sliding window (None: full attention)."""
        return [f.window for f in (self.features or [Features()] * self.n_layers)]

    # --- shapes --------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.queries)

    @property
    def n_heads(self) -> int:
        return int(self.queries[0].shape[0])

    @property
    def n_kv_heads(self) -> int:
        return int(self.cache.layers[0].keys.shape[1])

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return int(self.queries[0].shape[-1])

    @property
    def n_tokens(self) -> int:
        return int(self.context_ids.shape[-1])

    # --- tensors ---------------------------------------------------------------------------------
    def keys(self, layer: int) -> torch.Tensor:
        """Post-RoPE keys of ``layer``, (H_kv, N, d) (a view of the cache: do not modify)."""
        return self.cache.layers[layer].keys[0]

    def values(self, layer: int) -> torch.Tensor:
        """Values of ``layer``, (H_kv, N, d_v) (a view of the cache: do not modify)."""
        return self.cache.layers[layer].values[0]

    def rope(self, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's RoPE ``cos, sin`` at ``positions`` (P,), each (P, d) float64."""
        pos = torch.as_tensor(positions, dtype=torch.long, device=self.queries[0].device).reshape(1, -1)
        x = torch.zeros(1, dtype=torch.float32, device=pos.device)
        cos, sin = _rotary(self.model)(x, pos)
        return cos[0].double(), sin[0].double()

    def unrotate(self, x: torch.Tensor) -> torch.Tensor:
        """Undo RoPE on post-RoPE vectors x (H, N, d) at positions 0..N-1: (H, N, d) float64 pre-RoPE."""
        cos, sin = self.rope(np.arange(x.shape[-2]))
        xd = x.double()
        return xd * cos - rotate_half(xd) * sin

    def attention(self, layer: int, rows: slice | None = None) -> np.ndarray:
        """Causal softmax attention of the context's queries, float64 (H_q, R, N).

        Row r is the query at position ``t = range(N)[rows][r]``; it sees keys ``0..t`` (zeros
        beyond), within the layer's sliding window (``> t - W``), with its soft-cap applied. Learned
        sinks are left out: the row is the softmax over the keys alone, summing to 1 (the dump's rows
        make the same choice, docs/families.md). GQA: query head h reads KV head ``h // group_size``.
        """
        feats = self.features[layer] if self.features else Features()
        n = self.n_tokens
        pos = torch.arange(n, device=self.queries[layer].device)
        if rows is not None:
            pos = pos[rows]
        q = self.queries[layer][:, pos].double()  # (H_q, R, d)
        k = self.keys(layer).double().repeat_interleave(self.group_size, dim=0)  # (H_q, N, d)
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        if feats.softcap is not None:
            logits = torch.tanh(logits / feats.softcap) * feats.softcap
        mask = torch.arange(n, device=pos.device)[None, :] > pos[:, None]
        if feats.window is not None:
            mask = mask | (torch.arange(n, device=pos.device)[None, :] <= pos[:, None] - feats.window)
        logits = logits.masked_fill(mask[None], float("-inf"))
        return torch.softmax(logits, dim=-1).cpu().numpy()

    def ragged_cache(self) -> RaggedKVCache:
        """A fresh, unevicted ragged copy of the context's cache (cloned, never re-prefilled); its
        sliding-window layers know their windows (entries keep their positions through eviction)."""
        return RaggedKVCache.from_dense(copy_dense_cache(self.cache), windows=self.windows)


def prefill_context(model, tokenizer, context_ids: torch.Tensor) -> Prefill:
    """Prefill ``context_ids`` (1, N) or (N,) once and capture every layer's post-RoPE queries.

    Raises InputError on an empty context or one longer than the model's window.
    """
    ids = torch.as_tensor(context_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None, :]
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise InputError(f"prefill: context_ids must be (1, N), got {tuple(ids.shape)}")
    n = int(ids.shape[1])
    if n == 0:
        raise InputError("prefill: empty context")
    window = getattr(model.config, "max_position_embeddings", None)
    if window is not None and n > int(window):
        raise InputError(f"prefill: context of {n} tokens exceeds the model's window of {window}")
    device = next(model.parameters()).device
    ids = ids.to(device)
    n_layers = int(model.config.num_hidden_layers)
    queries: list[torch.Tensor | None] = [None] * n_layers
    scaling: list[float] = []

    def record(layer, module, query, key, value, scale):
        queries[layer] = query[0].detach().float().clone()
        scaling.append(scale)

    cache = DynamicCache()  # full layers: a sliding layer keeps all N entries too (policies see N per layer)
    features: dict = {}
    token = _FEATURES.set(features)
    try:
        with capturing_attention(model, record), torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(cache))
    finally:
        _FEATURES.reset(token)
    missing = [i for i, q in enumerate(queries) if q is None]
    if missing:
        raise InputError(
            f"--model: layers {missing} never called the prefill attention function "
            "(the architecture does not dispatch attention through transformers' AttentionInterface)"
        )
    if len(set(scaling)) != 1:
        raise InputError("--model: layers use different attention scalings; policies assume one")
    return Prefill(model=model, tokenizer=tokenizer, context_ids=ids, cache=cache, queries=queries,
                   logits_last=out.logits[0, -1].detach().float().clone(), scaling=scaling[0],
                   features=[features.get(i, Features()) for i in range(n_layers)])


__all__ = ["ATTENTION_NAME", "Prefill", "capturing_attention", "copy_dense_cache", "prefill_attention",
           "prefill_context", "rotate_half"]
