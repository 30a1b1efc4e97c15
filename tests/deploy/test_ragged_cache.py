"""RaggedKVCache + the "forcedweight_ragged" attention function: generation equals transformers'
DynamicCache; eviction releases memory and decoding after it equals dense attention restricted to the
kept entries; the memory audit and its command."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.memory import audit_memory, budget_from
from forcedweight.deploy.ragged_cache import RaggedKVCache
from forcedweight.models import tiny_llama
from forcedweight.errors import InputError

TINY = dict(layers=2, heads=6, kv_heads=2, head_dim=16)  # GQA, G = 3


def tiny_pair(seed=0, **kw):
    """The same tiny random GQA Llama twice: one on eager attention (reference), one on ragged attention."""
    cfg = {**TINY, **kw}
    dense = tiny_llama(seed, **cfg)
    dense.set_attn_implementation("eager")
    return dense, use_ragged_attention(tiny_llama(seed, **cfg))


def prompt(batch, length, seed=0, vocab=300):
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def greedy(model, ids, cache, n):
    return model.generate(ids, max_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, cache=cache, pad_token_id=0)


def test_generation_matches_dynamic_cache_tiny():
    dense, ragged = tiny_pair()
    dense.set_attn_implementation("sdpa")  # transformers' default attention with its default cache
    ids = prompt(2, 13)
    a = greedy(dense, ids, DynamicCache(config=dense.config), 10)
    cache = RaggedKVCache()
    b = greedy(ragged, ids, cache, 10)
    assert torch.equal(a.sequences, b.sequences)
    # float32 throughout; only the order of the softmax reductions differs (scatter vs SDPA): ~1e-7 seen
    err = max((x - y).abs().max().item() for x, y in zip(a.logits, b.logits))
    assert err <= 1e-4, err
    assert cache.get_seq_length() == 13 + 9  # the last generated token is not fed back
    assert cache.lengths(0).tolist() == [22] * 4


def test_generation_through_triton_kernel_matches_dynamic_cache():
    # the decode steps through the Triton kernel (interpreted on CPU), launched from the cache's host lengths
    dense, _ = tiny_pair(seed=2)
    dense.set_attn_implementation("sdpa")
    ragged = use_ragged_attention(tiny_llama(2, **TINY), backend="triton")
    ids = prompt(1, 9, seed=2)
    a = greedy(dense, ids, DynamicCache(config=dense.config), 4)
    b = greedy(ragged, ids, RaggedKVCache(), 4)
    assert torch.equal(a.sequences, b.sequences)
    # float32, the kernel's fp32 ("ieee") dots: rounding only
    assert max((x - y).abs().max().item() for x, y in zip(a.logits, b.logits)) <= 1e-4


@pytest.mark.smollm2
def test_generation_matches_dynamic_cache_smollm2(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    model.set_attn_implementation("sdpa")
    try:
        a = greedy(model, ids, DynamicCache(config=model.config), 8)
        use_ragged_attention(model)
        b = greedy(model, ids, RaggedKVCache(), 8)
    finally:
        model.set_attn_implementation("sdpa")
    assert torch.equal(a.sequences, b.sequences)
    # float32, 30 layers: reduction-order differences (ours vs SDPA) reach ~3e-5 on logits up to ~35;
    # 2e-3 leaves room for other BLAS builds while still catching any wrong entry or position
    err = max((x - y).abs().max().item() for x, y in zip(a.logits, b.logits))
    assert err <= 2e-3, err


def random_keep(lengths, sizes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.sort(torch.randperm(n, generator=g)[:s]).values for n, s in zip(lengths, sizes)]


def restricted_mask(keep, batch, kv_heads, G, past, new, bias=None):
    """Additive [B, Hq, new, past + new] mask: per head, evicted past entries -inf, kept ones their bias,
    new tokens causal among themselves."""
    Hq = kv_heads * G
    mask = torch.full((batch, Hq, new, past + new), float("-inf"))
    for s, idx in enumerate(keep):
        b, h = divmod(s, kv_heads)
        val = torch.zeros(len(idx)) if bias is None else bias[s]
        for j in range(h * G, (h + 1) * G):
            mask[b, j, :, idx] = val
    causal = torch.tril(torch.ones(new, new, dtype=torch.bool))
    mask[..., past:] = torch.where(causal, 0.0, float("-inf"))
    return mask


@pytest.mark.parametrize("with_bias", [False, True])
def test_evict_then_decode_equals_restricted_dense_attention(with_bias):
    dense, ragged = tiny_pair(seed=1)
    B, Hkv, G, N = 2, 2, 3, 24
    ids = prompt(B, N, seed=1)
    dc, rc = DynamicCache(config=dense.config), RaggedKVCache()
    with torch.no_grad():
        dense(input_ids=ids, cache=dc)
        ragged(input_ids=ids, cache=rc)
    sizes = [5, 1, 17, 9]  # ragged: every (batch, head) keeps its own number, one keeps a single entry
    keep = random_keep([N] * 4, sizes, seed=2)
    bias = [torch.randn(s, generator=torch.Generator().manual_seed(s)) for s in sizes] if with_bias else None
    for layer in range(2):  # the same selection in both layers, so one 4D mask describes it
        rc.evict(layer, keep, bias)
    assert rc.get_seq_length() == N and rc.lengths(1).tolist() == sizes
    # new entries: 3 tokens at once (the padded prefill path), then 3 single-token decode steps
    steps = [prompt(B, 3, seed=5)] + [prompt(B, 1, seed=6 + i) for i in range(3)]
    past = N
    cur_keep, cur_bias = keep, bias
    for x in steps:
        L = x.shape[1]
        mask = restricted_mask(cur_keep, B, Hkv, G, past, L, cur_bias)
        with torch.no_grad():
            ref = dense(input_ids=x, cache=dc, attention_mask=mask).logits
            out = ragged(input_ids=x, cache=rc).logits
        # float32 on both sides; eager softmax vs split softmax / SDPA: rounding only
        assert (ref - out).abs().max().item() <= 1e-4
        cur_keep = [torch.cat([k, torch.arange(past, past + L)]) for k in cur_keep]
        if cur_bias is not None:
            cur_bias = [torch.cat([b, torch.zeros(L)]) for b in cur_bias]  # appended entries get bias 0
        past += L
    assert rc.get_seq_length() == N + 6
    assert rc.lengths(0).tolist() == [s + 6 for s in sizes]
    assert torch.equal(rc.layers[0].indptr.diff(), rc.lengths(0))  # host copy agrees with the device indptr


def test_evict_releases_storage_and_bytes_match_entries():
    _, ragged = tiny_pair(seed=3, layers=3)
    B, N, budget = 2, 200, 50
    rc = RaggedKVCache()
    with torch.no_grad():
        ragged(input_ids=prompt(B, N, seed=3), cache=rc)
    full = rc.physical_bytes()
    entry = 2 * 16 * 4  # K and V, head dim 16, float32
    assert rc.nominal_bytes() == 3 * B * 2 * N * entry
    for layer in range(3):
        keep = [torch.stack(random_keep([N] * 2, [budget] * 2, seed=layer + 10 * b)) for b in range(B)]
        rc.evict(layer, torch.stack(keep))  # the [B, Hkv, s] tensor form
    kept = 3 * B * 2 * budget
    assert rc.entries() == kept and rc.nominal_bytes() == kept * entry
    phys = rc.physical_bytes()
    # the K/V storages are exactly the kept entries; the rest is indptr metadata, bounded by 2%
    for layer in rc.layers:
        assert layer.k.untyped_storage().nbytes() == layer.k.shape[0] * 16 * 4
        assert layer.v.untyped_storage().nbytes() == layer.v.shape[0] * 16 * 4
    assert kept * entry <= phys <= 1.02 * kept * entry
    assert phys < 0.26 * full  # 50 of 200 entries kept
    assert rc.get_seq_length() == N


def test_evict_bad_keep_is_rejected():
    _, ragged = tiny_pair()
    rc = RaggedKVCache()
    with torch.no_grad():
        ragged(input_ids=prompt(1, 8), cache=rc)
    with pytest.raises(InputError, match="out of range"):
        rc.evict(0, [torch.tensor([0, 8]), torch.tensor([1])])
    with pytest.raises(InputError, match="repeated"):
        rc.evict(0, [torch.tensor([1, 1]), torch.tensor([1])])
    with pytest.raises(InputError, match="index sets"):
        rc.evict(0, [torch.tensor([1])])
    with pytest.raises(InputError, match="layer 5"):
        rc.evict(5, [torch.tensor([1]), torch.tensor([1])])
    with pytest.raises(InputError, match="bias has"):
        rc.evict(0, [torch.tensor([1]), torch.tensor([1])], bias=[torch.zeros(2), torch.zeros(1)])


def test_memory_audit_masked_holds_full_cache():
    r = audit_memory("tiny", tokens=300, budget=60, seed=0)
    per_entry = 2 * r["head_dim"] * 4
    kept = r["layers"] * r["kv_heads"] * 60
    assert r["kept_entries"] == kept and r["ragged_nominal_bytes"] == kept * per_entry
    assert r["full_bytes"] == r["layers"] * r["kv_heads"] * 300 * per_entry
    assert r["masked_bytes"] == r["full_bytes"] + r["layers"] * r["kv_heads"] * 300  # + one bool per entry
    assert 0 < r["ragged_metadata_bytes"] <= 0.02 * r["ragged_nominal_bytes"]
    assert r["ragged_over_full"] == pytest.approx(0.2, abs=0.01)


def test_memory_budget_from_compression_ratio():
    assert budget_from(64, compression_ratio=0.0) == 64  # nothing evicted
    assert budget_from(64, compression_ratio=0.75) == 16
    assert budget_from(10, compression_ratio=0.99) == 1  # at least one entry kept
    assert budget_from(64, budget=5) == 5
    with pytest.raises(InputError, match="--compression-ratio"):
        budget_from(64, compression_ratio=1.0)  # evicting everything is not a cache


def test_memory_command_and_errors(tmp_path):
    from typer.testing import CliRunner

    from forcedweight.cli import app

    runner = CliRunner()
    out = tmp_path / "audit.json"
    # --compression-ratio is the evicted fraction (kvpress's meaning): 0.75 of 64 evicted keeps 16
    res = runner.invoke(app, ["memory", "--tokens", "64", "--compression-ratio", "0.75", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["budget"] == 16 and "ragged (after evict)" in res.output
    res = runner.invoke(app, ["memory", "--tokens", "64", "--compression-ratio", "0.5", "--budget", "3"])
    assert res.exit_code == 2 and "exactly one" in res.output
    res = runner.invoke(app, ["memory", "--tokens", "64", "--compression-ratio", "1.5", "--out", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "--compression-ratio" in res.output
    assert not (tmp_path / "x.json").exists()
    # the old --ratio (the kept fraction) is refused with the new name, not silently reinterpreted
    res = runner.invoke(app, ["memory", "--tokens", "64", "--ratio", "0.25", "--out", str(tmp_path / "y.json")])
    assert res.exit_code == 2 and "--compression-ratio 0.75" in res.output
    assert not (tmp_path / "y.json").exists()
    # a budget above the prompt length is refused, not silently clamped
    res = runner.invoke(app, ["memory", "--tokens", "64", "--budget", "65"])
    assert res.exit_code == 2 and "--budget: 65 exceeds --tokens 64" in res.output
    (tmp_path / "adir").mkdir()  # --out an existing directory: one line, not a traceback after the audit
    res = runner.invoke(app, ["memory", "--tokens", "64", "--budget", "4", "--out", str(tmp_path / "adir")])
    assert res.exit_code == 2 and "adir: output path is a directory" in res.output


def test_from_dense_copies_every_segment():
    dense, _ = tiny_pair(seed=4)
    dc = DynamicCache(config=dense.config)
    with torch.no_grad():
        dense(input_ids=prompt(2, 7, seed=4), cache=dc)
    rc = RaggedKVCache.from_dense(dc)
    assert rc.get_seq_length() == 7 and len(rc.layers) == 2
    for i, layer in enumerate(rc.layers):
        for b in range(2):
            for h in range(2):
                k, v = layer.segment(b, h)
                assert torch.equal(k, dc.layers[i].keys[b, h]) and torch.equal(v, dc.layers[i].values[b, h])
