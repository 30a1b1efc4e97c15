"""The ragged cache and its attention function on every tiny model family (issue 18, item 2).

1. What evaluate's ``none`` policy runs (``prefill_context`` -> ``Prefill.ragged_cache`` -> ``greedy_answer``
   with the ``forcedweight_ragged`` attention) equals ``model.generate`` with transformers' own attention
   and DynamicCache, token for token, on each family, with a context 2.5x the sliding window (the window
   bites: the model's logits change when the window is lifted), soft-capping (Gemma 2) and learned sinks
   (gpt-oss) included; through the PyTorch path and, for the families with a feature, the Triton kernel.
2. After evicting a random subset of each (layer, KV head)'s entries, every step's attention output
   (a 3-token step through the ragged prefill path, then decode steps) equals an independent float64 eager computation over the kept entries (and the new tokens)
   that the step's query may see: positions > p - W on a sliding layer, logits soft-capped, the sink in
   the denominator. The reference reads the kept K/V from the Prefill's dense cache and the features
   from the model's config and parameters, not from the ragged cache.
3. What the deploy path does not implement is refused with one line naming it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface

from forcedweight import models
from forcedweight.compat import cache_kwargs
from forcedweight.deploy.attention import ATTENTION_NAME, ragged_attention_forward, use_ragged_attention
from forcedweight.deploy.evaluate_protocol import greedy_answer
from forcedweight.deploy.features import layer_features
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.ragged_cache import RaggedKVCache
from forcedweight.errors import InputError

W = models.TINY_WINDOW  # 12
N_CTX = 30  # > 2 W: the window bites on every sliding layer
NEW = 6  # generated tokens
FEATURED = ("gemma2", "gpt_oss", "mistral")  # soft-cap + window, sinks + window, window on every layer


@pytest.fixture(autouse=True)
def _no_eos(monkeypatch):
    monkeypatch.setattr("forcedweight.deploy.evaluate_protocol.eos_ids", lambda model: set())


def _ids(n, seed=0):
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))


def _reference_model(family, **overrides):
    """The family's tiny model on transformers' eager attention, the attention the family defines (on
    4.57-5.2 Gemma 2 defaults to SDPA, which silently drops its soft-cap)."""
    return models.tiny_family_model(family, 1, attn_implementation="eager", **overrides)


def _generate(model, ids, n):
    """transformers' own greedy generation (the family's default attention, DynamicCache)."""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[0, ids.shape[1]:].tolist()


def _windows(model):
    """Each layer's sliding window as the model's config states it (None: full attention)."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None)
    w = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False:
        w = None
    if types is None:
        return [w] * cfg.num_hidden_layers
    return [w if t == "sliding_attention" else None for t in types]


@pytest.mark.parametrize("family", models.TINY_FAMILIES)
def test_none_equals_generate(family):
    ids = _ids(N_CTX + 1, seed=3)
    model = _reference_model(family)
    ref = _generate(model, ids, NEW)
    assert len(ref) == NEW
    ragged = use_ragged_attention(models.tiny_family_model(family, 1))
    pre = prefill_context(ragged, None, ids[:, :-1])
    cache = pre.ragged_cache()
    assert greedy_answer(ragged, cache, ids[:, -1:], pre.n_tokens, NEW) == ref, family
    windows = _windows(model)
    assert pre.windows == windows
    last = N_CTX + NEW - 1  # position of the last token fed
    for i, w in enumerate(windows):
        layer = cache.layers[i]
        for h in range(layer.kv_heads):
            if w is None:  # a full layer holds every token
                assert layer.lengths_h[h] == last + 1
            else:  # a sliding layer holds at most its window: exactly positions last - W + 1 .. last
                assert layer.segment_positions(0, h).tolist() == list(range(last - W + 1, last + 1))
    if any(w is not None for w in windows):  # the window matters: lifting it changes the model's logits
        wide = _reference_model(family, sliding_window=4 * N_CTX)
        with torch.inference_mode():
            gap = (model(ids).logits[0, -1] - wide(ids).logits[0, -1]).abs().max().item()
        assert gap > 1e-3, family


