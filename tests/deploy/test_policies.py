"""Policies and the Prefill on tiny random GQA Llama models, against the model's own eager attention.

Every reference is computed independently: attention probabilities from the same model run with
``attn_implementation="eager"`` and ``output_attentions=True`` (float32; compared at ``atol=1e-6``),
keys from its own ``DynamicCache``, and float64 NumPy re-statements of kvpress 0.5.5's presses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicCache

from forcedweight.core.operator import top_s
from forcedweight.deploy.allocate import budget_for, evict, make_allocator, select
from forcedweight.deploy.policies import POLICIES, make_policy
from forcedweight.deploy.policies.compactor import sketch
from forcedweight.deploy.prefill import copy_dense_cache, prefill_context
from forcedweight.errors import InputError
from forcedweight.models import byte_tokenizer, tiny_llama
from forcedweight.selectors.baselines import KNorm, StreamingLLM
from forcedweight.selectors.base import RowView
from forcedweight.selectors.mass import TOVA

N_CTX = 96
ATOL = 1e-6  # float32 eager probabilities vs our float64 softmax of the same float32 q, k


@pytest.fixture(scope="module")
def model():
    return tiny_llama(0, layers=2, heads=4, kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def context_ids():
    return torch.randint(3, 300, (1, N_CTX), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def prefill(model, context_ids):
    return prefill_context(model, byte_tokenizer(), context_ids)


@pytest.fixture(scope="module")
def eager(model, context_ids):
    """(attentions per layer (H_q, N, N) float64, keys per layer (H_kv, N, d), values, last logits)."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(context_ids, output_attentions=True, use_cache=True, cache=cache)
    finally:
        model.config._attn_implementation = previous
    attn = [a[0].double().numpy() for a in out.attentions]
    keys = [layer.keys[0].double().numpy() for layer in cache.layers]
    vals = [layer.values[0].double().numpy() for layer in cache.layers]
    return attn, keys, vals, out.logits[0, -1]


