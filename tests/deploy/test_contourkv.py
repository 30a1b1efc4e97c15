"""ContourKV: counts sum to the budget within [floor, N]; a flat dropped-mass signal is the shared
threshold (= kvzip's ``global``); the dropped-mass statistic equals the model's eager attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forcedweight.core.scores import pad_kept
from forcedweight.deploy.allocate import ALLOCATORS, GlobalAllocator, make_allocator, select
from forcedweight.deploy.contourkv import ContourKVAllocator, reallocate, select_counts, shared_threshold
from forcedweight.deploy.dropped_mass import dropped_mass, dropped_mass_onepass, segment_dropped_mass, window_rows
from forcedweight.deploy.prefill import prefill_context
from forcedweight.errors import InputError
from forcedweight.models import tiny_llama


def _scores(rng, L=3, H=2, N=40, sinks=2, recent=3):
    return [pad_kept(rng.random((H, N)), sinks, recent) for _ in range(L)]


def _rows(rng, L=3, Hq=4, R=5, N=40, alpha=0.3):
    """Per layer (Hq, R, N) random probability rows (Dirichlet: different dropped mass per head)."""
    return [rng.dirichlet(np.full(N, alpha), size=(Hq, R)) for _ in range(L)]


def test_registered():
    assert ALLOCATORS["contourkv"] is ContourKVAllocator
    assert isinstance(make_allocator("contourkv", beta=0.2), ContourKVAllocator)
    with pytest.raises(InputError, match="contourkv"):
        make_allocator("contourkv", bogus=1)
    with pytest.raises(InputError, match="beta"):
        ContourKVAllocator(beta=1.5)


@pytest.mark.parametrize("seed", range(12))
def test_counts_sum_to_budget_and_respect_floor(seed):
    rng = np.random.default_rng(seed)
    L, H, N = 3, 2, 40
    scores = _scores(rng, L, H, N)
    rows = _rows(rng, L, 2 * H, 6, N)
    alloc = ContourKVAllocator(beta=float(rng.uniform(0.05, 1.0)), recent_floor=int(rng.integers(0, 6)))
    floor = np.isposinf(alloc.floored(scores)).sum(-1)
    for budget in (int(floor.sum()), int(rng.integers(floor.sum(), L * H * N)), L * H * N):
        counts = alloc.allocate(scores, budget, rows=rows)
        assert counts.shape == (L, H) and counts.dtype == np.int64
        assert counts.sum() == budget  # exactly
        assert (counts >= floor).all() and (counts <= N).all()
        keep = alloc.keep(scores, budget, rows=rows)
        # the recency floor shrinks only when the budget cannot hold it
        r = max([0] + [r for r in range(alloc.recent_floor + 1) if
                       np.isposinf(np.stack([pad_kept(s, 0, r) for s in scores])).sum() <= budget])
        tail = np.arange(N - r, N)
        for layer in range(L):
            for h in range(H):
                assert len(keep[layer][h]) == counts[layer, h]
                assert set(tail) <= set(keep[layer][h].tolist())  # the recency floor is kept
                assert {0, 1} <= set(keep[layer][h].tolist())  # the policy's sinks too


def test_reallocate_moves_from_low_to_high_dropped_mass():
    counts = np.array([[10, 10], [10, 10]])
    floor = np.array([[2, 2], [2, 2]])
    d = np.array([[0.1, 0.2], [0.5, 0.9]])  # median 0.35: donors (0,0),(0,1); receivers (1,0),(1,1)
    out = reallocate(counts, floor, 40, d, beta=0.5)
    assert out.sum() == counts.sum()
    assert out[0, 0] == 6 and out[0, 1] == 6  # each donor gives floor(0.5 * 8) = 4
    # pool 8 split in proportion to d - median = 0.15 : 0.55
    assert out[1, 0] == 10 + round(8 * 0.15 / 0.7) and out[1, 1] == 10 + 8 - round(8 * 0.15 / 0.7)
    # caps: a receiver already full gives its share to the other one, the rest returns to the donors
    out = reallocate(np.array([[10, 10], [40, 39]]), floor, 40, d, beta=0.5)
    # donors give 4 + 4; (1, 1) takes 1; 7 return 3.5 : 3.5 -> 4, 3 (the remainder to the lower index)
    assert out.tolist() == [[10, 9], [40, 40]]


@pytest.mark.parametrize("seed", range(5))
def test_flat_dropped_mass_is_the_shared_threshold(seed):
    rng = np.random.default_rng(seed)
    L, H, N = 3, 2, 40
    scores = _scores(rng, L, H, N)
    budget = int(rng.integers(30, L * H * N))
    flat_rows = [np.zeros((2 * H, 4, N)) for _ in range(L)]  # every kept set drops mass 1: a flat signal
    alloc = ContourKVAllocator(beta=0.5, recent_floor=0)
    got = alloc.allocate(scores, budget, rows=flat_rows)
    assert np.allclose(alloc.last_dropped, 1.0)
    assert np.array_equal(got, GlobalAllocator().allocate(scores, budget))  # = kvzip's global
    assert all(np.array_equal(a, b) for la, lb in zip(alloc.keep(scores, budget, rows=flat_rows),
                                                      select(scores, got)) for a, b in zip(la, lb))
    d = np.full((L, H), float(rng.random()))
    c = shared_threshold(np.stack(scores), budget)
    assert np.array_equal(reallocate(c, np.zeros_like(c), N, d, 0.7), c)


def test_restated_steps_equal_allocate():
    rng = np.random.default_rng(3)
    scores = _scores(rng)
    scores[0][0, 5:9] = 0.5  # ties resolve like allocate's (lower index)
    for budget in (30, 97, 200):
        c = shared_threshold(np.stack(scores), budget)
        assert np.array_equal(c, GlobalAllocator().allocate(scores, budget))
        ours, theirs = select_counts(np.stack(scores), c), select(scores, c)
        assert all(np.array_equal(a, b) for la, lb in zip(ours, theirs) for a, b in zip(la, lb))
    with pytest.raises(InputError, match="sinks"):
        ContourKVAllocator().allocate(scores, 3, rows=_rows(rng))


def test_dropped_mass_against_a_loop():
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(30), size=(6, 4))  # (H_q=6, R=4, N=30), G = 3 for 2 KV heads
    keep = [np.array([0, 3, 7]), np.arange(10, 30)]
    want = np.zeros(2)
    for h in range(2):
        tot = 0.0
        for g in range(3):
            for r in range(4):
                tot += 1.0 - sum(rows[h * 3 + g, r, j] for j in keep[h])
        want[h] = tot / 12
    np.testing.assert_allclose(dropped_mass(rows, keep), want, rtol=0, atol=1e-12)


def test_dropped_mass_equals_the_models_eager_attention():
    torch.manual_seed(0)
    model = tiny_llama(seed=1, layers=2, heads=4, kv_heads=2, head_dim=16)
    ids = torch.randint(3, 300, (1, 50))
    prefill = prefill_context(model, None, ids)
    W = 8
    rows = window_rows(prefill, W)
    rng = np.random.default_rng(0)
    keep = [[np.sort(rng.choice(50, size=int(rng.integers(5, 40)), replace=False)) for _ in range(2)]
            for _ in range(2)]
    ours = segment_dropped_mass(rows, keep)
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        att = model(input_ids=ids, output_attentions=True).attentions  # per layer (1, H_q, N, N)
    for layer in range(2):
        a = att[layer][0, :, -W:, :].double().numpy()  # the last W queries' eager probabilities
        for h in range(2):
            kept = a[2 * h: 2 * h + 2][:, :, keep[layer][h]].sum(-1)  # (G, W)
            # float32 eager softmax against the float64 recomputation from the captured queries
            assert abs(ours[layer, h] - (1.0 - kept.mean())) < 1e-5
        # the one-pass form from queries and keys (float64) equals the rows' form
        q = prefill.queries[layer][:, -W:].double()
        k = prefill.keys(layer).double()
        mask = torch.zeros(2, 50, dtype=torch.bool)
        for h in range(2):
            mask[h, torch.as_tensor(keep[layer][h])] = True
        one = dropped_mass_onepass(q, k, mask, prefill.scaling, torch.arange(50 - W, 50)).numpy()
        np.testing.assert_allclose(one, ours[layer], rtol=0, atol=1e-10)


def test_allocator_reads_the_prefill_rows():
    model = tiny_llama(seed=2, layers=2, heads=4, kv_heads=2, head_dim=16)
    prefill = prefill_context(model, None, torch.randint(3, 300, (1, 60)))
    rng = np.random.default_rng(1)
    scores = [rng.random((2, 60)) for _ in range(2)]
    alloc = ContourKVAllocator(beta=0.3, recent_floor=4, window=16)
    a = alloc.allocate(scores, 100, prefill=prefill)
    b = alloc.allocate(scores, 100, rows=window_rows(prefill, 16))
    assert np.array_equal(a, b) and a.sum() == 100
    # without rows: the scores' own dropped mass (the bare Allocator contract), still exact
    c = alloc.allocate(scores, 100)
    assert c.sum() == 100 and (c >= 4).all()