@pytest.mark.parametrize("family", FEATURED)
def test_none_with_a_question_equals_generate(family):
    # evaluate feeds a multi-token question after the context: the ragged prefill path over a past
    ids = _ids(N_CTX + 5, seed=8)
    ref = _generate(_reference_model(family), ids, 4)
    ragged = use_ragged_attention(models.tiny_family_model(family, 1))
    pre = prefill_context(ragged, None, ids[:, :N_CTX])
    assert greedy_answer(ragged, pre.ragged_cache(), ids[:, N_CTX:], pre.n_tokens, 4) == ref, family


@pytest.mark.parametrize("family", FEATURED)
def test_none_equals_generate_through_triton(family):
    # decode steps through the Triton kernel (interpreted on CPU): softcap and sinks in the kernel
    ids = _ids(N_CTX + 1, seed=4)
    ref = _generate(_reference_model(family), ids, 4)
    ragged = use_ragged_attention(models.tiny_family_model(family, 1), backend="triton")
    pre = prefill_context(ragged, None, ids[:, :-1])
    assert greedy_answer(ragged, pre.ragged_cache(), ids[:, -1:], pre.n_tokens, 4) == ref, family


def _eager_reference(model, layer, q, keys, values, k_pos, p, bias=None):
    """Float64 eager attention of one decode query q [Hq, D] at position p over keys [Hkv, n, D] at
    positions k_pos [Hkv][n] (per KV head lists), features read from the model config / module; bias
    [Hkv][n] (optional) added to the capped logits."""
    cfg = model.config
    attn = model.model.layers[layer].self_attn
    window = _windows(model)[layer]
    cap = getattr(cfg, "attn_logit_softcapping", None)
    sinks = getattr(attn, "sinks", None)
    Hq, Hkv = q.shape[0], len(keys)
    G = Hq // Hkv
    out = torch.zeros(Hq, values[0].shape[-1], dtype=torch.float64)
    for j in range(Hq):
        h = j // G
        pos = torch.tensor(k_pos[h])
        see = pos <= p if window is None else (pos <= p) & (pos > p - window)
        s = (keys[h][see].double() @ q[j].double()) * attn.scaling
        if cap is not None:
            s = cap * torch.tanh(s / cap)
        if bias is not None:
            s = s + bias[h][see].double()
        if sinks is not None:
            s = torch.cat([s, sinks[j:j + 1].double()])
        w = torch.softmax(s, 0)[: int(see.sum())]
        out[j] = w @ values[h][see].double()
    return out


@pytest.mark.parametrize("family,with_bias", [("gemma2", False), ("gemma2", True), ("gpt_oss", False),
                                              ("gpt_oss", True), ("mistral", False), ("qwen2_sliding", True),
                                              ("llama", False)])
def test_evict_then_decode_equals_eager_over_kept_entries(family, with_bias):
    model = use_ragged_attention(models.tiny_family_model(family, 2))
    ids = _ids(N_CTX + 5, seed=5)
    pre = prefill_context(model, None, ids[:, :N_CTX])
    cache = pre.ragged_cache()
    g = torch.Generator().manual_seed(7)
    kept, biases = {}, {}  # layer -> per KV head sorted kept positions / their bias (a corrected policy's)
    for i in range(pre.n_layers):
        keep = [torch.sort(torch.randperm(N_CTX, generator=g)[: 9 + 4 * h]).values for h in range(pre.n_kv_heads)]
        bias = [torch.randn(len(k), generator=g) for k in keep] if with_bias else None
        cache.evict(i, keep, bias)
        kept[i] = [k.tolist() for k in keep]
        biases[i] = bias
    seen = []  # (layer, first position, query [Hq, L, D], new_k [Hkv, L, D], new_v, output [L, Hq, Dv])
    steps = [(N_CTX, 3), (N_CTX + 3, 1), (N_CTX + 4, 1)]  # 3 tokens at once, then two decode steps

    def recording(module, query, key, value, attention_mask, **kwargs):
        out, w = ragged_attention_forward(module, query, key, value, attention_mask, **kwargs)
        seen.append((module.layer_idx, key.seen - key.new_len, query[0].clone(), key.new_k[0].clone(),
                     key.new_v[0].clone(), out[0].clone()))
        return out, w

    AttentionInterface.register(ATTENTION_NAME, recording)
    try:
        with torch.inference_mode():
            for p, n in steps:
                model(input_ids=ids[:, p:p + n], position_ids=torch.arange(p, p + n)[None], use_cache=True,
                      **cache_kwargs(cache))
    finally:
        AttentionInterface.register(ATTENTION_NAME, ragged_attention_forward)
    assert len(seen) == len(steps) * pre.n_layers
    new = {i: ([], []) for i in range(pre.n_layers)}  # the fed tokens' K/V per layer, [Hkv, D] each
    worst = 0.0
    for i, first, q, nk, nv, out in seen:
        new[i][0].extend(nk.unbind(1))
        new[i][1].extend(nv.unbind(1))
        keys = [torch.cat([pre.keys(i)[h][kept[i][h]], torch.stack([x[h] for x in new[i][0]])])
                for h in range(pre.n_kv_heads)]
        values = [torch.cat([pre.values(i)[h][kept[i][h]], torch.stack([x[h] for x in new[i][1]])])
                  for h in range(pre.n_kv_heads)]
        k_pos = [kept[i][h] + list(range(N_CTX, N_CTX + len(new[i][0]))) for h in range(pre.n_kv_heads)]
        bias = None if biases[i] is None else [torch.cat([biases[i][h], torch.zeros(len(new[i][0]))])
                                               for h in range(pre.n_kv_heads)]  # fed tokens: bias 0
        for l in range(q.shape[1]):  # query l of the step at position first + l (sees fed tokens <= it)
            ref = _eager_reference(model, i, q[:, l], keys, values, k_pos, first + l, bias)
            worst = max(worst, (out[l].double() - ref).abs().max().item())
    assert worst <= 2e-5, worst  # float32 path vs float64 reference, outputs of magnitude <= ~3