def _group_mean(x, g):
    """(H_q, ...) → (H_kv, ...) mean over each KV group's G query heads (repeat_kv layout)."""
    return x.reshape(x.shape[0] // g, g, *x.shape[1:]).mean(axis=1)


def test_prefill_matches_eager_attention(prefill, eager, model):
    attn, keys, vals, logits = eager
    assert (prefill.n_layers, prefill.n_heads, prefill.n_kv_heads, prefill.group_size) == (2, 4, 2, 2)
    assert prefill.head_dim == 16 and prefill.n_tokens == N_CTX and prefill.scaling == 16 ** -0.5
    for layer in range(2):
        np.testing.assert_allclose(prefill.attention(layer), attn[layer], rtol=0, atol=ATOL)
        np.testing.assert_allclose(prefill.attention(layer, slice(-5, None)), attn[layer][:, -5:], rtol=0, atol=ATOL)
        np.testing.assert_allclose(prefill.keys(layer).numpy(), keys[layer], rtol=0, atol=1e-6)
        np.testing.assert_allclose(prefill.values(layer).numpy(), vals[layer], rtol=0, atol=1e-6)
        # the captured queries are the post-RoPE ones: RoPE undone, they are q_proj of the layer input
        assert prefill.queries[layer].shape == (4, N_CTX, 16)
    torch.testing.assert_close(prefill.logits_last, logits, rtol=0, atol=1e-5)
    assert model.config._attn_implementation != "forcedweight_prefill"  # restored


def test_prefill_bad_input(model):
    with pytest.raises(InputError, match="empty context"):
        prefill_context(model, None, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(InputError, match="window"):
        prefill_context(model, None, torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long))


def test_ragged_cache_is_a_fresh_copy(prefill):
    before = [prefill.keys(layer).clone() for layer in range(2)]
    cache = prefill.ragged_cache()
    assert cache.entries() == 2 * 2 * N_CTX
    keep = select(make_policy("knorm").padded_scores(prefill), np.full((2, 2), 10))
    evict(cache, keep)
    assert cache.entries() == 40
    for layer in range(2):
        torch.testing.assert_close(prefill.keys(layer), before[layer], rtol=0, atol=0)
    assert prefill.ragged_cache().entries() == 2 * 2 * N_CTX


def test_registry_and_options():
    assert set(POLICIES) >= {"random", "streaming_llm", "knorm"}
    with pytest.raises(InputError, match="unknown policy 'nope'"):
        make_policy("nope")
    with pytest.raises(InputError, match="knorm: unknown option"):
        make_policy("knorm", window=3)
    with pytest.raises(InputError, match="sinks"):
        make_policy("knorm", sinks=-1)
    for name, cls in POLICIES.items():
        assert isinstance(cls.query_agnostic, bool) and cls.name == name


def test_shapes_and_padding(prefill):
    for name in POLICIES:
        pol = make_policy(name, sinks=2, recent=3)
        sc = pol.padded_scores(prefill)
        assert len(sc) == 2
        for s in sc:
            assert s.shape == (2, N_CTX) and s.dtype == np.float64 and not np.isnan(s).any()
            assert np.isposinf(s[:, :2]).all() and np.isposinf(s[:, -3:]).all()


def test_random_is_seeded(prefill):
    a = make_policy("random", seed=3).score(prefill)
    b = make_policy("random", seed=3).score(prefill)
    c = make_policy("random", seed=4).score(prefill)
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        assert not np.array_equal(x, z)
        assert (x >= 0).all() and (x < 1).all()
    assert not np.array_equal(a[0][0], a[0][1]) and not np.array_equal(a[0][0], a[1][0])  # one stream per segment


def test_streaming_llm_keeps_sinks_and_recent(prefill):
    pol = make_policy("streaming_llm")
    assert pol.sinks == 4
    sc = pol.padded_scores(prefill)
    r = 0.75
    counts = make_allocator("uniform").allocate(sc, budget_for(N_CTX, 2, 2, r))
    n_kept = int(N_CTX * (1 - r))
    expect = np.r_[0:4, N_CTX - (n_kept - 4):N_CTX]  # kvpress StreamingLLMPress: n_sink + the last
    for heads in select(sc, counts):
        for k in heads:
            np.testing.assert_array_equal(k, expect)
    # the row-selector twin keeps the same set on every segment
    row = RowView(np.full(N_CTX, 1.0 / N_CTX), np.zeros((N_CTX, 1)))
    np.testing.assert_array_equal(top_s(StreamingLLM(sinks=4).padded_score(row), n_kept), expect)


def test_knorm_equals_eager_keys_and_its_selector_twin(prefill, eager):
    _, keys, vals, _ = eager
    sc = make_policy("knorm").score(prefill)
    for layer in range(2):
        np.testing.assert_allclose(sc[layer], -np.linalg.norm(keys[layer], axis=-1), rtol=0, atol=1e-5)
        for h in range(2):
            row = RowView(np.full(N_CTX, 1.0 / N_CTX), vals[layer][h], keys=keys[layer][h])
            for s in (1, 10, 50):
                np.testing.assert_array_equal(top_s(sc[layer][h], s), top_s(KNorm().padded_score(row), s))


def _kvpress_pad(scores: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.pad(scores, (0, n), value=scores.max().item() + 1)


def test_tova_equals_kvpress_on_eager_attention(prefill, eager):
    attn, *_ = eager
    sc = make_policy("tova").score(prefill)
    sc_group = make_policy("tova", heads="group").score(prefill)
    for layer in range(2):
        a = torch.tensor(attn[layer])[None]  # (1, H_q, N, N)
        ref = a[..., -1:, :-1].mean(1).repeat(1, 2, 1)  # kvpress TOVAPress.score
        np.testing.assert_allclose(sc[layer], _kvpress_pad(ref, 1)[0].numpy(), rtol=0, atol=ATOL)
        ref_g = _group_mean(attn[layer][:, -1, :-1], 2)
        np.testing.assert_allclose(sc_group[layer][:, :-1], ref_g, rtol=0, atol=ATOL)
        assert (sc_group[layer][:, -1] > 1).all()


def test_h2o_equals_accumulated_eager_attention(prefill, eager):
    attn, *_ = eager
    sc = make_policy("h2o").score(prefill)
    sc_norm = make_policy("h2o", normalize=True).score(prefill)
    for layer in range(2):
        np.testing.assert_allclose(sc[layer], _group_mean(attn[layer].sum(axis=1), 2), rtol=0, atol=N_CTX * ATOL)
        a = torch.tensor(attn[layer])[None]  # kvpress ObservedAttentionPress.score
        ref = (a.sum(2) / torch.arange(N_CTX, 0, -1, dtype=a.dtype)).view(1, 2, -1, N_CTX).mean(2)[0]
        np.testing.assert_allclose(sc_norm[layer], ref.numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("window", [64, 8])
def test_snapkv_equals_kvpress_on_eager_attention(prefill, eager, window):
    attn, *_ = eager
    sc = make_policy("snapkv", window=window).score(prefill)
    for layer in range(2):
        a = torch.tensor(attn[layer])[None]  # kvpress SnapKVPress.score with attentions given
        w = a[..., -window:, :-window].mean(dim=-2)
        w = torch.nn.functional.avg_pool1d(w, kernel_size=5, padding=2, stride=1)
        w = w.view(1, 2, 2, N_CTX - window).mean(2)
        np.testing.assert_allclose(sc[layer], _kvpress_pad(w, window)[0].numpy(), rtol=0, atol=ATOL)


def test_snapkv_short_context_clips_the_window(model):
    pre = prefill_context(model, None, torch.arange(3, 23)[None])
    sc = make_policy("snapkv").score(pre)  # N = 20 <= 64: window N - 1
    assert sc[0].shape == (2, 20) and (sc[0][:, 1:] > sc[0][:, :1]).all()


def test_tova_twin_keeps_the_selector_set_on_one_segment():
    m = tiny_llama(1, layers=1, heads=2, kv_heads=1, head_dim=16)
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    pre = prefill_context(m, None, ids)
    sc = make_policy("tova").padded_scores(pre)[0][0]
    row = RowView(pre.attention(0, slice(-1, None))[:, 0].mean(axis=0), pre.values(0)[0].double().numpy())
    twin = TOVA(recent=1).padded_score(row)  # kvpress keeps the last entry; TOVA's row is the last query
    for s in (1, 5, 20, 39):
        np.testing.assert_array_equal(top_s(sc, s), top_s(twin, s))


@pytest.fixture(scope="module")
def layer_inputs(model, context_ids):
    """Each attention layer's input hidden states (1, N, D), caught by forward pre-hooks (eager run)."""
    caught = {}

    def hook(module, args, kwargs):
        caught[module.layer_idx] = kwargs["hidden_states"].detach().double()

    handles = [layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(context_ids)
    finally:
        for h in handles:
            h.remove()
    return caught


@torch.no_grad()
def _kvpress_expected_attention(model, layer, hidden, keys, values, n_sink=4, n_future=512):
    """kvpress 0.5.5 ExpectedAttentionPress.score, float64 (pre-RoPE queries from q_proj of the layer input)."""
    attn = model.model.layers[layer].self_attn
    H, d = model.config.num_attention_heads, attn.head_dim
    q_len = hidden.shape[1]
    h = hidden[:, n_sink:]
    qs = (h @ attn.q_proj.weight.double().T).view(1, -1, H, d).transpose(1, 2)
    mu = qs.mean(dim=2, keepdim=True)
    c = qs - mu
    cov = torch.einsum("bnsi,bnsj->bnij", c, c) / h.shape[1]
    mu = mu.squeeze(2)
    pos = torch.arange(q_len, q_len + n_future).unsqueeze(0)
    cos, sin = model.model.rotary_emb(mu.float(), pos)
    cos, sin = cos[0].double(), sin[0].double()
    Id = torch.eye(d, dtype=torch.float64)
    P = torch.zeros((d, d), dtype=torch.float64)
    P[d // 2:, : d // 2], P[: d // 2, d // 2:] = torch.eye(d // 2), -torch.eye(d // 2)
    R = (cos.unsqueeze(1) * Id + sin.unsqueeze(1) * P).mean(dim=0)
    mu = torch.matmul(mu, R.T)
    cov = torch.matmul(R, torch.matmul(cov, R.T))
    k = torch.tensor(keys)[None, :, n_sink:]
    v = torch.tensor(values)[None, :, n_sink:]
    g = H // k.shape[1]
    kk = k.repeat_interleave(g, dim=1).transpose(2, 3)
    s = torch.matmul(mu.unsqueeze(2), kk).squeeze(2) / math.sqrt(d)
    s = s + torch.einsum("bhin, bhij, bhjn->bhn", kk, cov, kk) / d / 2
    s = torch.softmax(s, dim=-1).view(1, k.shape[1], g, -1).mean(dim=2)
    s = s * v.norm(dim=-1)
    return torch.nn.functional.pad(s, (n_sink, 0), value=s.max().item() + 1)[0].numpy()


def test_expected_attention_equals_kvpress(prefill, eager, layer_inputs, model):
    _, keys, vals, _ = eager
    sc = make_policy("expected_attention").score(prefill)
    for layer in range(2):
        ref = _kvpress_expected_attention(model, layer, layer_inputs[layer], keys[layer], vals[layer])
        np.testing.assert_allclose(sc[layer], ref, rtol=1e-5, atol=1e-7)  # float32 queries/keys in the model
        assert not np.allclose(sc[layer][0], sc[layer][1])


def test_kvzip_equals_max_reconstruction_attention_from_eager(model, prefill, context_ids):
    """Reference: each chunk's repeat prompt run by the eager model on its own cache of the context;
    kvpress's subsampled softmax is the eager row renormalised over {sinks, chunk, repeat tokens}."""
    tok = prefill.tokenizer  # the same instance: byte_tokenizer()'s ids differ between instances
    chunk, n_sink = 40, 4
    before = [prefill.keys(layer).clone() for layer in range(2)]
    pol = make_policy("kvzip", chunk_size=chunk)
    sc = pol.score(prefill)
    for layer in range(2):  # the Prefill's cache is not mutated
        assert prefill.cache.layers[layer].keys.shape[2] == N_CTX
        torch.testing.assert_close(prefill.keys(layer), before[layer], rtol=0, atol=0)
    ref = np.zeros((2, 2, N_CTX))
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        chunks = [context_ids[:, s:s + chunk] for s in range(0, N_CTX, chunk)]
        for i, a in enumerate(chunks):
            prompt = ("\n\nRepeat the previous context exactly." if i == 0 else
                      "\n\nRepeat the part of the previous context exactly, starting with")
            q = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
            if i:
                q = torch.cat([q, chunks[i - 1][:, -8:]], dim=1)
            rep = torch.cat([q, torch.tensor([tok.encode("\n", add_special_tokens=False)]), a], dim=1)
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                model(context_ids, cache=cache, use_cache=True)
                out = model(rep, cache=cache, use_cache=True, output_attentions=True)
            start, end, L = i * chunk, i * chunk + a.shape[1], rep.shape[1]
            sink = min(n_sink, start)
            cols = np.r_[0:sink, start:end, N_CTX:N_CTX + L]
            for layer in range(2):
                A = out.attentions[layer][0].double().numpy()  # (H_q, L, N + L)
                sub = A[:, :, cols] / A[:, :, cols].sum(axis=-1, keepdims=True)
                part = sub[:, :, sink:sink + end - start]  # (H_q, L, c)
                ref[layer, :, start:end] = part.reshape(2, 2 * L, -1).max(axis=1)
    finally:
        model.config._attn_implementation = previous
    ref[..., :n_sink] = ref.max() + 1
    for layer in range(2):
        np.testing.assert_allclose(sc[layer], ref[layer], rtol=0, atol=ATOL)
    assert pol.last_cost["forward_tokens"] > N_CTX and pol.last_cost["prefill_multiple"] > 1
    assert make_policy("kvzip").query_agnostic


@torch.no_grad()
def _kvpress_compactor(model, layer, hidden, values, phi, chunk, blending, left=8, right=4):
    """kvpress 0.5.5 CompactorPress.score (leverage + non-causal chunked attention), float64, from the
    layer input: pre-RoPE keys = k_proj, queries = q_proj + the model's RoPE."""
    attn = model.model.layers[layer].self_attn
    H, Hkv, d = model.config.num_attention_heads, model.config.num_key_value_heads, attn.head_dim
    n = hidden.shape[1]
    pos = torch.arange(n)[None]
    cos, sin = model.model.rotary_emb(hidden.float(), pos)
    cos, sin = cos.double(), sin.double()
    hs = hidden[:, left:n - right]
    cos, sin = cos[:, left:n - right], sin[:, left:n - right]
    k_pre = (hs @ attn.k_proj.weight.double().T).view(1, -1, Hkv, d).transpose(1, 2)
    rot = lambda x: torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)  # noqa: E731
    keys = k_pre * cos[:, None] + rot(k_pre) * sin[:, None]
    # LeverageScorePress.compute_leverage_scores with the given sketch
    X = (k_pre - k_pre.mean(dim=-2, keepdim=True)) @ phi[None]
    G = X.transpose(-2, -1) @ X
    L = torch.linalg.cholesky(0.5 * (G + G.transpose(-2, -1)) + 1e-2 * torch.eye(G.shape[-1], dtype=G.dtype))
    lev = (X * torch.cholesky_solve(X.transpose(-2, -1), L).transpose(-2, -1)).sum(-1).clamp_min(0)
    lev = (lev - lev.mean()) / lev.std().clamp_min(1e-6)
    # NonCausalAttnPress.score
    q = (hs @ attn.q_proj.weight.double().T).view(1, -1, H, d).transpose(1, 2)
    q = q * cos[:, None] + rot(q) * sin[:, None]
    kk = keys.repeat_interleave(H // Hkv, dim=1)
    S = q.shape[2]
    S_pad = math.ceil(S / chunk) * chunk
    pad = S_pad - S
    qp = torch.cat([q, torch.zeros(1, H, pad, d, dtype=q.dtype)], dim=2)
    kp = torch.cat([kk, torch.zeros(1, H, pad, d, dtype=q.dtype)], dim=2)
    last = (S // chunk) * chunk if pad > 0 else ((S - 1) // chunk) * chunk
    m = (torch.arange(last, S_pad) >= S).view(1, 1, chunk).expand(1, H, chunk)
    dots = torch.matmul(qp.view(1, H, -1, chunk, d), kp.view(1, H, -1, chunk, d).transpose(-2, -1))
    dots[:, :, -1].masked_fill_(m.unsqueeze(-1), 0)
    dots[:, :, -1].masked_fill_(m.unsqueeze(-2), -1e-9)
    A = torch.softmax(dots, dim=-1).sum(dim=-2).view(1, H, S_pad)[..., :S]
    A = A.view(1, Hkv, -1, S).mean(dim=-2) * torch.tensor(values)[None, :, left:n - right].norm(dim=-1)
    A = torch.nn.functional.avg_pool1d(A, kernel_size=3, padding=1, stride=1)
    A = (A - A.mean()) / A.std().clamp_min(1e-6)
    sc = blending * lev + A
    return torch.nn.functional.pad(sc, (left, right), value=sc.max().item())[0].numpy()


@pytest.mark.parametrize("chunk,ratio", [(256, 0.5), (32, 0.75), (42, 0.9)])
def test_compactor_equals_kvpress(prefill, eager, layer_inputs, model, chunk, ratio):
    _, _, vals, _ = eager
    pol = make_policy("compactor", chunk_size=chunk, seed=5)
    assert pol.depends_on_ratio and pol.query_agnostic
    sc = pol.score(prefill, compression_ratio=ratio)
    for layer in range(2):
        phi = sketch(5, layer, 2, 16, 48)
        ref = _kvpress_compactor(model, layer, layer_inputs[layer], vals[layer], phi, chunk, ratio)
        np.testing.assert_allclose(sc[layer], ref, rtol=0, atol=1e-4)  # z-scores of float32 model tensors
    padded = pol.padded_scores(prefill, compression_ratio=ratio)
    np.testing.assert_array_equal(padded[0], sc[0])
    assert not np.allclose(pol.score(prefill, compression_ratio=0.1)[0], sc[0])  # the blending follows r


def _kept(policy, pre, ratio=0.5, allocator="uniform"):
    sc = policy.padded_scores(pre, compression_ratio=ratio)
    counts = make_allocator(allocator).allocate(sc, budget_for(pre.n_tokens, pre.n_layers, pre.n_kv_heads, ratio))
    return [[k.tolist() for k in heads] for heads in select(sc, counts)]


def test_question_does_not_change_query_agnostic_kept_sets(model, prefill, context_ids):
    """The protocol: the policy scores the context's Prefill; the question is fed afterwards to a copy of
    the cache. Two questions leave every query-agnostic policy's kept set unchanged, the Prefill intact,
    and a new prefill of the same context (the next example, another question) gives the same sets."""
    agnostic = [n for n, c in POLICIES.items() if c.query_agnostic]
    assert set(agnostic) == set(POLICIES)  # every policy here is query-agnostic (kvpress's query_aware: false)
    opts = {"kvzip": {"chunk_size": 40}}
    first = {n: _kept(make_policy(n, **opts.get(n, {})), prefill) for n in agnostic}
    for seed in (1, 2):
        question = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(seed))
        cache = copy_dense_cache(prefill.cache, model)
        with torch.no_grad():
            model(question, cache=cache, use_cache=True)
        assert cache.get_seq_length() == N_CTX + 12 and prefill.cache.get_seq_length() == N_CTX
        again = prefill_context(model, prefill.tokenizer, context_ids)
        for n in agnostic:
            pol = make_policy(n, **opts.get(n, {}))
            assert _kept(pol, prefill) == first[n], n
            assert _kept(pol, again) == first[n], n
    # the sets differ between policies (the test can fail)
    assert first["knorm"] != first["tova"] and first["snapkv"] != first["streaming_llm"]


@pytest.mark.smollm2
def test_smollm2_prefill_and_kvzip(smollm2):
    """On the embedded SmolLM2 (chat template, GQA 9 over 3): the Prefill equals eager attention, and
    KVzip runs its reconstruction on a copy (the Prefill's cache intact), every entry scored."""
    m, tok = smollm2.model, smollm2.tokenizer
    ids = tok("The needle is 4217. " * 12, return_tensors="pt").input_ids[:, :64]
    pre = prefill_context(m, tok, ids)
    previous = m.config._attn_implementation
    m.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = m(ids, output_attentions=True)
    finally:
        m.config._attn_implementation = previous
    for layer in (0, pre.n_layers - 1):
        np.testing.assert_allclose(pre.attention(layer), out.attentions[layer][0].double().numpy(), rtol=0, atol=1e-5)
    before = pre.keys(3).clone()
    pol = make_policy("kvzip")
    sc = pol.padded_scores(pre)
    torch.testing.assert_close(pre.keys(3), before, rtol=0, atol=0)
    assert len(sc) == pre.n_layers and sc[0].shape == (3, 64) and (sc[0][:, 4:] > 0).all()
    assert pol.last_cost["prefill_multiple"] > 1
