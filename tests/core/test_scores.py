"""The eviction score rules (forcedweight.core.scores), each against an independent computation:
explicit loops in float64, or PyTorch's own pooling for SnapKV's average pooling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forcedweight.core import scores
from forcedweight.core.operator import rank_order, top_s


def _attn(rng, *shape):
    a = rng.random(shape) * (rng.random(shape) < 0.8)
    return a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-300)


def test_knorm_is_minus_the_key_norm():
    rng = np.random.default_rng(0)
    K = rng.normal(size=(3, 17, 5))  # (heads, N, d): leading axes pass through
    got = scores.knorm(K)
    want = np.array([[-math.sqrt(sum(float(x) ** 2 for x in K[h, i])) for i in range(17)] for h in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)  # a sum of 5 squares: a few ulps
    assert got.shape == (3, 17) and got.dtype == np.float64


def test_accumulated_and_last_query_attention():
    rng = np.random.default_rng(1)
    attn = _attn(rng, 2, 6, 11)  # (heads, R, N)
    h2o = scores.accumulated_attention(attn)
    want = np.zeros((2, 11))
    for h in range(2):
        for r in range(6):
            for i in range(11):
                want[h, i] += attn[h, r, i]
    np.testing.assert_allclose(h2o, want, rtol=1e-14, atol=1e-16)  # 6 terms summed in another order
    tova = scores.last_query_attention(attn)
    assert np.array_equal(tova, attn[:, -1, :])
    tova[...] = -1.0  # a copy: the attention is untouched
    assert attn.min() >= 0


@pytest.mark.parametrize("kernel", [1, 2, 3, 5, 8])
def test_max_pooling_is_the_running_max_with_edges_repeated(kernel):
    rng = np.random.default_rng(kernel)
    x = rng.normal(size=(2, 13))
    got = scores.pool1d(x, kernel, "max")
    # scipy's centring for a size-k window: offsets -(k // 2) .. k - 1 - k // 2; 'nearest' repeats the edge,
    # which for a maximum is the window clamped to [0, n)
    lo, hi = kernel // 2, kernel - 1 - kernel // 2
    want = np.array([[x[b, max(0, i - lo) : min(13, i + hi + 1)].max() for i in range(13)] for b in range(2)])
    assert np.array_equal(got, want)  # a maximum is exact


@pytest.mark.parametrize("kernel", [1, 3, 5, 7])
def test_avg_pooling_matches_torch_avg_pool1d(kernel):
    rng = np.random.default_rng(10 + kernel)
    x = rng.random((4, 19))
    got = scores.pool1d(x, kernel, "avg")
    ref = torch.nn.functional.avg_pool1d(torch.from_numpy(x)[:, None, :], kernel, stride=1,
                                         padding=kernel // 2, count_include_pad=True)[:, 0, :].numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-15)  # float64 both, sums in a different order


def test_pooling_rejects_bad_arguments():
    x = np.ones(5)
    with pytest.raises(ValueError, match="kernel must be >= 1"):
        scores.pool1d(x, 0)
    with pytest.raises(ValueError, match="odd kernel"):
        scores.pool1d(x, 4, "avg")
    with pytest.raises(ValueError, match="'max' or 'avg'"):
        scores.pool1d(x, 3, "median")


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("window", [1, 4, 50])
def test_observation_window_is_the_pooled_window_of_last_rows(window, reduce):
    rng = np.random.default_rng(window)
    attn = _attn(rng, 12, 15)  # (R, N); a window above R takes every row
    got = scores.observation_window(attn, window=window, kernel=3, pooling="max", reduce=reduce)
    rows = attn[max(0, 12 - window) :]
    col = np.array([sum(float(rows[r, i]) for r in range(rows.shape[0])) for i in range(15)])
    if reduce == "mean":
        col = col / rows.shape[0]
    want = np.array([col[max(0, i - 1) : i + 2].max() for i in range(15)])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-16)  # sums in another order
    # kvpress's SnapKV: window mean, then avg_pool1d
    got_avg = scores.observation_window(attn, window=window, kernel=5, pooling="avg", reduce="mean")
    mean = torch.from_numpy(attn[-window:]).mean(dim=0)
    ref = torch.nn.functional.avg_pool1d(mean[None, None], 5, stride=1, padding=2)[0, 0].numpy()
    np.testing.assert_allclose(got_avg, ref, rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="observation window"):
        scores.observation_window(attn, window=0)


def test_position_and_uniform_random():
    assert np.array_equal(scores.position(5), np.array([0.0, 1.0, 2.0, 3.0, 4.0]))
    a = scores.uniform_random(40, seed=7, stream=3)
    assert np.array_equal(a, np.random.default_rng([7, 3]).random(40))
    assert np.array_equal(a, scores.uniform_random(40, seed=7, stream=3))
    assert not np.array_equal(a, scores.uniform_random(40, seed=7, stream=4))
    assert ((a >= 0) & (a < 1)).all()


@pytest.mark.parametrize("how", ["mean", "max"])
def test_group_reduce_matches_loops_over_gqa_groups(how):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 6, 9))  # (layers, H_q = 6, N); groups of 3 -> 2 KV heads
    got = scores.group_reduce(x, 3, how)
    want = np.empty((2, 2, 9))
    for layer in range(2):
        for g in range(2):
            heads = [x[layer, g * 3 + j] for j in range(3)]  # repeat_kv: heads g*G .. g*G + G - 1
            for i in range(9):
                vals = [float(h[i]) for h in heads]
                want[layer, g, i] = sum(vals) / 3 if how == "mean" else max(vals)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)  # 3 terms: at most an ulp apart
    assert np.array_equal(scores.group_reduce(x, 1, how), x)  # no grouping (MHA)
    with pytest.raises(ValueError, match="do not split"):
        scores.group_reduce(x, 4)
    with pytest.raises(ValueError, match="'mean' or 'max'"):
        scores.group_reduce(x, 3, "sum")


@pytest.mark.parametrize("sinks,recent", [(0, 0), (2, 0), (0, 3), (2, 3), (9, 0), (0, 20), (5, 5)])
def test_pad_kept_pads_sinks_and_recent_with_inf(sinks, recent):
    rng = np.random.default_rng(sinks * 31 + recent)
    x = rng.normal(size=(3, 9))
    got = scores.pad_kept(x, sinks, recent)
    for i in range(9):
        forced = i < sinks or i >= 9 - recent
        if forced:
            assert np.all(got[:, i] == np.inf)
        else:
            assert np.array_equal(got[:, i], x[:, i])
    assert np.isfinite(x).all()  # the input is not modified
    # with padding, the top s keeps every sink and recent entry first
    forced = sorted(set(range(min(sinks, 9))) | set(range(max(0, 9 - recent), 9)))
    if 0 < len(forced) < 9:
        assert set(forced) <= set(top_s(got[0], len(forced) + 1).tolist())


def test_rank_order_on_scores_with_ties():
    rng = np.random.default_rng(5)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        sc = rng.integers(0, 4, n).astype(np.float64)  # many ties
        sc[rng.random(n) < 0.1] = np.inf
        want = sorted(range(n), key=lambda i: (-sc[i], i))
        assert rank_order(sc).tolist() == want
