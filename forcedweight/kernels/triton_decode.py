"""Triton split-K flash decoding over the ragged per-(batch, KV head) layout.

Segments are extents of a buffer: segment ``s`` is rows ``starts[s] .. starts[s] + lengths[s] - 1``
of ``k`` [C, D] / ``v`` [C, Dv] / ``bias`` [C] (the ragged cache's layout, spare rows between segments
never read; packed ``indptr`` segments are ``starts = indptr[:-1]``, ``lengths = diff(indptr)``).

Stage 1 (grid: segments × splits): each program walks one split of one segment in tiles of
``BLOCK_N`` entries; every K/V tile is loaded once and serves all G query heads of the group
(logits are a [G_PAD, BLOCK_N] ``tl.dot``); an online softmax in float32 gives the split's normalised
partial output and its log-sum-exp. Stage 2 (grid: segments) merges the splits by log-sum-exp.
Optional per-entry bias [T] float32 is added to the scaled logits. Empty splits and empty segments
give lse = -inf and contribute nothing (an empty segment's output is 0).
Optional soft-cap ``c`` (``HAS_SOFTCAP``): scaled logits ``s -> c * tanh(s / c)`` before the bias, in
stage 1 (tanh as ``(1 - e^{-2|x|}) / (1 + e^{-2|x|})`` with the sign of x: no overflow). Optional sinks
[Hq] (``HAS_SINKS``): stage 2 merges each head's sink logit as one more split with lse = the sink and a
zero output (it joins the denominator, carries no value).

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests exercise it).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from forcedweight.errors import InputError


@triton.jit
def _split_kernel(
    Q, K, V, Bias, Starts, Lengths, OutP, LseP,
    sm_scale, softcap, num_splits,
    stride_k, stride_v,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, LOW_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):
    seg = tl.program_id(0)
    split = tl.program_id(1)
    start = tl.load(Starts + seg).to(tl.int64)
    length = tl.load(Lengths + seg).to(tl.int64)
    end = start + length
    tiles = tl.cdiv(length, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, num_splits)
    lo = start + split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, end)

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    g_mask = offs_g < G
    q_rows = seg * G + offs_g
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=g_mask[:, None] & (offs_d[None, :] < D), other=0.0)

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        rows = n0 + offs_n
        n_mask = rows < hi
        k_mask = n_mask[:, None] & (offs_d[None, :] < D)
        kt = tl.load(K + rows[:, None] * stride_k + offs_d[None, :], mask=k_mask, other=0.0)
        if DOT_FP32:
            qk = tl.dot(q.to(tl.float32), tl.trans(kt.to(tl.float32)), input_precision="ieee")
        elif LOW_PRECISION:
            qk = tl.dot(q, tl.trans(kt))
        else:
            qk = tl.dot(q, tl.trans(kt), input_precision="ieee")
        qk = qk * sm_scale
        if HAS_SOFTCAP:
            x = qk / softcap
            e = tl.exp(-2.0 * tl.abs(x))
            th = (1.0 - e) / (1.0 + e)
            qk = softcap * tl.where(x >= 0, th, -th)
        if HAS_BIAS:
            bt = tl.load(Bias + rows, mask=n_mask, other=0.0)
            qk = qk + bt[None, :]
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_mask = n_mask[:, None] & (offs_dv[None, :] < DV)
        vt = tl.load(V + rows[:, None] * stride_v + offs_dv[None, :], mask=v_mask, other=0.0)
        if DOT_FP32:
            pv = tl.dot(p.to(vt.dtype).to(tl.float32), vt.to(tl.float32), input_precision="ieee")
        elif LOW_PRECISION:
            pv = tl.dot(p.to(vt.dtype), vt)
        else:
            pv = tl.dot(p, vt, input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    live = l_i > 0
    out = acc / tl.where(live, l_i, 1.0)[:, None]
    lse = tl.where(live, m_i + tl.log(tl.where(live, l_i, 1.0)), float("-inf"))
    part = (seg * num_splits + split) * G + offs_g
    tl.store(OutP + part[:, None] * DV + offs_dv[None, :], out, mask=g_mask[:, None] & (offs_dv[None, :] < DV))
    tl.store(LseP + part, lse, mask=g_mask)


@triton.jit
def _merge_kernel(
    OutP, LseP, Out, Lse, Sinks, num_splits, HQ,
    G: tl.constexpr, G_PAD: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    seg = tl.program_id(0)
    offs_g = tl.arange(0, G_PAD)
    offs_dv = tl.arange(0, BLOCK_DV)
    g_mask = offs_g < G
    o_mask = g_mask[:, None] & (offs_dv[None, :] < DV)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_DV], tl.float32)
    for s in range(0, num_splits):
        part = (seg * num_splits + s) * G + offs_g
        lse_s = tl.load(LseP + part, mask=g_mask, other=float("-inf"))
        o_s = tl.load(OutP + part[:, None] * DV + offs_dv[None, :], mask=o_mask, other=0.0)
        m_new = tl.maximum(m, lse_s)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_use)
        w = tl.exp(lse_s - m_use)
        acc = acc * alpha[:, None] + w[:, None] * o_s
        l = l * alpha + w
        m = m_new
    if HAS_SINKS:  # one more "split": lse = the head's sink logit, output 0
        sink = tl.load(Sinks + (seg * G + offs_g) % HQ, mask=g_mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, sink)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_use)
        acc = acc * alpha[:, None]
        l = l * alpha + tl.exp(sink - m_use)
        m = m_new
    live = l > 0
    out = acc / tl.where(live, l, 1.0)[:, None]
    lse = tl.where(live, m + tl.log(tl.where(live, l, 1.0)), float("-inf"))
    rows = seg * G + offs_g
    tl.store(Out + rows[:, None] * DV + offs_dv[None, :], out.to(Out.dtype.element_ty), mask=o_mask)
    tl.store(Lse + rows, lse, mask=g_mask)


_DTYPE_SIG = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: the least tile width of a ``tl.dot`` operand dimension: a GPU build refuses K < 16 (the interpreter
#: does not), so head dims below 16 are padded (masked loads) and ``block_n`` is at least this
MIN_TILE = 16


def _tile(n: int) -> int:
    """The tile width for a dimension of n entries (the head dim D or DV): a power of two >= ``MIN_TILE``."""
    return max(MIN_TILE, triton.next_power_of_2(n))


def check_launch(num_splits=None, block_n=None) -> None:
    """InputError naming the launch option unless ``num_splits`` is an integer >= 1 and ``block_n`` a
    power of two >= ``MIN_TILE`` (None: the kernel chooses)."""
    if num_splits is not None and (int(num_splits) != num_splits or int(num_splits) < 1):
        raise InputError(f"num_splits must be an integer >= 1, got {num_splits!r}")
    if block_n is not None and (int(block_n) != block_n or int(block_n) < MIN_TILE
                                or int(block_n) & (int(block_n) - 1)):
        raise InputError(f"block_n must be a power of two >= {MIN_TILE}, got {block_n!r}")


def compile_ahead(arch: int = 90, dtype=torch.bfloat16, G: int = 4, D: int = 128, DV: int = 128,
                  block_n: int = 64, has_bias: bool = True, has_softcap: bool = True,
                  has_sinks: bool = True) -> dict:
    """Compile both kernels for a CUDA target without a GPU (Triton's ahead-of-time path); returns
    ``{"split": [stages], "merge": [stages]}`` (e.g. ttir … cubin). Needs ``TRITON_INTERPRET`` unset.

    A check that the kernels lower to machine code for, e.g., sm_90 (H100/H200) on a machine with none.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreting():
        raise RuntimeError("compile_ahead needs TRITON_INTERPRET unset (the kernels are interpreted functions)")
    target = GPUTarget("cuda", arch, 32)
    t = _DTYPE_SIG[dtype]
    g_pad = _tile(G)
    split_sig = {"Q": "*" + t, "K": "*" + t, "V": "*" + t, "Bias": "*fp32", "Starts": "*i64", "Lengths": "*i64", "OutP": "*fp32",
                 "LseP": "*fp32", "sm_scale": "fp32", "softcap": "fp32", "num_splits": "i32", "stride_k": "i64",
                 "stride_v": "i64"}
    check_launch(block_n=block_n)
    split_const = {"G": G, "G_PAD": g_pad, "D": D, "BLOCK_D": _tile(D), "DV": DV,
                   "BLOCK_DV": _tile(DV), "BLOCK_N": block_n, "HAS_BIAS": has_bias,
                   "LOW_PRECISION": dtype != torch.float32, "DOT_FP32": False, "HAS_SOFTCAP": has_softcap}
    split_sig.update({name: "constexpr" for name in split_const})
    merge_sig = {"OutP": "*fp32", "LseP": "*fp32", "Out": "*" + t, "Lse": "*fp32", "Sinks": "*fp32",
                 "num_splits": "i32", "HQ": "i32"}
    merge_const = {"G": G, "G_PAD": g_pad, "DV": DV, "BLOCK_DV": _tile(DV), "HAS_SINKS": has_sinks}
    merge_sig.update({name: "constexpr" for name in merge_const})
    out = {}
    for name, fn, sig, const in (("split", _split_kernel, split_sig, split_const),
                                 ("merge", _merge_kernel, merge_sig, merge_const)):
        out[name] = list(triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=target).asm)
    return out


