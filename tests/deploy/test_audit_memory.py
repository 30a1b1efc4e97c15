"""Memory audit (issue 13): masked storage holds the full cache (+ mask); ragged holds the kept entries
(+ at most 2%); nominal = kept x entry bytes; real policies, allocators and ratios."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forcedweight.deploy.allocate import ALLOCATORS, budget_for
from forcedweight.deploy.audit.memory import keep_mask, masked_bytes, memory_rows
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.errors import InputError
from forcedweight.models import tiny_llama

N = 200
ALLOCS = sorted(ALLOCATORS)  # uniform, adakv, global (and contourkv: it reads the prefill)


@pytest.fixture(scope="module")
def prefill():
    model = tiny_llama(0, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=300)
    ids = torch.randint(3, 300, (1, N), generator=torch.Generator().manual_seed(1))
    return prefill_context(model, None, ids)


def _by(rows):
    return {(r["policy"], r["allocator"], r["compression_ratio"], r["storage"]): r for r in rows}


def test_storages_measured(prefill):
    pols = {"knorm": make_policy("knorm"), "snapkv": make_policy("snapkv"), "random": make_policy("random")}
    ratios = [0.0, 0.5, 0.9]
    rows = memory_rows(prefill, pols, ALLOCS, ratios)
    assert len(rows) == 3 * len(ALLOCS) * 3 * 3
    by = _by(rows)
    L, H, D = prefill.n_layers, prefill.n_kv_heads, prefill.head_dim
    elem = prefill.keys(0).element_size()
    # dense bytes: every layer's full K and V, by shape (independent of the storage measurement)
    dense = L * 2 * H * N * D * elem
    entry = 2 * D * elem  # one entry's K and V
    for pol in pols:
        for a in ALLOCS:
            for r in ratios:
                masked, ragged, nominal = (by[(pol, a, r, st)] for st in ("masked", "ragged", "nominal"))
                assert masked["dense_bytes"] == dense
                kept = budget_for(N, L, H, r)
                assert ragged["kept_entries"] == kept  # the allocator spends the budget exactly
                # masked = the full cache's bytes + one bool [1, H, N] mask per layer
                assert masked["bytes"] == dense + L * H * N
                assert nominal["bytes"] == kept * entry
                # ragged = kept x entry bytes, plus spare rows and metadata: at most 2% over
                assert kept * entry <= ragged["bytes"] <= 1.02 * kept * entry, (pol, a, r)


def test_a_sampled_policy_is_measured_as_the_harness_runs_it(prefill):
    # its own draws and bias (allocator "sampled"), not the top-k of its proposal under the allocators
    pol = make_policy("sampled-knorm")
    rows = _by(memory_rows(prefill, {"sampled-knorm": pol}, ALLOCS, [0.5], seed=3))
    assert {k[1] for k in rows} == {"sampled"}
    keep, bias, _ = pol.select(prefill, 0.5, 3)
    cache = prefill.ragged_cache()
    for layer in range(prefill.n_layers):
        cache.evict(layer, keep[layer], bias[layer])
    ragged, masked = rows[("sampled-knorm", "sampled", 0.5, "ragged")], rows[("sampled-knorm", "sampled", 0.5, "masked")]
    assert ragged["kept_entries"] == cache.entries() != budget_for(N, prefill.n_layers, prefill.n_kv_heads, 0.5)
    assert ragged["bytes"] == cache.physical_bytes()  # the bias included
    L, H = prefill.n_layers, prefill.n_kv_heads
    assert masked["bytes"] == masked["dense_bytes"] + L * H * N * 4  # a float32 additive mask carries the bias


def test_masked_float_mask_and_mask_content(prefill):
    keep = [[np.array([0, 5, 7]), np.array([1, 2, 3])] for _ in range(prefill.n_layers)]
    m = keep_mask(keep[0], N)
    assert m.shape == (1, 2, N) and m.dtype == torch.bool
    assert m[0, 0].nonzero().ravel().tolist() == [0, 5, 7] and int(m.sum()) == 6
    f = keep_mask(keep[0], N, dtype=torch.float32)
    assert torch.equal(torch.isfinite(f), m) and float(f[m].abs().sum()) == 0.0
    dense = sum(l.keys.untyped_storage().nbytes() + l.values.untyped_storage().nbytes() for l in prefill.cache.layers)
    assert masked_bytes(prefill.cache, keep) == dense + prefill.n_layers * 2 * N
    assert masked_bytes(prefill.cache, keep, torch.float32) == dense + prefill.n_layers * 2 * N * 4


def test_bad_ratio(prefill):
    with pytest.raises(InputError, match="compression-ratio"):
        memory_rows(prefill, {"knorm": make_policy("knorm")}, ["uniform"], [1.0])
