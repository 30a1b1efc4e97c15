"""Attention rows and their top-s dropped mass, in one pass: a Triton kernel and a PyTorch path.

For each requested query row r (one query vector against the ``n_keys[r]`` keys of its KV head
that start at key ``key_start[r]``, default 0: a sliding-window row starts later) both paths return

- ``weights[r, :n]``: the float32 softmax of the scores (zero beyond ``n``),
- ``logits[r, :n]``: the scores before the softmax, ``scaling * <q_r, k_j>``, or with a logit
  soft-cap ``c`` (Gemma 2) ``c * tanh(scaling * <q_r, k_j> / c)``,
- ``dropped[r, j]``: the dropped mass of the top-``s_j`` set, ``D = 1 - sum of the s_j largest
  weights``, computed as the sum of the ``n - s_j`` smallest weights (no cancellation when D is
  tiny); 0 when ``s_j >= n``.

The Triton kernel (used by ``forcedweight dump`` on CUDA) runs one program per row: it streams
the keys in blocks to form the scores and their running maximum, then loads the whole row,
normalises it, sorts it in registers (``tl.sort``) and sums the tail for every budget. Scores
are elementwise products summed in float32 (no TF32 ``tl.dot``), so both paths agree to float32
rounding. The PyTorch path gives the same numbers on CPU; tests run the kernel on CPU with
``TRITON_INTERPRET=1`` (which must be set before this module is imported).
"""

from __future__ import annotations

from typing import Sequence

import torch

try:  # Triton is optional at run time: the PyTorch path covers CPU use.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - triton is a declared dependency
    HAVE_TRITON = False


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# ----------------------------------------------------------------------------- PyTorch path


def dropped_mass_torch(weights: torch.Tensor, s_values: Sequence[int]) -> torch.Tensor:
    """Dropped mass of the top-s set for each row and budget.

    Parameters
    ----------
    weights : Tensor (R, N_max), non-negative, zero-padded beyond each row's length.
    s_values : budgets, each >= 1.

    Returns
    -------
    Tensor (R, len(s_values)), float64: the sum of all but the s largest weights of each row.
    """
    srt = torch.sort(weights.to(torch.float64), dim=-1, descending=True).values
    # tail[:, i] = sum of srt[:, i:], so the dropped mass at budget s is tail[:, s].
    tail = torch.flip(torch.cumsum(torch.flip(srt, dims=[-1]), dim=-1), dims=[-1])
    tail = torch.cat([tail, torch.zeros_like(tail[:, :1])], dim=-1)
    n_max = weights.shape[-1]
    cols = [tail[:, min(int(s), n_max)] for s in s_values]
    if not cols:
        return torch.zeros(weights.shape[0], 0, dtype=torch.float64, device=weights.device)
    return torch.stack(cols, dim=-1)


