"""``ragged_decode``: validated entry point dispatching to the Triton kernel, the PyTorch path or the
float64 reference.

CUDA tensors go to the Triton split-K kernel, CPU tensors to the vectorised PyTorch path; ``backend=``
forces one ("triton" also runs on CPU tensors under ``TRITON_INTERPRET=1``, which is how it is tested).
"""

from __future__ import annotations

import os

import torch

from forcedweight.errors import InputError

BACKENDS = ("triton", "torch", "reference")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def validate_ragged(q, k, v, indptr, bias=None, check_indptr: bool = True) -> tuple[int, int, int]:
    """Check shapes, dtypes and (when ``check_indptr``; it reads indptr on the host) the segment
    pointer's values; return ``(S, Hkv, G)``.

    Raises ``InputError`` with a one-line message naming the argument at fault.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("indptr", indptr)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"ragged_decode: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise InputError(f"ragged_decode: q must be [B, Hq, D], got shape {tuple(q.shape)}")
    if k.dim() != 2 or v.dim() != 2:
        raise InputError(f"ragged_decode: k must be [T, D] and v [T, Dv], got {tuple(k.shape)} and {tuple(v.shape)}")
    B, Hq, D = q.shape
    if k.shape[1] != D:
        raise InputError(f"ragged_decode: k has head dim {k.shape[1]}, q has {D}")
    if v.shape[0] != k.shape[0]:
        raise InputError(f"ragged_decode: k has {k.shape[0]} entries, v has {v.shape[0]}")
    if q.dtype not in _FLOAT or k.dtype != q.dtype or v.dtype != q.dtype:
        raise InputError(
            f"ragged_decode: q, k, v must share one float dtype (float32, float16, bfloat16), "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if indptr.dim() != 1 or indptr.dtype not in (torch.int32, torch.int64):
        raise InputError(
            f"ragged_decode: indptr must be a 1-D int32/int64 tensor, got {indptr.dtype} {tuple(indptr.shape)}"
        )
    S = indptr.numel() - 1
    if B == 0 or S <= 0 or S % B != 0:
        raise InputError(f"ragged_decode: indptr has {indptr.numel()} entries, expected B*Hkv + 1 with B = {B}")
    Hkv = S // B
    if Hq % Hkv != 0:
        raise InputError(f"ragged_decode: Hq = {Hq} query heads is not a multiple of Hkv = {Hkv} KV heads")
    for name, t in (("k", k), ("v", v), ("indptr", indptr)):
        if t.device != q.device:
            raise InputError(f"ragged_decode: {name} is on {t.device}, q on {q.device}")
    ptr = indptr.cpu() if check_indptr else None
    if ptr is not None and (int(ptr[0]) != 0 or int(ptr[-1]) != k.shape[0]):
        raise InputError(
            f"ragged_decode: indptr must start at 0 and end at T = {k.shape[0]}, got {int(ptr[0])} .. {int(ptr[-1])}"
        )
    if ptr is not None and bool((ptr[1:] < ptr[:-1]).any()):
        raise InputError("ragged_decode: indptr must be non-decreasing")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (k.shape[0],):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise InputError(f"ragged_decode: bias must be a [T] = [{k.shape[0]}] tensor, got {shape}")
        if bias.dtype not in (torch.float32, torch.float64) or bias.device != q.device:
            raise InputError(f"ragged_decode: bias must be float32 on {q.device}, got {bias.dtype} on {bias.device}")
    return S, Hkv, Hq // Hkv


def ragged_decode(q, k, v, indptr, bias=None, sm_scale=None, backend: str | None = None, check_indptr: bool = True,
                  **kernel_options):
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
    check_indptr : validate indptr's values (a host read; callers that built indptr themselves, like the
        ragged cache, pass False to skip the device sync).
    kernel_options : passed to the Triton launch (``num_splits``, ``block_n``, ``max_len`` = the longest
        segment, which saves a device sync); ignored by the other backends.

    Returns
    -------
    out : Tensor [B, Hq, Dv] in q's dtype (float64 for the reference); zeros for an empty segment
    lse : Tensor [B, Hq] float32 (float64 for the reference), natural-log log-sum-exp of the
        biased scaled logits; ``-inf`` for an empty segment.
    """
    validate_ragged(q, k, v, indptr, bias, check_indptr)
    if backend is None:
        backend = "triton" if q.is_cuda else "torch"
    if backend not in BACKENDS:
        raise InputError(f"ragged_decode: unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    if backend == "reference":
        from forcedweight.kernels.reference import ragged_decode_reference

        return ragged_decode_reference(q, k, v, indptr, bias, sm_scale)
    if backend == "torch":  # kernel_options (num_splits, block_n, max_len) concern the Triton launch only
        from forcedweight.kernels.torch_decode import ragged_decode_torch

        return ragged_decode_torch(q, k, v, indptr, bias, sm_scale)
    if q.dtype == torch.float64:
        raise InputError("ragged_decode: the Triton backend takes float32, float16 or bfloat16, not float64")
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise InputError("ragged_decode: backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
    from forcedweight.kernels.triton_decode import ragged_decode_triton

    return ragged_decode_triton(q, k, v, indptr, bias, sm_scale, **kernel_options)
