"""Masked storage holds the full cache's bytes while answering like attention restricted to the kept
entries (the ragged cache, and a dense cache holding only those entries)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forcedweight.core.operator import top_s
from forcedweight.deploy.allocate import evict
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.enforcement import (dense_bytes, masked_attention, masked_storage, token_cache, token_topk,
                                             token_union)
from forcedweight.deploy.evaluate_protocol import continuation_nll, greedy_answer
from forcedweight.deploy.prefill import prefill_context
from forcedweight.errors import InputError
from forcedweight.models import tiny_llama

N = 64


def _setup(seed=0):
    model = tiny_llama(seed=seed, layers=2, heads=4, kv_heads=2, head_dim=16)
    model.generation_config.eos_token_id = None  # decode the full length
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (1, N), generator=g)
    question = torch.randint(3, 300, (1, 5), generator=g)
    prefill = prefill_context(model, None, ids)
    rng = np.random.default_rng(seed)
    keep = [[np.sort(rng.choice(N, size=int(rng.integers(8, 40)), replace=False)) for _ in range(2)]
            for _ in range(2)]
    return model, prefill, question, keep


def _ragged_answer(model, prefill, question, keep):
    use_ragged_attention(model)
    cache = prefill.ragged_cache()
    evict(cache, keep)
    held = (cache.physical_bytes(), cache.entries())  # before the question and answer are appended
    return held, greedy_answer(model, cache, question, N, 12)


def test_masked_storage_answers_like_the_ragged_cache_with_the_full_bytes():
    for seed in range(3):
        model, prefill, question, keep = _setup(seed)
        ragged, want = _ragged_answer(model, prefill, question, keep)
        stor = masked_storage(prefill, keep)
        full = dense_bytes(prefill.cache)
        assert stor.physical_bytes() >= full  # the evicted entries never left memory
        assert stor.physical_bytes() == full + 2 * 2 * N  # + one bool per (layer, KV head, entry)
        assert ragged[0] < full
        assert stor.entries() == ragged[1] == sum(len(k) for h in keep for k in h)
        with masked_attention(model, stor.keep):
            got = greedy_answer(model, stor.cache, question, N, 12)
        assert got == want  # greedy tokens equal
        # and the masks are what changes the answer: without them the full cache answers
        with masked_attention(model, None):
            nomask = greedy_answer(model, masked_storage(prefill, keep).cache, question, N, 12)
        cache_full = prefill.ragged_cache()
        assert nomask == greedy_answer(model, cache_full, question, N, 12)


@pytest.mark.parametrize("family, what", [("gemma2", "soft-cap"), ("mistral", "sliding window"),
                                          ("gpt_oss", "learned sinks")])
def test_masked_and_token_storages_refuse_layers_they_cannot_answer_for(family, what):
    # SDPA dropped the sinks and refused the soft-cap, the mask ignored the window and the cache clone
    # truncated sliding layers: answers 0.04-0.24 off the ragged cache's, or a crash past the window
    from forcedweight.models import tiny_family_model

    model = tiny_family_model(family, 0)
    ids = torch.randint(3, 250, (1, 30), generator=torch.Generator().manual_seed(0))
    prefill = prefill_context(model, None, ids)
    keep = [[np.arange(0, 30, 2) for _ in range(prefill.n_kv_heads)] for _ in range(prefill.n_layers)]
    stor = masked_storage(prefill, keep)
    with pytest.raises(InputError, match=what), masked_attention(model, stor.keep):
        continuation_nll(model, stor.cache, prefill.logits_last, ids[:, :4], 30)


def test_masked_logits_equal_attention_restricted_to_the_kept_entries():
    model, prefill, question, keep = _setup(4)
    shared = [[keep[layer][0]] * 2 for layer in range(2)]  # one set for both heads of a layer
    stor = masked_storage(prefill, shared)
    cont = torch.randint(3, 300, (1, 9), generator=torch.Generator().manual_seed(1))
    with masked_attention(model, stor.keep):
        a = continuation_nll(model, stor.cache, prefill.logits_last, cont, N)
    # the same set stored densely (only those entries held): plain causal attention over them
    tok = token_cache(prefill, [k[0] for k in shared])
    assert dense_bytes(tok) < dense_bytes(prefill.cache)
    with masked_attention(model, None):
        b = continuation_nll(model, tok, prefill.logits_last, cont, N)
    use_ragged_attention(model)
    ragged = prefill.ragged_cache()
    evict(ragged, shared)
    c = continuation_nll(model, ragged, prefill.logits_last, cont, N)
    assert abs(a - b) < 1e-5 and abs(a - c) < 1e-5  # float32 attention, three storages


def test_token_union_and_topk():
    keep = [[np.array([0, 3, 5]), np.array([3, 7])], [np.array([1]), np.array([2])]]
    assert [u.tolist() for u in token_union(keep)] == [[0, 3, 5, 7], [1, 2]]
    scores = [np.array([[0.1, 0.9, 0.2, 0.5], [0.8, 0.0, 0.3, 0.5]])]
    assert token_topk(scores, np.array([[2, 2]]))[0].tolist() == [0, 1]  # head max 0.8, 0.9, 0.3, 0.5


def test_token_topk_never_holds_more_than_the_nominal_budget():
    # per-layer rounding of the mean (3.5 -> 4 on both layers) held 16 entries of a budget of 14
    scores = [np.array([[3.0, 2, 1, 0], [3, 2, 1, 0]])] * 2
    assert [t.tolist() for t in token_topk(scores, np.array([[3, 4], [3, 4]]))] == [[0, 1, 2, 3], [0, 1, 2]]
    rng = np.random.default_rng(0)
    for _ in range(500):
        L, H, N = (int(v) for v in rng.integers(1, 5, 3) * [1, 1, 5])
        scores = [rng.random((H, N)) for _ in range(L)]
        counts = rng.integers(0, N + 1, (L, H))
        tokens = token_topk(scores, counts)
        held = H * sum(len(t) for t in tokens)
        assert counts.sum() - H < held <= counts.sum()  # floor(budget / H_kv) tokens, all placed
        for layer, t in enumerate(tokens):
            assert t.tolist() == top_s(scores[layer].max(axis=0), len(t)).tolist()
            if counts[layer].sum() % H == 0 and (counts.sum(axis=1) % H == 0).all():
                assert len(t) == counts[layer].sum() // H  # integer means: exactly each layer's mean