def attention_rows_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    kv_index: torch.Tensor,
    n_keys: torch.Tensor,
    scaling: float,
    s_values: Sequence[int] = (),
    key_start: torch.Tensor | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch path: causal attention rows, their scores and top-s dropped mass.

    Parameters
    ----------
    q : Tensor (R, D), one query vector per row.
    k : Tensor (H_kv, T, D), keys of every KV head (post-RoPE).
    kv_index : Tensor (R,) int, the KV head of each row.
    n_keys : Tensor (R,) int, keys seen by each row (query position + 1, or the window),
        1 <= key_start + n_keys <= T.
    scaling : the softmax scale (``head_dim ** -0.5`` for Llama).
    s_values : budgets for the dropped-mass statistics.
    key_start : Tensor (R,) int or None, first key of each row (None: 0).
    softcap : attention-logit soft-cap ``c`` or None: scores become ``c * tanh(score / c)``.

    Returns
    -------
    weights : Tensor (R, T) float32, zero beyond ``n_keys``.
    logits : Tensor (R, T) float32, zero beyond ``n_keys``.
    dropped : Tensor (R, len(s_values)) float64.
    """
    q = q.to(torch.float32)
    k = k.to(torch.float32)
    r, t = q.shape[0], k.shape[1]
    logits = torch.zeros(r, t, dtype=torch.float32, device=q.device)
    kv_index = kv_index.to(device=q.device, dtype=torch.long)
    for h in range(k.shape[0]):  # one matmul per KV head: no (R, T, D) gather
        sel = torch.nonzero(kv_index == h).flatten()
        if sel.numel():
            logits[sel] = (q[sel] @ k[h].transpose(0, 1)) * scaling
    if key_start is not None:  # shift each row so that column j holds key key_start + j
        cols = key_start.to(device=q.device, dtype=torch.long)[:, None] + torch.arange(t, device=q.device)[None, :]
        logits = torch.gather(logits, 1, cols.clamp(max=t - 1))
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    valid = torch.arange(t, device=q.device)[None, :] < n_keys.to(q.device)[:, None]
    weights = torch.softmax(logits.masked_fill(~valid, float("-inf")), dim=-1)
    logits = logits.masked_fill(~valid, 0.0)
    return weights, logits, dropped_mass_torch(weights, s_values)


# ----------------------------------------------------------------------------- Triton kernel

if HAVE_TRITON:

    @triton.jit
    def _attention_rows_kernel(
        q_ptr,
        k_ptr,
        kv_ptr,
        n_ptr,
        start_ptr,
        s_ptr,
        w_ptr,
        l_ptr,
        d_ptr,
        scaling,
        softcap,
        stride_qr,
        stride_kh,
        stride_kt,
        stride_wr,
        stride_dr,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
        NS: tl.constexpr,
        HAS_START: tl.constexpr,
        HAS_CAP: tl.constexpr,
    ):
        r = tl.program_id(0)
        kvh = tl.load(kv_ptr + r).to(tl.int64)
        n = tl.load(n_ptr + r)
        k0 = 0
        if HAS_START:
            k0 = tl.load(start_ptr + r).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < D
        q = tl.load(q_ptr + r * stride_qr + offs_d, mask=dmask, other=0.0).to(tl.float32)
        m = tl.full((), float("-inf"), tl.float32)
        # Pass 1: scores in blocks of keys, written to the logits row; running maximum.
        for start in range(0, n, BLOCK_K):
            offs_k = start + tl.arange(0, BLOCK_K)
            kmask = offs_k < n
            kt = tl.load(
                k_ptr + kvh * stride_kh + (k0 + offs_k[:, None]) * stride_kt + offs_d[None, :],
                mask=kmask[:, None] & dmask[None, :],
                other=0.0,
            ).to(tl.float32)
            logit = tl.sum(kt * q[None, :], axis=1) * scaling
            if HAS_CAP:  # c * tanh(x / c), tanh(y) = sign(y) (1 - e) / (1 + e) with e = exp(-2|y|)
                y = logit / softcap
                e = tl.exp(-2.0 * tl.abs(y))
                th = (1.0 - e) / (1.0 + e)
                logit = tl.where(y < 0, -th, th) * softcap
            tl.store(l_ptr + r * stride_wr + offs_k, logit, mask=kmask)
            m = tl.maximum(m, tl.max(tl.where(kmask, logit, float("-inf")), axis=0))
        tl.debug_barrier()
        # Pass 2: the whole row in registers: softmax, sort, tail sums per budget.
        offs_n = tl.arange(0, BLOCK_N)
        nmask = offs_n < n
        logit = tl.load(l_ptr + r * stride_wr + offs_n, mask=nmask, other=0.0)
        e = tl.where(nmask, tl.exp(logit - m), 0.0)
        p = e / tl.sum(e, axis=0)
        tl.store(w_ptr + r * stride_wr + offs_n, p, mask=nmask)
        srt = tl.sort(p, descending=True)
        for j in tl.static_range(NS):
            s = tl.load(s_ptr + j)
            tail = tl.sum(tl.where(offs_n >= s, srt, 0.0), axis=0)
            tl.store(d_ptr + r * stride_dr + j, tail)


def attention_rows_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    kv_index: torch.Tensor,
    n_keys: torch.Tensor,
    scaling: float,
    s_values: Sequence[int] = (),
    block_k: int = 64,
    key_start: torch.Tensor | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton kernel: same contract as :func:`attention_rows_torch` (dropped mass summed in float32).

    Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``.
    """
    if not HAVE_TRITON:  # pragma: no cover
        raise RuntimeError("triton is not installed")
    device = q.device
    q = q.to(torch.float32).contiguous()
    k = k.to(torch.float32).contiguous()
    r, d = q.shape
    t = k.shape[1]
    weights = torch.zeros(r, t, dtype=torch.float32, device=device)
    logits = torch.zeros(r, t, dtype=torch.float32, device=device)
    ns = len(s_values)
    dropped = torch.zeros(r, max(ns, 1), dtype=torch.float32, device=device)
    s_tensor = torch.tensor(list(s_values) or [1], dtype=torch.int32, device=device)
    if r == 0:
        return weights, logits, dropped[:, :ns].to(torch.float64)
    kv_index = kv_index.to(device=device, dtype=torch.int32).contiguous()
    n_keys = n_keys.to(device=device, dtype=torch.int32).contiguous()
    starts = n_keys if key_start is None else key_start.to(device=device, dtype=torch.int32).contiguous()
    _attention_rows_kernel[(r,)](
        q,
        k,
        kv_index,
        n_keys,
        starts,
        s_tensor,
        weights,
        logits,
        dropped,
        float(scaling),
        float(softcap or 1.0),
        q.stride(0),
        k.stride(0),
        k.stride(1),
        weights.stride(0),
        dropped.stride(0),
        D=d,
        BLOCK_D=_next_pow2(d),
        BLOCK_K=min(block_k, _next_pow2(t)),
        BLOCK_N=_next_pow2(t),
        NS=ns,
        HAS_START=key_start is not None,
        HAS_CAP=softcap is not None,
    )
    return weights, logits, dropped[:, :ns].to(torch.float64)


def attention_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    kv_index: torch.Tensor,
    n_keys: torch.Tensor,
    scaling: float,
    s_values: Sequence[int] = (),
    backend: str = "auto",
    key_start: torch.Tensor | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dispatch: ``"auto"`` takes Triton on CUDA and PyTorch elsewhere; or force ``"torch"``/``"triton"``."""
    if backend == "auto":
        backend = "triton" if (q.is_cuda and HAVE_TRITON) else "torch"
    if backend == "triton":
        return attention_rows_triton(q, k, kv_index, n_keys, scaling, s_values, key_start=key_start, softcap=softcap)
    if backend == "torch":
        return attention_rows_torch(q, k, kv_index, n_keys, scaling, s_values, key_start=key_start, softcap=softcap)
    raise ValueError(f"unknown backend {backend!r} (auto, torch, triton)")
