"""ragged_decode: the Triton kernel (TRITON_INTERPRET=1 on CPU tensors, set in conftest) and the PyTorch
path against the float64 reference; input validation."""

from __future__ import annotations

import math

import pytest
import torch

from forcedweight.kernels import ragged_decode, segment_decode
from forcedweight.kernels.reference import ragged_decode_reference, segment_decode_reference
from forcedweight.kernels.torch_decode import _progression, ragged_decode_torch, segment_decode_torch
from forcedweight.errors import InputError

# Output tolerance per dtype, absolute on outputs of magnitude <= ~1 (convex combinations of N(0,1) values):
# float32 accumulates in float32 (a few ulp over ~100 terms); float16/bfloat16 round inputs, the
# probabilities fed to P·V (Triton path, like flash attention) and the output to 11/8 mantissa bits.
OUT_ATOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
# lse is computed in float32 from exactly representable 16-bit inputs: float32 rounding only.
LSE_ATOL = 2e-5


def make_case(lengths, batch, G, D, Dv=None, dtype=torch.float32, seed=0, with_bias=False):
    """Random ragged inputs: ``lengths`` per (batch, kv head) segment, len(lengths) = batch * Hkv."""
    g = torch.Generator().manual_seed(seed)
    Hkv = len(lengths) // batch
    Dv = Dv or D
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.tensor(lengths), 0)
    T = int(indptr[-1])
    q = torch.randn(batch, Hkv * G, D, generator=g).to(dtype)
    k = torch.randn(T, D, generator=g).to(dtype)
    v = torch.randn(T, Dv, generator=g).to(dtype)
    bias = (2 * torch.randn(T, generator=g)).float() if with_bias else None
    return q, k, v, indptr, bias


def check(out, lse, q, k, v, indptr, bias, dtype, ref=None):
    ref_out, ref_lse = ref if ref is not None else ragged_decode_reference(q, k, v, indptr, bias)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)  # -inf exactly for empty segments
    assert torch.all(out[empty] == 0)
    err = (out.double() - ref_out).abs().max().item()
    assert err <= OUT_ATOL[dtype], err
    if bool(empty.all()):
        return
    lerr = (lse.double() - ref_lse)[~empty].abs().max().item()
    assert lerr <= LSE_ATOL * max(1.0, ref_lse[~empty].abs().max().item()), lerr


# odd lengths, a length-1 segment, an empty segment; 2 batches
LENGTHS = [7, 1, 0, 33, 70, 5]


@pytest.mark.parametrize("G", [1, 2, 3, 8])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("with_bias", [False, True])
def test_triton_fp32_against_reference(G, D, with_bias):
    q, k, v, indptr, bias = make_case(LENGTHS, 2, G, D, with_bias=with_bias, seed=G * D)
    out, lse = ragged_decode(q, k, v, indptr, bias, backend="triton", block_n=16)
    check(out, lse, q, k, v, indptr, bias, torch.float32)


@pytest.mark.parametrize("D,Dv", [(8, 8), (4, 12), (24, 8)])
def test_triton_small_head_dims_against_reference(D, Dv):
    # head dims below 16: tiles padded to 16 (a GPU build refuses a tl.dot K < 16; the interpreter does not)
    q, k, v, indptr, bias = make_case(LENGTHS, 2, 3, D, Dv, with_bias=True, seed=D + Dv)
    out, lse = ragged_decode(q, k, v, indptr, bias, backend="triton", block_n=16, num_splits=2)
    check(out, lse, q, k, v, indptr, bias, torch.float32)


def test_triton_launch_options_checked():
    q, k, v, indptr, _ = make_case([5, 3], 1, 1, 16)
    for opts, name in (({"num_splits": 0}, "num_splits"), ({"num_splits": -1}, "num_splits"),
                       ({"block_n": 0}, "block_n"), ({"block_n": 24}, "block_n"), ({"block_n": 8}, "block_n")):
        with pytest.raises(InputError, match=name):  # num_splits = 0 returned zeros with lse -inf
            ragged_decode(q, k, v, indptr, backend="triton", **opts)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("G,D,with_bias", [(3, 64, True), (8, 128, False), (1, 128, True)])
