"""Allocators (uniform, adakv, global), budget_for, select and evict, against direct implementations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forcedweight.core.scores import pad_kept
from forcedweight.deploy.allocate import (ALLOCATORS, budget_for, evict, floors, make_allocator, select,
                                          uniform_counts)
from forcedweight.deploy.ragged_cache import RaggedKVCache
from forcedweight.errors import InputError


def _scores(L=3, H=4, N=50, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((H, N)) for _ in range(L)]


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
@pytest.mark.parametrize("budget", [0, 1, 7, 12, 13, 299, 600])
def test_counts_sum_to_budget_and_fit(name, budget):
    sc = _scores()
    counts = make_allocator(name).allocate(sc, budget)
    assert counts.shape == (3, 4) and counts.dtype == np.int64
    assert int(counts.sum()) == budget
    assert counts.min() >= 0 and counts.max() <= 50


def test_uniform_counts_equal_with_deterministic_remainder():
    counts = make_allocator("uniform").allocate(_scores(), 13 * 12 + 5)
    assert counts.max() - counts.min() <= 1
    assert counts.reshape(-1).tolist() == [14] * 5 + [13] * 7  # remainder to the first segments


def _adakv_torch(scores: np.ndarray, n_kept: int, alpha: float) -> np.ndarray:
    """kvpress AdaKVPress.compress on one layer (scores (H, N)): kept counts per head, (H,)."""
    s = torch.tensor(scores)[None]  # (1, H, N)
    _, H, N = s.shape
    n_safe = int(n_kept * alpha)
    if alpha > 0:
        n_safe = max(1, n_safe) if n_kept > 0 else 0
    top = torch.topk(s, n_safe, dim=-1).indices
    s.scatter_(-1, top, torch.finfo(s.dtype).max)
    n_pruned = H * (N - n_kept)
    pruned = torch.topk(-s.reshape(1, -1), n_pruned, dim=1).indices.flatten()
    kept = torch.ones(H * N, dtype=torch.bool)
    kept[pruned] = False
    return kept.reshape(H, N).sum(-1).numpy()


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.75, 0.9])
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5])
def test_adakv_matches_kvpress_on_random_scores(ratio, alpha):
    L, H, N = 3, 4, 50
    sc = [s * np.array([[0.1], [1.0], [3.0], [10.0]]) for s in _scores(L, H, N, seed=1)]  # unequal heads
    budget = budget_for(N, L, H, ratio)
    counts = make_allocator("adakv", alpha=alpha).allocate(sc, budget)
    n_kept = max(1, int(N * (1 - ratio)))
    for layer in range(L):
        np.testing.assert_array_equal(counts[layer], _adakv_torch(sc[layer], n_kept, alpha))
        # kept set = the protected top n_safe per head + the layer's best of the rest
        keep = select(sc, counts)[layer]
        n_safe = max(1, int(n_kept * alpha)) if alpha > 0 else 0
        for h in range(H):
            assert np.isin(np.argsort(-sc[layer][h])[:n_safe], keep[h]).all()
    assert counts.min() >= (max(1, int(n_kept * alpha)) if alpha > 0 else 0)
    assert len(set(counts.reshape(-1).tolist())) > 1  # the heads really differ


def test_adakv_keeps_every_heads_floor_when_the_budget_holds_them():
    # the protected top entries used to be +inf like the sinks / recent window, so head 0's protected
    # entry outranked head 1's last recent entry (ties to the lower index) and the floor check failed
    inf = np.inf
    sc = [np.array([[0.0, 0, 0, 0], [inf, inf, inf, 0]])]
    assert make_allocator("adakv").allocate(sc, 3).tolist() == [[0, 3]]
    rng = np.random.default_rng(0)
    for _ in range(300):
        L, H, N = int(rng.integers(1, 3)), int(rng.integers(2, 5)), int(rng.integers(4, 16))
        sc = [rng.standard_normal((H, N)) for _ in range(L)]
        for layer in range(L):
            for h in range(H):
                sc[layer][h, rng.choice(N, int(rng.integers(0, 4)), replace=False)] = inf  # unequal floors
        need = floors(sc).sum(axis=1)  # each layer's +inf entries
        budget = int(rng.integers(0, L * H * N + 1))
        while (uniform_counts(L * H, budget).reshape(L, H).sum(axis=1) < need).any():
            budget += 1  # the smallest budget from the draw on whose layer shares hold every floor
        counts = make_allocator("adakv", alpha=float(rng.choice([0.2, 0.5, 1.0]))).allocate(sc, budget)
        assert int(counts.sum()) == budget and (counts >= floors(sc)).all()


def test_global_is_one_threshold():
    sc = _scores(seed=2)
    budget = 211
    counts = make_allocator("global").allocate(sc, budget)
    keep = select(sc, counts)
    flat = np.concatenate([s.reshape(-1) for s in sc])
    thr = np.sort(flat)[::-1][budget - 1]
    for layer in range(3):
        for h in range(4):
            kept = np.zeros(50, bool)
            kept[keep[layer][h]] = True
            assert (sc[layer][h][kept] >= thr).all() and (sc[layer][h][~kept] < thr).all()


def test_global_ties_by_the_tie_rule():
    sc = [np.zeros((2, 5)), np.zeros((2, 5))]  # all equal: the lowest flattened indices win
    counts = make_allocator("global").allocate(sc, 7)
    assert counts.tolist() == [[5, 2], [0, 0]]


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_floors_from_sinks_and_recent(name):
    sc = [pad_kept(s, sinks=4, recent=3) for s in _scores(seed=3)]
    assert (floors(sc) == 7).all()
    counts = make_allocator(name).allocate(sc, 7 * 12 + 1)
    assert counts.min() >= 7 and int(counts.sum()) == 85
    keep = select(sc, counts)
    for heads in keep:
        for k in heads:
            assert set([0, 1, 2, 3, 47, 48, 49]) <= set(k.tolist())
    with pytest.raises(InputError, match="sinks"):
        make_allocator(name).allocate(sc, 7 * 12 - 1)


def test_bad_inputs():
    with pytest.raises(InputError, match="unknown allocator 'nope'"):
        make_allocator("nope")
    with pytest.raises(InputError, match="alpha"):
        make_allocator("adakv", alpha=2)
    with pytest.raises(InputError, match="outside"):
        make_allocator("uniform").allocate(_scores(), 601)
    for r in (-0.1, 1.0, 1.5):
        with pytest.raises(InputError, match="compression-ratio"):
            budget_for(100, 2, 2, r)


def test_budget_for_matches_kvpress_compute_n_kept():
    for n in (1, 7, 100, 1000, 1001):
        for r in (0.0, 0.5, 0.75, 0.9, 0.99):
            assert budget_for(n, 3, 2, r) == 6 * max(1, int(n * (1 - r)))
    assert uniform_counts(4, 10).tolist() == [3, 3, 2, 2]


def test_select_and_evict_on_a_ragged_cache():
    rng = np.random.default_rng(4)
    L, H, N, d = 2, 3, 20, 4
    keys = [torch.tensor(rng.standard_normal((1, H, N, d)), dtype=torch.float32) for _ in range(L)]
    vals = [torch.tensor(rng.standard_normal((1, H, N, d)), dtype=torch.float32) for _ in range(L)]
    cache = RaggedKVCache()
    for layer in range(L):
        cache.update(keys[layer], vals[layer], layer)
    sc = _scores(L, H, N, seed=5)
    counts = make_allocator("global").allocate(sc, 40)
    keep = select(sc, counts)
    for layer in range(L):
        for h in range(H):
            k = keep[layer][h]
            assert k.dtype == np.int64 and (np.diff(k) > 0).all() and k.size == counts[layer, h]
            assert set(k.tolist()) == set(np.argsort(-sc[layer][h], kind="stable")[: counts[layer, h]].tolist())
    evict(cache, keep)
    assert cache.entries() == 40
    for layer in range(L):
        assert cache.lengths(layer).tolist() == counts[layer].tolist()
        for h in range(H):
            kk, vv = cache.layers[layer].segment(0, h)
            torch.testing.assert_close(kk, keys[layer][0, h, torch.as_tensor(keep[layer][h])], rtol=0, atol=0)
            torch.testing.assert_close(vv, vals[layer][0, h, torch.as_tensor(keep[layer][h])], rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_every_allocator_refuses_a_budget_that_is_not_a_whole_number_of_entries(name):
    # one check for all (deploy.segment_scores): NaN gave "cannot convert float NaN to integer", a string
    # a numpy UFuncTypeError, 2.5 in contourkv "2.5 entries outside [0, 10]"
    sc = _scores(1, 2, 5)
    for bad in (float("nan"), "5", 2.5, True, float("inf")):
        with pytest.raises(InputError, match="--budget: must be an integer"):
            make_allocator(name).allocate(sc, bad)
    assert int(make_allocator(name).allocate(sc, np.float64(4.0)).sum()) == 4
