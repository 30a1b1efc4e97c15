"""The capture attention function, registered with transformers' ``AttentionInterface``.

No model class is patched: :func:`capturing` switches a loaded model's
``config._attn_implementation`` to ``"forcedweight_capture"`` for the duration of a forward
pass and back afterwards. The registered function :func:`capture_attention` receives each
layer's post-RoPE queries, keys and values and

- returns, in every layer, transformers' own SDPA attention output, so the forward pass is
  bit-identical to a plain one whatever is captured;
- in a captured layer, also computes the selected rows itself with
  :func:`forcedweight.kernels.attention_stats.attention_rows`: float32 scores of each selected
  query against its KV head's keys (GQA: query head h reads KV head h // (H_q / H_kv)), scaled by
  the module's ``scaling``, causal (the query at position t sees keys 0..t), float32 softmax, and
  the top-s dropped mass; the PyTorch path on CPU (one matmul per KV head over all its selected
  rows), the Triton kernel on CUDA. The rows, the values (and with ``with_keys`` the keys, query
  and scaled scores) of each row's KV head go to the recorder's sink.

After the last layer that has rows to capture the forward pass is stopped (:class:`StopCapture`):
the later layers cannot change what was captured.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from forcedweight.kernels.attention_stats import attention_rows
from forcedweight.errors import InputError

ATTENTION_NAME = "forcedweight_capture"


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
    weights : ndarray (R, T) float32, zero beyond ``positions + 1``.
    values : ndarray (H_kv, T, d) float32, the layer's value vectors.
    keys : ndarray (H_kv, T, d) float32 post-RoPE keys, or None.
    queries : ndarray (R, d) float32 post-RoPE queries, or None.
    logits : ndarray (R, T) float32 scaled scores (zero beyond ``positions + 1``), or None.
    dropped : ndarray (R, S) float64 top-s dropped mass per budget, or None.
    """

    layer: int
    heads: np.ndarray
    kv_heads: np.ndarray
    positions: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    keys: np.ndarray | None = None
    queries: np.ndarray | None = None
    logits: np.ndarray | None = None
    dropped: np.ndarray | None = None


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

    @property
    def last_layer(self) -> int:
        return max(self.plans) if self.plans else -1


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("forcedweight_recorder", default=None)


def capture_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """Attention function of the ``AttentionInterface`` (shapes (B, H, T, d), B must be 1)."""
    rec = _ACTIVE.get()
    layer = getattr(module, "layer_idx", None)
    plan = rec.plans.get(layer) if rec is not None else None
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError("the capture runs one sequence at a time (batch size 1)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    group = query.shape[1] // key.shape[1]
    q32, k32, v32 = query[0].float(), key[0].float(), value[0].float()
    heads = torch.as_tensor(plan.heads, dtype=torch.long, device=query.device)
    pos = torch.as_tensor(plan.positions, dtype=torch.long, device=query.device)
    kv_heads = heads // group  # GQA: query head h reads KV head h // (H_q / H_kv)
    # The layer output is exactly what the model computes without the capture, so captured rows
    # never depend on which other layers or heads were selected (and resumed runs are bit-identical).
    output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    q_rows = q32[heads, pos]
    weights, logits, dropped = attention_rows(q_rows, k32, kv_heads, pos + 1, scaling, rec.stats_s, backend=rec.backend)
    cap = LayerCapture(
        layer=int(layer),
        heads=np.asarray(plan.heads),
        kv_heads=kv_heads.cpu().numpy(),
        positions=np.asarray(plan.positions),
        weights=weights.cpu().numpy(),
        values=v32.cpu().numpy(),
        keys=k32.cpu().numpy() if rec.with_keys else None,
        queries=q_rows.cpu().numpy() if rec.with_keys else None,
        logits=logits.cpu().numpy() if rec.with_keys else None,
        dropped=dropped.cpu().numpy() if rec.stats_s else None,
    )
    rec.seen.add(int(layer))
    rec.sink(cap)
    if rec.stop_early and layer == rec.last_layer:
        raise StopCapture()
    return output, None


AttentionInterface.register(ATTENTION_NAME, capture_attention)


@contextlib.contextmanager
def capturing(model, recorder: Recorder):
    """Run ``model`` with the capture attention function and ``recorder`` active, then restore it."""
    config = model.config
    previous = config._attn_implementation
    token = _ACTIVE.set(recorder)
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
        _ACTIVE.reset(token)


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