def test_triton_half_precision_against_reference(dtype, G, D, with_bias):
    q, k, v, indptr, bias = make_case(LENGTHS, 2, G, D, dtype=dtype, with_bias=with_bias, seed=G + D)
    out, lse = ragged_decode(q, k, v, indptr, bias, backend="triton", block_n=16)
    check(out, lse, q, k, v, indptr, bias, dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_triton_split_merge_and_empty_splits(num_splits):
    # 16 splits of 16-entry tiles over segments of <= 70 entries: most splits are empty
    q, k, v, indptr, bias = make_case([70, 1, 17, 0, 33, 2], 3, 2, 64, Dv=48, with_bias=True, seed=num_splits)
    out, lse = ragged_decode(q, k, v, indptr, bias, backend="triton", block_n=16, num_splits=num_splits)
    check(out, lse, q, k, v, indptr, bias, torch.float32)


def test_triton_int32_indptr_and_scale():
    q, k, v, indptr, _ = make_case([9, 4, 1, 12], 1, 3, 64, seed=3)
    out, lse = ragged_decode(q, k, v, indptr.int(), sm_scale=0.3, backend="triton", block_n=16)
    ref_out, ref_lse = ragged_decode_reference(q, k, v, indptr, sm_scale=0.3)
    assert (out.double() - ref_out).abs().max() <= OUT_ATOL[torch.float32]
    assert (lse.double() - ref_lse).abs().max() <= LSE_ATOL * 10


@pytest.mark.parametrize("G", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_torch_path_against_reference(G, dtype, with_bias):
    for D in (64, 128):
        q, k, v, indptr, bias = make_case(LENGTHS, 2, G, D, dtype=dtype, with_bias=with_bias, seed=G * D + 1)
        ref = ragged_decode_reference(q, k, v, indptr, bias)
        out, lse = ragged_decode(q, k, v, indptr, bias)  # CPU tensors: the PyTorch path (per segment here)
        check(out, lse, q, k, v, indptr, bias, dtype, ref)
        for method in ("padded", "scatter"):
            out, lse = ragged_decode_torch(q, k, v, indptr, bias, method=method, chunk=19)
            check(out, lse, q, k, v, indptr, bias, dtype, ref)


def make_segments(lengths, batch, G, D, Dv=None, dtype=torch.float32, seed=0, with_bias=False, cap=None):
    """Random inputs in the cache's extents layout: segment s at ``starts[s]`` with ``lengths[s]`` rows,
    followed by spare rows filled with NaN (K, V and bias), so any read outside a segment shows.
    ``cap``: every segment gets capacity ``cap`` (a uniform, strided layout) instead of random spares.
    Returns (q, k, v, starts, lengths, bias) and the packed (k, v, indptr, bias) of the same segments."""
    g = torch.Generator().manual_seed(seed)
    Hkv = len(lengths) // batch
    Dv = Dv or D
    spare = [cap - n for n in lengths] if cap is not None else torch.randint(0, 5, (len(lengths),), generator=g).tolist()
    caps = [n + e for n, e in zip(lengths, spare)]
    starts = torch.tensor([0] + caps[:-1]).cumsum(0)
    C = sum(caps)
    q = torch.randn(batch, Hkv * G, D, generator=g).to(dtype)
    k = torch.full((C, D), float("nan")).to(dtype)
    v = torch.full((C, Dv), float("nan")).to(dtype)
    bias = torch.full((C,), float("nan")) if with_bias else None
    rows = torch.cat([torch.arange(int(s0), int(s0) + n) for s0, n in zip(starts, lengths)])
    k[rows] = torch.randn(len(rows), D, generator=g).to(dtype)
    v[rows] = torch.randn(len(rows), Dv, generator=g).to(dtype)
    if with_bias:
        bias[rows] = 2 * torch.randn(len(rows), generator=g)
    lens = torch.tensor(lengths, dtype=torch.int64)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    packed = (k[rows], v[rows], indptr, None if bias is None else bias[rows])
    return (q, k, v, starts, lens, bias), packed


# odd lengths, length 1, empty segments, and lengths on both sides of the 16-row tile boundary
SEG_LENGTHS = [15, 16, 17, 0, 1, 33, 70, 0]


@pytest.mark.parametrize("G", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("dtype,with_bias", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True)])
def test_segment_decode_triton_and_torch_against_reference(G, dtype, with_bias):
    # the cache's layout (extents with NaN-filled spare rows between them): Triton (16-row tiles, so a
    # tile boundary falls inside segments of 17, 33, 70), the PyTorch per-segment path and the reference
    # over the packed copy of the same segments agree
    (q, k, v, starts, lens, bias), (pk, pv, indptr, pb) = make_segments(
        SEG_LENGTHS, 2, G, 64, dtype=dtype, with_bias=with_bias, seed=10 * G + with_bias)
    ref = ragged_decode_reference(q, pk, pv, indptr, pb)
    seg_ref = segment_decode_reference(q, k, v, starts, lens, bias)
    assert torch.equal(seg_ref[0], ref[0]) and torch.equal(seg_ref[1], ref[1])  # the two references agree
    for backend, opts in (("triton", {"block_n": 16}), ("triton", {"block_n": 16, "num_splits": 3}), ("torch", {})):
        out, lse = segment_decode(q, k, v, starts, lens, bias, backend=backend, **opts)
        check(out, lse, q, k, v, indptr, bias, dtype, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n", [0, 1, 17])
def test_segment_decode_uniform_strided_layout(dtype, with_bias, n):
    # equal lengths and capacities (an unevicted cache): the PyTorch path's single strided view
    (q, k, v, starts, lens, bias), (pk, pv, indptr, pb) = make_segments(
        [n] * 6, 2, 3, 64, dtype=dtype, with_bias=with_bias, seed=n, cap=n + 5)
    assert segment_decode_torch.__module__ == "forcedweight.kernels.torch_decode"
    assert _progression(starts.tolist(), lens.tolist()) == n + 5  # the strided branch is taken
    ref = ragged_decode_reference(q, pk, pv, indptr, pb)
    for backend in ("torch", "triton"):
        out, lse = segment_decode(q, k, v, starts, lens, bias, backend=backend, block_n=16)
        check(out, lse, q, k, v, indptr, bias, dtype, ref)


@pytest.mark.parametrize("with_bias", [False, True])
def test_segment_decode_torch_cross_check_methods(with_bias):
    (q, k, v, starts, lens, bias), (pk, pv, indptr, pb) = make_segments(
        SEG_LENGTHS, 2, 3, 64, with_bias=with_bias, seed=21)
    ref = ragged_decode_reference(q, pk, pv, indptr, pb)
    for method in ("auto", "padded", "scatter"):
        out, lse = segment_decode_torch(q, k, v, starts, lens, bias, method=method, chunk=19)
        check(out, lse, q, k, v, indptr, bias, torch.float32, ref)
    out, lse = segment_decode_torch(q, k, v, starts, lens, bias, host=(starts.tolist(), lens.tolist()))
    check(out, lse, q, k, v, indptr, bias, torch.float32, ref)


@pytest.mark.parametrize("with_bias", [False, True])
def test_rows_outside_every_segment_are_never_read(with_bias):
    # spare capacity holds NaN (the cache allocates with new_empty); row 0 among it: the padded method
    # gathered row 0 for its padding and gave out 0, lse -inf on segments shorter than the longest
    (q, k, v, starts, lens, bias), (pk, pv, indptr, pb) = make_segments(
        SEG_LENGTHS, 2, 3, 16, with_bias=with_bias, seed=22)
    pad = 3
    k, v = (torch.cat([torch.full((pad, t.shape[1]), float("nan")), t]) for t in (k, v))
    bias = None if bias is None else torch.cat([torch.full((pad,), float("nan")), bias])
    starts = starts + pad
    ref = ragged_decode_reference(q, pk, pv, indptr, pb)
    for method in ("auto", "padded", "scatter"):
        out, lse = segment_decode_torch(q, k, v, starts, lens, bias, method=method, chunk=19)
        check(out, lse, q, k, v, indptr, bias, torch.float32, ref)
    out, lse = segment_decode(q, k, v, starts, lens, bias, backend="triton", block_n=16)
    check(out, lse, q, k, v, indptr, bias, torch.float32, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("uniform", [False, True])
def test_segment_decode_output_only_fused_path(dtype, uniform):
    # return_lse=False without bias (the attention function's decode step): torch SDPA over the same
    # strided / per-segment views; NaN spare rows and empty segments included
    lengths = [7] * 6 if uniform else SEG_LENGTHS[:6]
    (q, k, v, starts, lens, _), (pk, pv, indptr, _) = make_segments(
        lengths, 2, 3, 64, dtype=dtype, seed=31 + uniform, cap=9 if uniform else None)
    ref_out, ref_lse = ragged_decode_reference(q, pk, pv, indptr)
    out, lse = segment_decode(q, k, v, starts, lens, return_lse=False)
    assert lse is None and out.dtype == dtype
    assert (out.double() - ref_out).abs().max() <= OUT_ATOL[dtype]
    assert torch.all(out[torch.isneginf(ref_lse)] == 0)


def test_segment_decode_validation():
    (q, k, v, starts, lens, _), _ = make_segments([5, 4, 3, 2], 1, 2, 64, seed=3)
    with pytest.raises(InputError, match="past the buffer"):
        segment_decode(q, k, v, starts + k.shape[0] - 4, lens)
    with pytest.raises(InputError, match="non-negative"):
        segment_decode(q, k, v, starts, -lens)
    with pytest.raises(InputError, match="lengths 3"):
        segment_decode(q, k, v, starts, lens[:3])
    with pytest.raises(InputError, match="starts must be"):
        segment_decode(q, k, v, starts.float(), lens)


def test_all_segments_empty():
    q, k, v, indptr, _ = make_case([0, 0], 1, 2, 64)
    for backend in ("torch", "triton"):
        out, lse = ragged_decode(q, k, v, indptr, backend=backend)
        assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_reference_matches_dense_softmax():
    # the reference itself against a dense formula: one segment per head of one batch, no bias
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2 * 9, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2 * 9, 16, generator=g, dtype=torch.float64)
    indptr = torch.tensor([0, 9, 18])
    out, lse = ragged_decode_reference(q, k, v, indptr)
    kk, vv = k.view(2, 9, 16).repeat_interleave(2, 0), v.view(2, 9, 16).repeat_interleave(2, 0)
    logits = torch.einsum("hd,hnd->hn", q[0], kk) / math.sqrt(16)
    assert torch.allclose(lse[0], torch.logsumexp(logits, -1), atol=1e-12)
    assert torch.allclose(out[0], torch.einsum("hn,hnd->hd", torch.softmax(logits, -1), vv), atol=1e-12)


def test_bias_minus_inf_masks_entries():
    q, k, v, indptr, _ = make_case([5, 6], 1, 2, 64, seed=4)
    bias = torch.zeros(11)
    bias[[0, 2, 7]] = -math.inf
    keep = torch.tensor([1, 3, 4, 5, 6, 8, 9, 10])  # segment 0 keeps 3, segment 1 keeps 5
    for backend in ("torch", "triton"):
        out, lse = ragged_decode(q, k, v, indptr, bias, backend=backend, block_n=16) if backend == "triton" else \
            ragged_decode(q, k, v, indptr, bias, backend=backend)
        ref_out, ref_lse = ragged_decode_reference(q, k[keep], v[keep], torch.tensor([0, 3, 8]))
        assert (out.double() - ref_out).abs().max() <= OUT_ATOL[torch.float32]
        assert (lse.double() - ref_lse).abs().max() <= LSE_ATOL * 10


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda a: a.update(q=a["q"][0]), "q must be"),
        (lambda a: a.update(k=a["k"][:, :32]), "head dim"),
        (lambda a: a.update(v=a["v"][:-1]), "entries"),
        (lambda a: a.update(indptr=a["indptr"][:-1]), "indptr"),
        (lambda a: a.update(indptr=torch.tensor([0, 5, 3, 12])), "non-decreasing"),
        (lambda a: a.update(indptr=torch.tensor([0, 5, 9, 11])), "end at T"),
        (lambda a: a.update(indptr=a["indptr"].float()), "int32/int64"),
        (lambda a: a.update(k=a["k"].half()), "dtype"),
        (lambda a: a.update(bias=torch.zeros(3)), "bias"),
        (lambda a: a.update(q=torch.randn(1, 4, 64)), "multiple"),
    ],
)
def test_validation_errors(mutate, message):
    q, k, v, indptr, _ = make_case([5, 4, 3], 1, 2, 64)
    args = dict(q=q, k=k, v=v, indptr=indptr)
    mutate(args)
    with pytest.raises(InputError, match=message):
        ragged_decode(**args)


def test_unknown_backend():
    q, k, v, indptr, _ = make_case([2, 2], 1, 1, 64)
    with pytest.raises(InputError, match="backend"):
        ragged_decode(q, k, v, indptr, backend="cuda")


def test_triton_kernels_compile_for_sm90(tmp_path):
    # No GPU here: compile both kernels ahead of time for sm_90 (H100/H200) down to a cubin, float32 and
    # bfloat16, in a subprocess without TRITON_INTERPRET, so a lowering error (dot shapes, loop types)
    # fails CI.
    import os
    import subprocess
    import sys

    code = (
        "import torch; from forcedweight.kernels.triton_decode import compile_ahead\n"
        "for dt in (torch.float32, torch.bfloat16):\n"
        "    for G, D, DV, bn in ((3, 64, 64, 64), (1, 8, 8, 16)):  # head dims below 16: padded tiles\n"
        "        r = compile_ahead(90, dt, G=G, D=D, DV=DV, block_n=bn)\n"
        "        assert r['split'][-1] == 'cubin' and r['merge'][-1] == 'cubin', r\n"
        "print('ok')"
    )
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path), "TRITON_DEFAULT_FP_FUSION": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=170)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
