"""``ragged_decode`` (packed segments, ``indptr``) and ``segment_decode`` (segment extents of a buffer,
``starts`` / ``lengths``: the ragged cache's layout): validated entry points dispatching to the Triton
kernel, the PyTorch path or the float64 reference.

CUDA tensors go to the Triton split-K kernel, CPU tensors to the PyTorch path; ``backend=`` forces one
("triton" also runs on CPU tensors under ``TRITON_INTERPRET=1``, which is how it is tested).
"""

from __future__ import annotations

import math
import os

import torch

from forcedweight.errors import InputError
from forcedweight.kernels.reference import segment_decode_reference
from forcedweight.kernels.torch_decode import segment_decode_torch
from forcedweight.kernels.triton_decode import segment_decode_triton

BACKENDS = ("triton", "torch", "reference")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INT = (torch.int32, torch.int64)


def _validate_tensors(q, k, v, named_ints, bias) -> None:
    """Shape/dtype/device checks shared by both layouts (``named_ints``: the integer index tensors)."""
    for name, t in (("q", q), ("k", k), ("v", v)) + tuple(named_ints):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"ragged_decode: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise InputError(f"ragged_decode: q must be [B, Hq, D], got shape {tuple(q.shape)}")
    if k.dim() != 2 or v.dim() != 2:
        raise InputError(f"ragged_decode: k must be [T, D] and v [T, Dv], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[1] != q.shape[2]:
        raise InputError(f"ragged_decode: k has head dim {k.shape[1]}, q has {q.shape[2]}")
    if v.shape[0] != k.shape[0]:
        raise InputError(f"ragged_decode: k has {k.shape[0]} entries, v has {v.shape[0]}")
    if q.dtype not in _FLOAT or k.dtype != q.dtype or v.dtype != q.dtype:
        raise InputError(
            f"ragged_decode: q, k, v must share one float dtype (float32, float16, bfloat16), "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    for name, t in named_ints:
        if t.dim() != 1 or t.dtype not in _INT:
            raise InputError(
                f"ragged_decode: {name} must be a 1-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}"
            )
    for name, t in (("k", k), ("v", v)) + tuple(named_ints):
        if t.device != q.device:
            raise InputError(f"ragged_decode: {name} is on {t.device}, q on {q.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (k.shape[0],):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise InputError(f"ragged_decode: bias must be a [T] = [{k.shape[0]}] tensor, got {shape}")
        if bias.dtype not in (torch.float32, torch.float64) or bias.device != q.device:
            raise InputError(f"ragged_decode: bias must be float32 on {q.device}, got {bias.dtype} on {bias.device}")


def validate_features(q, softcap, sinks) -> None:
    """``softcap``: None or a finite number > 0; ``sinks``: None or a float Tensor [Hq] on q's device."""
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
                or softcap <= 0:
            raise InputError(f"ragged_decode: softcap must be None or a finite number > 0, got {softcap!r}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or sinks.shape != (q.shape[1],):
            shape = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
            raise InputError(f"ragged_decode: sinks must be a [Hq] = [{q.shape[1]}] tensor, got {shape}")
        if sinks.dtype not in _FLOAT or sinks.device != q.device:
            raise InputError(f"ragged_decode: sinks must be a float tensor on {q.device}, got {sinks.dtype} on "
                             f"{sinks.device}")


def _heads(B, Hq, S, what) -> tuple[int, int, int]:
    if B == 0 or S <= 0 or S % B != 0:
        raise InputError(f"ragged_decode: {what}, expected B*Hkv with B = {B}")
    Hkv = S // B
    if Hq % Hkv != 0:
        raise InputError(f"ragged_decode: Hq = {Hq} query heads is not a multiple of Hkv = {Hkv} KV heads")
    return S, Hkv, Hq // Hkv


def validate_ragged(q, k, v, indptr, bias=None, check_indptr: bool = True) -> tuple[int, int, int]:
    """Check shapes, dtypes and (when ``check_indptr``; it reads indptr on the host) the segment
    pointer's values; return ``(S, Hkv, G)``.

    Raises ``InputError`` with a one-line message naming the argument at fault.
    """
    _validate_tensors(q, k, v, (("indptr", indptr),), bias)
    S, Hkv, G = _heads(q.shape[0], q.shape[1], indptr.numel() - 1,
                       f"indptr has {indptr.numel()} entries, expected B*Hkv + 1")
    if check_indptr:
        ptr = indptr.cpu()
        if int(ptr[0]) != 0 or int(ptr[-1]) != k.shape[0]:
            raise InputError(
                f"ragged_decode: indptr must start at 0 and end at T = {k.shape[0]}, "
                f"got {int(ptr[0])} .. {int(ptr[-1])}"
            )
        if bool((ptr[1:] < ptr[:-1]).any()):
            raise InputError("ragged_decode: indptr must be non-decreasing")
    return S, Hkv, G


def validate_segments(q, k, v, starts, lengths, bias=None, check: bool = True) -> tuple[int, int, int]:
    """As :func:`validate_ragged` for segment extents: ``starts``, ``lengths`` [B*Hkv] integer, each extent
    inside the buffer's ``C`` rows (checked when ``check``; a host read)."""
    _validate_tensors(q, k, v, (("starts", starts), ("lengths", lengths)), bias)
    if starts.numel() != lengths.numel():
        raise InputError(f"ragged_decode: starts has {starts.numel()} entries, lengths {lengths.numel()}")
    S, Hkv, G = _heads(q.shape[0], q.shape[1], starts.numel(), f"starts has {starts.numel()} entries")
    if check:
        st, ln = starts.cpu().to(torch.int64), lengths.cpu().to(torch.int64)
        if bool((ln < 0).any()) or bool((st < 0).any()):
            raise InputError("ragged_decode: starts and lengths must be non-negative")
        if bool((st + ln > k.shape[0]).any()):
            raise InputError(f"ragged_decode: a segment extends past the buffer's C = {k.shape[0]} rows")
    return S, Hkv, G


def _backend(q, backend):
    if backend is None:
        backend = "triton" if q.is_cuda else "torch"
    if backend not in BACKENDS:
        raise InputError(f"ragged_decode: unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    if backend == "triton":
        if q.dtype == torch.float64:
            raise InputError("ragged_decode: the Triton backend takes float32, float16 or bfloat16, not float64")
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise InputError(
                "ragged_decode: backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"
            )
    return backend


def _dispatch(backend, q, k, v, starts, lengths, bias, sm_scale, host, kernel_options, return_lse=True,
              softcap=None, sinks=None):
    if backend == "reference":
        return segment_decode_reference(q, k, v, starts, lengths, bias, sm_scale, softcap, sinks)
    if backend == "torch":  # kernel_options (num_splits, block_n, max_len) concern the Triton launch only
        return segment_decode_torch(q, k, v, starts, lengths, bias, sm_scale, host=host, return_lse=return_lse,
                                    softcap=softcap, sinks=sinks)
    return segment_decode_triton(q, k, v, starts, lengths, bias, sm_scale, softcap=softcap, sinks=sinks,
                                 **kernel_options)


def ragged_decode(q, k, v, indptr, bias=None, sm_scale=None, backend: str | None = None, check_indptr: bool = True,
                  softcap=None, sinks=None, **kernel_options):
    """Decode attention of one query token per head over ragged per-(batch, KV head) segments.

    Parameters
    ----------
    q : Tensor [B, Hq, D] (float32, float16 or bfloat16)
    k : Tensor [T, D], packed keys, same dtype as q
    v : Tensor [T, Dv], packed values, same dtype as q
    indptr : Tensor [B*Hkv + 1] int32/int64; segment ``b*Hkv + h`` = ``k[indptr[s]:indptr[s+1]]``;
        query head ``j`` of batch ``b`` attends segment ``b*Hkv + j // G``, ``G = Hq // Hkv``.
    bias : optional Tensor [T] float32, added to the scaled logits (natural-log units).
    sm_scale : float, defaults to ``1/sqrt(D)``.
    backend : None (CUDA → "triton", CPU → "torch"), or "triton", "torch", "reference".
    check_indptr : validate indptr's values (a host read; callers that built indptr themselves pass
        False to skip the device sync).
    softcap : None (off) or a float ``c > 0``: scaled logits ``s -> c * tanh(s / c)`` before the bias and
        the softmax (Gemma 2's attention-logit soft-capping).
    sinks : None or Tensor [Hq] (float): one learned sink logit per query head that joins the softmax
        denominator and carries no value (gpt-oss).
    kernel_options : passed to the Triton launch (``num_splits``, ``block_n``, ``max_len`` = the longest
        segment, which saves a device sync); ignored by the other backends.

    Returns
    -------
    out : Tensor [B, Hq, Dv] in q's dtype (float64 for the reference); zeros for an empty segment
    lse : Tensor [B, Hq] float32 (float64 for the reference), natural-log log-sum-exp of the
        (capped) biased scaled logits and the sink; ``-inf`` for an empty segment without a sink.
    """
    validate_ragged(q, k, v, indptr, bias, check_indptr)
    validate_features(q, softcap, sinks)
    backend = _backend(q, backend)
    ptr = indptr.to(torch.int64)
    return _dispatch(backend, q, k, v, ptr[:-1], ptr[1:] - ptr[:-1], bias, sm_scale, None, kernel_options,
                     softcap=softcap, sinks=sinks)


def segment_decode(q, k, v, starts, lengths, bias=None, sm_scale=None, backend: str | None = None,
                   check: bool = True, host=None, return_lse: bool = True, softcap=None, sinks=None,
                   **kernel_options):
    """Decode attention over segment extents of a K/V buffer (the layout of
    :class:`~forcedweight.deploy.ragged_cache.RaggedKVCache`, spare rows between segments included).

    Parameters
    ----------
    q : Tensor [B, Hq, D]
    k : Tensor [C, D], v : Tensor [C, Dv]: buffers; rows outside every segment are never read.
    starts, lengths : Tensor [B*Hkv] int32/int64: segment ``b*Hkv + h`` is rows
        ``starts[s] .. starts[s] + lengths[s] - 1``.
    bias : optional Tensor [C] float32 (entries of the segments are read; the rest is ignored).
    sm_scale, backend, softcap, sinks, kernel_options : as :func:`ragged_decode`.
    check : validate the extents' values (a host read; the cache, which built them, passes False).
    host : optional ``(starts, lengths)`` as Python lists, for the PyTorch path (no tensor reads).
    return_lse : False lets the PyTorch path skip the log-sum-exp (it may then return ``lse = None``).

    Returns
    -------
    (out [B, Hq, Dv], lse [B, Hq]) as :func:`ragged_decode`.
    """
    validate_segments(q, k, v, starts, lengths, bias, check)
    validate_features(q, softcap, sinks)
    backend = _backend(q, backend)
    return _dispatch(backend, q, k, v, starts, lengths, bias, sm_scale, host, kernel_options, return_lse,
                     softcap=softcap, sinks=sinks)
