"""The capture attention function, registered with transformers' ``AttentionInterface``.

No model class is patched: :func:`capturing` switches a loaded model's
``config._attn_implementation`` to a capture implementation for the duration of a forward pass
and back afterwards. There is one capture implementation per wrapped implementation
(``forcedweight_capture_eager``, ``forcedweight_capture_sdpa``), registered with the wrapped
one's mask function, so the model builds exactly the masks (causal, sliding-window) it builds
without the capture. The capture function receives each layer's post-RoPE (and post q/k-norm)
queries, keys and values and

- returns, in every layer, the wrapped implementation's own output (the model's
  ``eager_attention_forward`` for eager: Gemma 2's soft-cap and gpt-oss's sinks included; SDPA
  otherwise), so the forward pass is bit-identical to a plain one whatever is captured;
- in a captured layer, also computes the selected rows itself with
  :func:`forcedweight.kernels.attention_stats.attention_rows`, following the layer's own
  attention pattern, read from the call: the ``scaling`` the layer passes (Gemma's
  ``query_pre_attn_scalar``, Granite's ``attention_multiplier``), its ``sliding_window`` (a row
  holds the keys its query sees: positions ``t - W + 1 .. t``), its ``softcap`` (Gemma 2:
  ``c * tanh(score / c)``), and its learned sinks ``s_aux`` (gpt-oss: the sink logit takes part
  in the model's softmax; the row holds the weights renormalised over the keys, and the sink's
  share of the model's softmax is recorded as ``sink_mass``). GQA: query head h reads KV head
  h // (H_q / H_kv). The mask the model built is checked against that pattern; a layer whose
  mask is anything else (bidirectional, chunked, padded, a positional bias) is refused.

Models whose attention implementation is neither eager nor SDPA (flash, flex) are captured
through eager (the rows then equal the model's eager attention), and so is a model whose
attention SDPA would not compute as defined (Gemma 2's soft-cap, which transformers < 5.3 run
under SDPA by default: :func:`forcedweight.compat.sdpa_drops_features`). After the last layer that has
rows to capture the forward pass is stopped (:class:`StopCapture`).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from forcedweight.compat import attention_configs, attention_implementation, sdpa_drops_features
from forcedweight.kernels.attention_stats import attention_rows
from forcedweight.errors import InputError

ATTENTION_NAME = "forcedweight_capture"
WRAPPED = ("eager", "sdpa")  # implementations the capture wraps; any other is captured through eager
# Keyword arguments of the attention call that the rows follow; any other non-None keyword that
# changes attention (below) is refused rather than captured wrong.
_REFUSED_KWARGS = {
    "attention_chunk_size": "chunked attention",
    "alibi": "ALiBi positional bias",
    "position_bias": "a positional attention bias",
}


@dataclass
class LayerPlan:
    """Rows to capture in one layer, in output order.

    heads : ndarray (R,) int, query head of each row.
    positions : ndarray (R,) int, query position of each row (>= 0); the row sees positions + 1 keys.
    """

    heads: np.ndarray
    positions: np.ndarray


@dataclass
class LayerCapture:
    """What one captured layer yields (numpy, on the CPU).

    heads, kv_heads, positions : ndarray (R,) int.
    n_keys, key_start : ndarray (R,) int, row r holds keys ``key_start .. key_start + n_keys - 1``
        (``key_start = 0, n_keys = position + 1`` without a sliding window).
    weights : ndarray (R, T) float32, column j = key ``key_start + j``, zero beyond ``n_keys``.
    values : ndarray (H_kv, T, d) float32, the layer's value vectors (absolute positions).
    keys : ndarray (H_kv, T, d) float32 post-RoPE keys, or None.
    queries : ndarray (R, d) float32 post-RoPE queries, or None.
    logits : ndarray (R, T) float32 scores entering the softmax (scaled, soft-capped), laid out
        like ``weights``, or None.
    dropped : ndarray (R, S) float64 top-s dropped mass per budget, or None.
    window : the layer's sliding window W, or None (full causal attention).
    sink_mass : ndarray (R,) float64, the sink's share of the model's softmax (learned sinks), or None.
    """

    layer: int
    heads: np.ndarray
    kv_heads: np.ndarray
    positions: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    n_keys: np.ndarray | None = None
    key_start: np.ndarray | None = None
    keys: np.ndarray | None = None
    queries: np.ndarray | None = None
    logits: np.ndarray | None = None
    dropped: np.ndarray | None = None
    window: int | None = None
    sink_mass: np.ndarray | None = None

    def __post_init__(self):
        if self.n_keys is None:
            self.n_keys = np.asarray(self.positions, dtype=np.int64) + 1
        if self.key_start is None:
            self.key_start = np.zeros_like(np.asarray(self.n_keys, dtype=np.int64))


class StopCapture(Exception):
    """Raised after the last captured layer to end the forward pass early."""


@dataclass
class Recorder:
    """The capture plan of one forward pass and where captured layers go.

    plans : layer -> LayerPlan (layers absent are not captured).
    sink : called with each LayerCapture as soon as its layer has run.
    stats_s : budgets for the dropped-mass statistics (empty: none).
    backend : "auto" (Triton on CUDA, PyTorch elsewhere), "torch" or "triton".
    stop_early : raise StopCapture after the last planned layer.
    """

    plans: dict[int, LayerPlan]
    sink: Callable[[LayerCapture], None]
    with_keys: bool = False
    stats_s: Sequence[int] = ()
    backend: str = "auto"
    stop_early: bool = True
    seen: set = field(default_factory=set)
    wrapped: str = "sdpa"  # set by :func:`capturing`

    @property
    def last_layer(self) -> int:
        return max(self.plans) if self.plans else -1


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("forcedweight_recorder", default=None)


def _layer_name(module) -> str:
    layer = getattr(module, "layer_idx", None)
    return f"layer {layer} ({type(module).__name__})"


def _inner_function(module, wrapped: str) -> Callable:
    """The attention function the model itself would call in ``module`` under ``wrapped``."""
    if wrapped == "eager":
        forward = inspect.unwrap(type(module).forward)  # the globals of the module defining forward
        fn = getattr(forward, "__globals__", {}).get("eager_attention_forward")
        if fn is None:
            raise InputError(
                f"--model: {_layer_name(module)}: no eager_attention_forward beside {type(module).__name__}.forward "
                "(the capture cannot reproduce this architecture's attention)"
            )
        return fn
    return ALL_ATTENTION_FUNCTIONS[wrapped]


_CHECK_ROWS = 1024  # query rows of the mask checked at a time (bounded memory for long contexts)


def _visible_from_mask(m: torch.Tensor, module) -> torch.Tensor:
    """(rows, T_k) bool: the keys each query of a block attends to under a (rows, T_k) slice of an
    eager/SDPA mask (boolean, or additive 0 / -inf)."""
    if m.dtype == torch.bool:
        return m
    blocked = m <= torch.finfo(m.dtype).min / 2
    if not bool(((m == 0) | blocked).all()):
        raise InputError(
            f"--model: {_layer_name(module)}: the attention mask adds a bias to the scores "
            "(a positional bias such as ALiBi is not supported)"
        )
    return ~blocked


def _check_pattern(module, attention_mask, wrapped: str, t: int, window: int | None, device) -> None:
    """Refuse a layer whose mask is not causal (within ``window``): the rows would be wrong."""
    if not getattr(module, "is_causal", True):
        raise InputError(f"--model: {_layer_name(module)}: bidirectional attention is not supported (causal only)")
    if attention_mask is None:
        # SDPA without a mask runs is_causal; it is only skipped when the window does not bite.
        if wrapped != "sdpa" or (window is not None and window < t):
            raise InputError(f"--model: {_layer_name(module)}: no attention mask where one was expected")
        return
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        raise InputError(f"--model: {_layer_name(module)}: unsupported attention mask ({type(attention_mask).__name__})")
    mask = attention_mask[0]
    what = f"causal with a {window}-token sliding window" if window is not None else "causal"
    not_causal = InputError(
        f"--model: {_layer_name(module)}: the attention mask is not {what} "
        "(chunked, padded or bidirectional attention is not supported)"
    )
    if mask.shape[-2] != t:
        raise not_causal
    # in blocks of query rows: a few (rows, T) temporaries instead of several (T, T) ones
    k_idx = torch.arange(mask.shape[-1], device=mask.device)[None, :]
    for a in range(0, t, _CHECK_ROWS):
        block = mask[:, a : a + _CHECK_ROWS]
        if block.shape[0] > 1 and not bool((block == block[:1]).all()):
            raise InputError(f"--model: {_layer_name(module)}: the attention mask differs across heads (not supported)")
        visible = _visible_from_mask(block[0], module)
        q_idx = torch.arange(a, a + visible.shape[0], device=mask.device)[:, None]
        expected = k_idx <= q_idx
        if window is not None:
            expected &= k_idx > q_idx - window
        if not torch.equal(visible, expected):
            raise not_causal


def capture_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,  # transformers' order (kvpress's patch passes dropout positionally)
    scaling: float | None = None,
    **kwargs,
):
    """Attention function of the ``AttentionInterface`` (shapes (B, H, T, d), B must be 1)."""
    rec = _ACTIVE.get()
    wrapped = rec.wrapped if rec is not None else "sdpa"
    inner = _inner_function(module, wrapped)
    # The layer output is exactly what the model computes without the capture, so captured rows
    # never depend on which other layers or heads were selected (and resumed runs are bit-identical).
    result = inner(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    layer = getattr(module, "layer_idx", None)
    plan = rec.plans.get(layer) if rec is not None else None
    if plan is None:
        return result
    if query.shape[0] != 1:
        raise ValueError("the capture runs one sequence at a time (batch size 1)")
    for name, feature in _REFUSED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise InputError(f"--model: {_layer_name(module)}: {feature} is not supported by the capture")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    t = query.shape[2]
    window = kwargs.get("sliding_window")
    window = int(window) if window is not None else None
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
        sinks = module.sinks
    if window is not None and window < 1:
        raise InputError(f"--model: {_layer_name(module)}: sliding window {window} < 1")
    _check_pattern(module, attention_mask, wrapped, t, window, query.device)
    group = query.shape[1] // key.shape[1]
    q32, k32, v32 = query[0].float(), key[0].float(), value[0].float()
    heads = torch.as_tensor(plan.heads, dtype=torch.long, device=query.device)
    pos = torch.as_tensor(plan.positions, dtype=torch.long, device=query.device)
    kv_heads = heads // group  # GQA: query head h reads KV head h // (H_q / H_kv)
    n_keys = pos + 1 if window is None else torch.clamp(pos + 1, max=window)
    key_start = pos + 1 - n_keys
    q_rows = q32[heads, pos]
    weights, logits, dropped = attention_rows(
        q_rows, k32, kv_heads, n_keys, scaling, rec.stats_s, backend=rec.backend,
        key_start=key_start if window is not None else None,
        softcap=float(softcap) if softcap is not None else None,
    )
    sink_mass = None
    if sinks is not None:
        # The model's softmax runs over the keys and one sink logit per query head; the row holds
        # the weights renormalised over the keys (softmax over the keys alone), and the sink's share
        # s = exp(sink) / (exp(sink) + sum_j exp(logit_j)) is recorded, in float64.
        sink = sinks.detach().to(device=query.device, dtype=torch.float64).reshape(-1)[heads]
        valid = torch.arange(logits.shape[1], device=query.device)[None, :] < n_keys[:, None]
        lse = torch.logsumexp(logits.double().masked_fill(~valid, float("-inf")), dim=-1)
        sink_mass = torch.sigmoid(sink - lse).cpu().numpy()
    cap = LayerCapture(
        layer=int(layer),
        heads=np.asarray(plan.heads),
        kv_heads=kv_heads.cpu().numpy(),
        positions=np.asarray(plan.positions),
        weights=weights.cpu().numpy(),
        values=v32.cpu().numpy(),
        n_keys=n_keys.cpu().numpy(),
        key_start=key_start.cpu().numpy(),
        keys=k32.cpu().numpy() if rec.with_keys else None,
        queries=q_rows.cpu().numpy() if rec.with_keys else None,
        logits=logits.cpu().numpy() if rec.with_keys else None,
        dropped=dropped.cpu().numpy() if rec.stats_s else None,
        window=window,
        sink_mass=sink_mass,
    )
    rec.seen.add(int(layer))
    rec.sink(cap)
    if rec.stop_early and layer == rec.last_layer:
        raise StopCapture()
    return result


def capture_name(wrapped: str) -> str:
    """Name of the capture implementation around ``wrapped``, registered with its mask function."""
    name = f"{ATTENTION_NAME}_{wrapped}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, capture_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[wrapped])
    return name


for _wrapped in WRAPPED:
    capture_name(_wrapped)


@contextlib.contextmanager
def capturing(model, recorder: Recorder):
    """Run ``model`` with the capture attention function and ``recorder`` active, then restore it."""
    current = attention_configs(model)[-1]._attn_implementation
    wrapped = current if current in WRAPPED else "eager"
    if wrapped == "sdpa" and sdpa_drops_features(model.config):
        wrapped = "eager"  # transformers < 5.3 default Gemma 2 to SDPA, which drops its soft-cap
    recorder.wrapped = wrapped
    with attention_implementation(model, capture_name(wrapped), (_ACTIVE, recorder)):
        yield


def run_capture(model, input_ids: torch.Tensor, recorder: Recorder) -> None:
    """One forward pass of the decoder over ``input_ids`` (T,) with ``recorder`` capturing.

    The language-model head is skipped (``model.base_model``): captured rows do not depend on it.
    """
    body = getattr(model, "base_model", model)
    if not recorder.plans:
        return
    with capturing(model, recorder), torch.inference_mode():
        try:
            body(input_ids=input_ids[None, :], use_cache=False)
        except StopCapture:
            pass
    missing = set(recorder.plans) - recorder.seen
    if missing:
        raise InputError(
            f"--model: layers {sorted(missing)} never called the capture attention function "
            "(the architecture does not dispatch attention through transformers' AttentionInterface)"
        )
