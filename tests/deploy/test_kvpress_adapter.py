"""The kvpress adapter (``kvpress:<PressClassName>``) on a tiny random GQA Llama.

kvpress is the optional ``peers`` extra: it is installed in CI's second environment (``.venv-low``,
transformers 4.57, scripts/setup_low.sh), not in the main one. Each test branches on whether kvpress
imports: without it, building an adapted policy must raise the clean InputError; with it, the adapted
presses must agree with our own policies and with kvpress's own pruning.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicCache

from forcedweight.compat import cache_kwargs
from forcedweight.deploy.allocate import budget_for, evict, make_allocator, select
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.errors import InputError
from forcedweight.models import byte_tokenizer, tiny_llama

HAVE_KVPRESS = importlib.util.find_spec("kvpress") is not None
N_CTX = 96
RATIO = 0.5


@pytest.fixture(scope="module")
def model():
    return tiny_llama(0, layers=2, heads=4, kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def context_ids():
    # distinct tokens: RoPE preserves norms, so a repeated token has the same key norm in layer 0 and
    # knorm ties; ours breaks ties to the lower index (core.operator.top_s), kvpress's torch.topk does
    # not say which it keeps. Without ties the kept sets must be identical.
    return (torch.randperm(297, generator=torch.Generator().manual_seed(11))[:N_CTX] + 3)[None]


@pytest.fixture(scope="module")
def prefill(model, context_ids):
    return prefill_context(model, byte_tokenizer(), context_ids)


def test_kvpress_policy_without_or_with_kvpress():
    if not HAVE_KVPRESS:
        with pytest.raises(InputError, match=r"kvpress is not installed .*forcedweight\[peers\]"):
            make_policy("kvpress:KnormPress")
    else:
        pol = make_policy("kvpress:KnormPress", sinks=2)
        assert pol.name == "kvpress:KnormPress" and pol.sinks == 2 and pol.query_agnostic
        with pytest.raises(InputError, match="not a kvpress ScorerPress"):
            make_policy("kvpress:NoSuchPress")
        with pytest.raises(InputError, match="bad option"):
            make_policy("kvpress:SnapKVPress", no_such_field=3)
    with pytest.raises(InputError, match="expected kvpress:<PressClassName>"):
        make_policy("kvpress:")


def _kvpress_pruned_keys(model, context_ids, press):
    """kvpress's own pruning: the keys its forward hook leaves in a DynamicCache, per layer (H_kv, n, d)."""
    cache = DynamicCache(config=model.config)
    with press(model), torch.inference_mode():
        model(context_ids, use_cache=True, **cache_kwargs(cache))
    return [layer.keys[0] for layer in cache.layers]


def _as_sets(keys: torch.Tensor) -> list[set]:
    """Per KV head, the set of its kept key vectors (as exact float32 byte strings)."""
    return [{row.numpy().tobytes() for row in keys[h]} for h in range(keys.shape[0])]


def test_adapted_knorm_keeps_the_entries_of_our_knorm_and_of_kvpress(model, context_ids, prefill):
    if not HAVE_KVPRESS:
        with pytest.raises(InputError, match="kvpress is not installed"):
            make_policy("kvpress:KnormPress")
        return
    import kvpress

    ours, adapted = make_policy("knorm"), make_policy("kvpress:KnormPress")
    s_ours, s_adapted = ours.score(prefill), adapted.score(prefill)
    assert adapted.last_cost["forward_tokens"] == N_CTX
    for a, b in zip(s_ours, s_adapted):
        assert a.shape == b.shape == (2, N_CTX)
        # kvpress takes the norm in float32, ours in float64, of the same float32 keys: rtol 1e-6
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=0)
    budget = budget_for(N_CTX, prefill.n_layers, prefill.n_kv_heads, RATIO)
    counts = make_allocator("uniform").allocate(s_ours, budget)
    keep_ours, keep_adapted = select(s_ours, counts), select(s_adapted, counts)
    for la, lb in zip(keep_ours, keep_adapted):
        for a, b in zip(la, lb):
            np.testing.assert_array_equal(a, b)
    # the ragged cache evicted to the adapted press's choice holds exactly kvpress's own kept keys
    cache = prefill.ragged_cache()
    evict(cache, keep_adapted)
    assert cache.entries() == budget
    theirs = _kvpress_pruned_keys(model, context_ids, kvpress.KnormPress(compression_ratio=RATIO))
    for layer in range(prefill.n_layers):
        held = torch.stack([cache.layers[layer].segment(0, h)[0] for h in range(prefill.n_kv_heads)])
        assert _as_sets(held) == _as_sets(theirs[layer])


def test_adapted_snapkv_and_expected_attention_agree_with_ours(prefill):
    if not HAVE_KVPRESS:
        for press in ("SnapKVPress", "ExpectedAttentionPress"):
            with pytest.raises(InputError, match="kvpress is not installed"):
                make_policy(f"kvpress:{press}")
        return
    pairs = [
        # window / kernel as kvpress's fields; scores are window means of softmax rows (~1/N):
        # kvpress's float32 recomputation from the pre-RoPE queries vs our float64 softmax of the
        # captured post-RoPE ones agree to float32 rounding: atol 1e-6, rtol 1e-4
        (make_policy("snapkv", window=8), make_policy("kvpress:SnapKVPress", window_size=8), 1e-4, 1e-6),
        # expected logits + covariance term, softmax, times ||v||: float32 vs float64, rtol 1e-4
        (make_policy("expected_attention"), make_policy("kvpress:ExpectedAttentionPress"), 1e-4, 1e-6),
    ]
    for ours, adapted, rtol, atol in pairs:
        for a, b in zip(ours.score(prefill), adapted.score(prefill)):
            assert a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=adapted.name)
