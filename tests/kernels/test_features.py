"""ragged_decode / segment_decode with attention-logit soft-capping (Gemma 2) and learned sinks (gpt-oss):
the float64 reference against an independent dense computation written as transformers' eager attention
(``softcap * tanh(s / softcap)``, then the mask; sinks concatenated as one more logit whose probability
is dropped), then the Triton kernel (TRITON_INTERPRET=1, conftest) and every PyTorch method against the
reference, over odd lengths, an empty segment and GQA layouts; validation of the two arguments."""

from __future__ import annotations

import math

import pytest
import torch

from forcedweight.errors import InputError
from forcedweight.kernels import ragged_decode, segment_decode
from forcedweight.kernels.reference import ragged_decode_reference
from forcedweight.kernels.torch_decode import ragged_decode_torch
from tests.kernels.test_kernels import LSE_ATOL, OUT_ATOL, check, make_case

LENGTHS = [7, 1, 0, 33, 70, 5]  # odd lengths, a length-1 and an empty segment; 2 batches x 3 KV heads


def _sinks(Hq, seed):
    return (1.5 * torch.randn(Hq, generator=torch.Generator().manual_seed(seed))).float()


def _eager(q, k, v, indptr, bias, softcap, sinks, scale):
    """transformers' eager definition per (batch, query head), float64: dense softmax with the sink column."""
    B, Hq, D = q.shape
    Hkv = (indptr.numel() - 1) // B
    G = Hq // Hkv
    out = torch.zeros(B, Hq, v.shape[1], dtype=torch.float64)
    for b in range(B):
        for j in range(Hq):
            s = b * Hkv + j // G
            lo, hi = int(indptr[s]), int(indptr[s + 1])
            w = (k[lo:hi].double() @ q[b, j].double()) * scale
            if softcap is not None:
                w = torch.tanh(w / softcap) * softcap
            if bias is not None:
                w = w + bias[lo:hi].double()
            if sinks is not None:
                w = torch.cat([w, sinks[j:j + 1].double()])
            if w.numel() == 0:
                continue
            p = torch.softmax(w, 0)[: hi - lo]  # the sink's probability is dropped
            out[b, j] = p @ v[lo:hi].double()
    return out


@pytest.mark.parametrize("softcap,with_sinks", [(3.0, False), (None, True), (2.0, True)])
@pytest.mark.parametrize("G", [1, 3])
def test_reference_equals_eager_definition(softcap, with_sinks, G):
    q, k, v, indptr, bias = make_case(LENGTHS, 2, G, 16, with_bias=True, seed=G)
    q = 3 * q  # logits of several units: the cap and the sinks matter
    sinks = _sinks(q.shape[1], G) if with_sinks else None
    out, lse = ragged_decode_reference(q, k, v, indptr, bias, 0.5, softcap, sinks)
    assert (out - _eager(q, k, v, indptr, bias, softcap, sinks, 0.5)).abs().max() <= 1e-12  # float64 both sides
    # the cap moves the output (so the comparison above could fail if it were ignored)
    plain, _ = ragged_decode_reference(q, k, v, indptr, bias, 0.5)
    assert (out - plain).abs().max() > 1e-2
    if with_sinks:  # empty segment: output 0, lse = the sink logit
        empty = torch.tensor([n == 0 for n in LENGTHS]).repeat_interleave(G).view(2, -1)
        assert torch.all(out[empty] == 0) and torch.allclose(lse[empty], sinks.view(1, -1).expand(2, -1)[empty].double())


def _close(out, lse, ref, dtype=torch.float32, what=""):
    """out within OUT_ATOL; lse -inf exactly where the reference's is (an empty segment without a sink),
    else within LSE_ATOL relative to its magnitude."""
    ref_out, ref_lse = ref
    assert (out.double() - ref_out).abs().max() <= OUT_ATOL[dtype], what
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), what
    scale = max(1.0, ref_lse[~empty].abs().max().item())
    assert (lse.double() - ref_lse)[~empty].abs().max() <= LSE_ATOL * scale, what