def _interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1``: the interpreter's bfloat16 ``tl.dot`` is wrong (Triton 3.9), so
    bfloat16 tiles are widened to float32 first (exact: a bf16×bf16 product fits in float32)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def choose_num_splits(num_segments: int, max_len: int, block_n: int, device: torch.device) -> int:
    """Splits per segment so that segments × splits fills the device (about 4 programs per SM),
    never more splits than tiles of the longest segment."""
    if device.type == "cuda":
        programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        programs = 8
    tiles = max(1, triton.cdiv(max_len, block_n))
    return int(max(1, min(tiles, triton.cdiv(programs, max(1, num_segments)), 256)))


def segment_decode_triton(q, k, v, starts, lengths, bias=None, sm_scale=None, num_splits=None, block_n=None,
                          max_len=None, softcap=None, sinks=None):
    """Triton split-K decode over segment extents; arguments and returns as
    :func:`forcedweight.kernels.segment_decode` (inputs assumed validated). ``num_splits`` and ``block_n``
    override the launch choice; ``max_len`` (longest segment, if the caller knows it) avoids reading
    ``lengths`` on the host (a device sync on CUDA). ``softcap`` (float) and ``sinks`` ([Hq]) as
    :func:`forcedweight.kernels.ragged_decode`."""
    check_launch(num_splits, block_n)
    B, Hq, D = q.shape
    S = starts.numel()
    G = Hq // (S // B)
    DV = v.shape[1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    q = q.contiguous()
    if k.stride(1) != 1:
        k = k.contiguous()
    if v.stride(1) != 1:
        v = v.contiguous()
    starts = starts.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    if block_n is None:
        block_n = 64 if max(D, DV) <= 128 else 32
    if num_splits is None:
        if max_len is None:
            max_len = int(lengths.max()) if S > 0 else 0
        num_splits = choose_num_splits(S, max_len, block_n, q.device)
    num_splits = int(num_splits)
    g_pad = _tile(G)
    out_p = torch.empty(S * num_splits * G, DV, dtype=torch.float32, device=q.device)
    lse_p = torch.empty(S * num_splits * G, dtype=torch.float32, device=q.device)
    out = torch.empty(B, Hq, DV, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    has_bias = bias is not None
    bias_t = bias.to(torch.float32).contiguous() if has_bias else lse_p  # dummy pointer when absent
    sinks_t = sinks.to(device=q.device, dtype=torch.float32).contiguous() if sinks is not None else lse_p
    _split_kernel[(S, num_splits)](
        q, k, v, bias_t, starts, lengths, out_p, lse_p,
        scale, 1.0 if softcap is None else float(softcap), num_splits, k.stride(0), v.stride(0),
        G=G, G_PAD=g_pad, D=D, BLOCK_D=_tile(D),
        DV=DV, BLOCK_DV=_tile(DV), BLOCK_N=int(block_n),
        HAS_BIAS=has_bias, LOW_PRECISION=q.dtype != torch.float32,
        DOT_FP32=q.dtype == torch.bfloat16 and _interpreting(), HAS_SOFTCAP=softcap is not None,
    )
    _merge_kernel[(S,)](
        out_p, lse_p, out, lse, sinks_t, num_splits, Hq,
        G=G, G_PAD=g_pad, DV=DV, BLOCK_DV=_tile(DV), HAS_SINKS=sinks is not None,
    )
    return out, lse


def ragged_decode_triton(q, k, v, indptr, bias=None, sm_scale=None, **launch):  # launch: softcap, sinks too
    """:func:`segment_decode_triton` over packed segments ``indptr`` [B*Hkv + 1]."""
    ptr = indptr.to(torch.int64)
    return segment_decode_triton(q, k, v, ptr[:-1], ptr[1:] - ptr[:-1], bias, sm_scale, **launch)