def test_unsupported_features_are_refused():
    model = models.tiny_family_model("llama", 1)
    attn = model.model.layers[0].self_attn
    with pytest.raises(InputError, match=r"layer 0 \(LlamaAttention\): chunked attention"):
        layer_features(attn, {"attention_chunk_size": 8}, 4)
    with pytest.raises(InputError, match="ALiBi"):
        layer_features(attn, {"alibi": torch.zeros(4)}, 4)
    with pytest.raises(InputError, match=r"learned sinks of shape \(3,\) are not one logit per query head"):
        layer_features(attn, {"s_aux": torch.zeros(3)}, 4)
    with pytest.raises(InputError, match="soft-cap -1.0 is not a positive number"):
        layer_features(attn, {"softcap": -1.0}, 4)
    for layer in model.model.layers:  # bidirectional attention, through a real forward pass
        layer.self_attn.is_causal = False
    with pytest.raises(InputError, match="bidirectional attention is not supported by the context prefill"):
        prefill_context(use_ragged_attention(model), None, _ids(8))


def test_window_learned_from_the_call_and_refused_after_an_early_eviction():
    # a fresh RaggedKVCache learns each layer's window from its first attention call (model.generate)
    ids = _ids(N_CTX, seed=6)
    ref = _generate(_reference_model("mistral"), ids, 4)
    ragged = use_ragged_attention(models.tiny_family_model("mistral", 1))
    cache = RaggedKVCache()
    out = ragged.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None,
                          **cache_kwargs(cache))
    assert out[0, N_CTX:].tolist() == ref
    assert [layer.window for layer in cache.layers] == [W, W] and cache.layers[0].lengths_h == [W, W]
    # evicted before any attention call told it the window: the positions are lost, refused
    pre = prefill_context(ragged, None, ids)
    blind = RaggedKVCache.from_dense(pre.cache)  # no windows given, full dense layers
    blind.evict(0, [torch.arange(5), torch.arange(5)])
    with pytest.raises(InputError, match="evicted before its window was known"):
        greedy_answer(ragged, blind, ids[:, -1:], N_CTX, 2)


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", "mistral"])
def test_prefill_attention_rows_follow_the_layer(family):
    # the rows policies read (Prefill.attention) are the model's own eager probabilities: window and
    # soft-cap applied; with sinks renormalised over the keys (as the dumped rows are)
    ids = _ids(N_CTX, seed=9)
    eager = _reference_model(family)
    with torch.inference_mode():
        att = eager(ids, output_attentions=True).attentions
    pre = prefill_context(use_ragged_attention(models.tiny_family_model(family, 1)), None, ids)
    for i in range(pre.n_layers):
        ref = att[i][0].double()
        ref = ref / ref.sum(-1, keepdim=True)  # gpt-oss: the sink's share removed; others: unchanged
        got = torch.from_numpy(pre.attention(i))
        assert (got - ref).abs().max().item() <= 1e-5, (family, i)  # float32 model vs float64 rows