# every (GQA layout, feature) pair once; bias on alternate cases (CI time: Triton is interpreted)
CASES = [(G, Dv, softcap, with_sinks, (i + j) % 2 == 0)
         for i, (G, Dv) in enumerate(((1, 16), (2, 24), (4, 16)))
         for j, (softcap, with_sinks) in enumerate(((3.0, False), (None, True), (1.5, True)))]


@pytest.mark.parametrize("G,Dv,softcap,with_sinks,with_bias", CASES)
def test_triton_and_torch_against_reference(G, Dv, softcap, with_sinks, with_bias):
    q, k, v, indptr, bias = make_case(LENGTHS, 2, G, 32, Dv=Dv, with_bias=with_bias, seed=G + Dv)
    q = 3 * q
    sinks = _sinks(q.shape[1], G + 7) if with_sinks else None
    ref = ragged_decode_reference(q, k, v, indptr, bias, None, softcap, sinks)
    for backend, opts in (("triton", dict(block_n=16)), ("triton", dict(block_n=16, num_splits=3)), ("torch", {})):
        out, lse = ragged_decode(q, k, v, indptr, bias, backend=backend, softcap=softcap, sinks=sinks, **opts)
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        _close(out, lse, ref, what=backend)
        if not with_sinks:
            check(out, lse, q, k, v, indptr, bias, torch.float32, ref=ref)
    for method in ("padded", "scatter"):  # the PyTorch cross-check methods
        out, lse = ragged_decode_torch(q, k, v, indptr, bias, method=method, softcap=softcap, sinks=sinks)
        _close(out, lse, ref, what=method)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_half_precision_with_features(dtype):
    q, k, v, indptr, bias = make_case(LENGTHS, 2, 2, 32, dtype=dtype, with_bias=True, seed=11)
    sinks = _sinks(q.shape[1], 5)
    ref = ragged_decode_reference(q, k, v, indptr, bias, None, 2.5, sinks)
    out, lse = ragged_decode(q, k, v, indptr, bias, backend="triton", block_n=16, softcap=2.5, sinks=sinks)
    assert out.dtype == dtype
    _close(out, lse, ref, dtype)


def test_segment_decode_uniform_strided_with_features():
    # an unevicted cache's layout: equal lengths, starts an arithmetic progression with spare rows
    S, n, W, D, G = 4, 9, 13, 16, 2
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(S * W, D, generator=g), torch.randn(S * W, D, generator=g)
    q = 3 * torch.randn(2, S // 2 * G, D, generator=g)
    starts, lengths = torch.arange(S) * W, torch.full((S,), n)
    sinks = _sinks(q.shape[1], 1)
    indptr = torch.arange(S + 1) * n
    rows = torch.cat([torch.arange(s * W, s * W + n) for s in range(S)])
    ref, _ = ragged_decode_reference(q, k[rows], v[rows], indptr, None, None, 3.0, sinks)
    for backend in ("torch", "triton"):
        for return_lse in (True, False):
            out, _ = segment_decode(q, k, v, starts, lengths, backend=backend, softcap=3.0, sinks=sinks,
                                    return_lse=return_lse)
            assert (out.double() - ref).abs().max() <= OUT_ATOL[torch.float32], backend


@pytest.mark.parametrize("kwargs,message", [
    (dict(softcap=0.0), "softcap must be None or a finite number > 0"),
    (dict(softcap=-1.0), "softcap must be None or a finite number > 0"),
    (dict(softcap=math.inf), "softcap must be None or a finite number > 0"),
    (dict(softcap="3"), "softcap must be None or a finite number > 0"),
    (dict(sinks=torch.zeros(5)), r"sinks must be a \[Hq\] = \[6\] tensor"),
    (dict(sinks=[0.0] * 6), r"sinks must be a \[Hq\] = \[6\] tensor"),
    (dict(sinks=torch.zeros(6, dtype=torch.int64)), "sinks must be a float tensor"),
])
def test_feature_validation(kwargs, message):
    q, k, v, indptr, _ = make_case([3, 4], 1, 3, 16)
    with pytest.raises(InputError, match=message):
        ragged_decode(q, k, v, indptr, **kwargs)
    with pytest.raises(InputError, match=message):
        segment_decode(q, k, v, indptr[:-1], indptr[1:] - indptr[:-1], **kwargs)
