"""RaggedKVCache + the "forcedweight_ragged" attention function: generation equals transformers'
DynamicCache; eviction releases memory and decoding after it equals dense attention restricted to the
kept entries; the memory audit and its command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from forcedweight.compat import cache_kwargs
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
                          return_dict_in_generate=True, **cache_kwargs(cache), pad_token_id=0)


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


def test_a_padded_batch_is_refused():
    # transformers hands a custom attention function no mask: the padding would be attended silently
    model = use_ragged_attention(use_ragged_attention(tiny_llama(0, **TINY)))  # switched twice: one hook
    ids = prompt(2, 6)
    mask = torch.ones(2, 6, dtype=torch.long)
    ref = model(input_ids=ids, attention_mask=mask, past_key_values=RaggedKVCache(), use_cache=True).logits
    assert torch.equal(ref, model(input_ids=ids, past_key_values=RaggedKVCache(), use_cache=True).logits)
    mask[0, :2] = 0
    with pytest.raises(InputError, match="padded batch"):
        model(input_ids=ids, attention_mask=mask, past_key_values=RaggedKVCache(), use_cache=True)
    with pytest.raises(InputError, match="padded batch"):
        model.generate(ids, attention_mask=mask, past_key_values=RaggedKVCache(), max_new_tokens=2, do_sample=False)
    assert len(model._forward_pre_hooks) == 1
    # not padding: one prompt holding the pad id (generate infers a mask with a zero inside), or zeros inside a row
    one = torch.tensor([[5, 7, model.config.pad_token_id, 9, 11]])
    model.generate(one, past_key_values=RaggedKVCache(), max_new_tokens=2, do_sample=False)
    inside = torch.ones(2, 6, dtype=torch.long)
    inside[1, 3] = 0
    model(input_ids=ids, attention_mask=inside, past_key_values=RaggedKVCache(), use_cache=True)


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
        dense(input_ids=ids, **cache_kwargs(dc))
        ragged(input_ids=ids, **cache_kwargs(rc))
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
            ref = dense(input_ids=x, **cache_kwargs(dc), attention_mask=mask).logits
            out = ragged(input_ids=x, **cache_kwargs(rc)).logits
        # float32 on both sides; eager softmax vs split softmax / SDPA: rounding only
        assert (ref - out).abs().max().item() <= 1e-4
        cur_keep = [torch.cat([k, torch.arange(past, past + L)]) for k in cur_keep]
        if cur_bias is not None:
            cur_bias = [torch.cat([b, torch.zeros(L)]) for b in cur_bias]  # appended entries get bias 0
        past += L
    assert rc.get_seq_length() == N + 6
    assert rc.lengths(0).tolist() == [s + 6 for s in sizes]
    for layer in rc.layers:  # the host copies agree with the device extents the kernel reads
        assert layer.lengths_t.tolist() == layer.lengths_h and layer.starts_t.tolist() == layer.starts


def test_evict_releases_storage_and_bytes_match_entries():
    _, ragged = tiny_pair(seed=3, layers=3)
    B, N, budget = 2, 200, 50
    rc = RaggedKVCache()
    with torch.no_grad():
        ragged(input_ids=prompt(B, N, seed=3), **cache_kwargs(rc))
    full = rc.physical_bytes()
    entry = 2 * 16 * 4  # K and V, head dim 16, float32
    assert rc.nominal_bytes() == 3 * B * 2 * N * entry
    for layer in range(3):
        keep = [torch.stack(random_keep([N] * 2, [budget] * 2, seed=layer + 10 * b)) for b in range(B)]
        rc.evict(layer, torch.stack(keep))  # the [B, Hkv, s] tensor form
    kept = 3 * B * 2 * budget
    assert rc.entries() == kept and rc.nominal_bytes() == kept * entry
    phys = rc.physical_bytes()
    # the K/V storages are the kept entries plus floor(50/64) = 0 spare rows per segment; the rest is
    # extent metadata (two int64 [B*Hkv] tensors per layer), bounded by 2%
    for layer in rc.layers:
        assert layer.k.shape[0] == B * 2 * budget
        assert layer.k.untyped_storage().nbytes() == layer.k.shape[0] * 16 * 4
        assert layer.v.untyped_storage().nbytes() == layer.v.shape[0] * 16 * 4
    assert rc.slack_bytes() == 0
    assert kept * entry <= phys <= 1.02 * kept * entry
    assert phys < 0.26 * full  # 50 of 200 entries kept
    assert rc.get_seq_length() == N


def test_evict_bad_keep_is_rejected():
    _, ragged = tiny_pair()
    rc = RaggedKVCache()
    with torch.no_grad():
        ragged(input_ids=prompt(1, 8), **cache_kwargs(rc))
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
    # a float index was truncated ([0.9, 2.7] kept 0 and 2) and a bool mask read as indices 0 / 1
    for bad in ([torch.tensor([0.9, 2.7]), torch.tensor([1])], [torch.tensor([False, True]), torch.tensor([1])]):
        with pytest.raises(InputError, match="integer indices"):
            rc.evict(0, bad)
    with pytest.raises(InputError, match="NaN or \\+inf"):
        rc.evict(0, [torch.tensor([1]), torch.tensor([1])], bias=[torch.tensor([np.nan]), torch.zeros(1)])
    assert rc.layers[0].lengths_h == [8, 8]  # nothing refused touched the layer


def test_update_with_mismatched_states_is_rejected():
    # on a uniform (never evicted) layer the strided copy broadcast them: one V row written 3 times
    c = RaggedKVCache()
    k = torch.zeros(1, 2, 6, 2)
    c.update(k, k.clone(), 0)
    for key, value, match in ((torch.ones(1, 2, 3, 2), torch.ones(1, 2, 1, 2), "alike"),
                              (torch.ones(1, 2, 3, 1), torch.ones(1, 2, 3, 2), "head dims"),
                              (torch.ones(1, 2, 3, 2), torch.ones(1, 1, 3, 2), "alike"),
                              (torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2), "batch/heads"),
                              (torch.ones(2, 3, 2), torch.ones(2, 3, 2), "alike")):
        with pytest.raises(InputError, match=match):
            c.update(key, value, 0)
    assert c.layers[0].lengths_h == [6, 6] and bool((c.layers[0].segment(0, 0)[1] == 0).all())
    c.evict(0, [torch.tensor([], dtype=torch.int64), []])  # an empty keep, as a tensor or a list
    assert c.layers[0].lengths_h == [0, 0]


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
    res = runner.invoke(app, ["memory", "--tokens", "99999999999"])  # asked for terabytes: a traceback
    assert res.exit_code == 2 and "exceeds the tiny model's window of 32768" in res.output
    (tmp_path / "adir").mkdir()  # --out an existing directory: one line, not a traceback after the audit
    res = runner.invoke(app, ["memory", "--tokens", "64", "--budget", "4", "--out", str(tmp_path / "adir")])
    assert res.exit_code == 2 and "adir: output path is a directory" in res.output


def test_memory_audit_past_the_window_or_the_machines_memory_is_one_line(monkeypatch):
    from forcedweight.deploy import memory
    from forcedweight.models import tiny_llama

    with pytest.raises(InputError, match="--tokens: 600 exceeds the model's window of 512"):
        memory.audit_memory(tiny_llama(0, max_positions=512), tokens=600, budget=4)

    def no_room(*a, **k):  # what torch's CPU allocator raises on a prefill too large (was a traceback)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory")

    lm = tiny_llama(0, max_positions=512)
    monkeypatch.setattr(lm, "forward", no_room)
    with pytest.raises(InputError, match="--tokens: the prefill of 64 tokens needs more memory"):
        memory.audit_memory(lm, tokens=64, budget=4)


def test_a_dense_cache_fed_a_chunk_over_its_past_attends_bottom_right():
    # the ragged attention function on a dense DynamicCache falls back to SDPA; with no mask SDPA's
    # is_causal is top-left, so a 4-token chunk after a 20-token past saw the wrong keys (0.53 off)
    from forcedweight import models

    ids = torch.randint(3, 300, (1, 24), generator=torch.Generator().manual_seed(7))
    rg = use_ragged_attention(models.tiny_family_model("llama", 1))
    ref = models.tiny_family_model("llama", 1, attn_implementation="eager")
    with torch.inference_mode():
        full = ref(input_ids=ids).logits
        for n in (1, 4):
            c = DynamicCache()
            rg(input_ids=ids[:, :20], use_cache=True, **cache_kwargs(c))
            out = rg(input_ids=ids[:, 20:20 + n], position_ids=torch.arange(20, 20 + n)[None], use_cache=True,
                     **cache_kwargs(c)).logits
            assert (out - full[:, 20:20 + n]).abs().max().item() < 1e-5  # float32: ~1.5e-7 measured


def test_from_dense_copies_every_segment():
    dense, _ = tiny_pair(seed=4)
    dc = DynamicCache(config=dense.config)
    with torch.no_grad():
        dense(input_ids=prompt(2, 7, seed=4), **cache_kwargs(dc))
    rc = RaggedKVCache.from_dense(dc)
    assert rc.get_seq_length() == 7 and len(rc.layers) == 2
    for i, layer in enumerate(rc.layers):
        for b in range(2):
            for h in range(2):
                k, v = layer.segment(b, h)
                assert torch.equal(k, dc.layers[i].keys[b, h]) and torch.equal(v, dc.layers[i].values[b, h])


def _segments(layer):
    """Every segment's (keys, values, bias) as cloned tensors, in segment order."""
    out = []
    for b in range(layer.batch):
        for h in range(layer.kv_heads):
            k, v = layer.segment(b, h)
            bias = layer.segment_bias(b, h)
            out.append((k.clone(), v.clone(), None if bias is None else bias.clone()))
    return out


def _states(B, Hkv, L, D, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, Hkv, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g)


def test_appends_are_in_place_until_the_spare_runs_out():
    # prefill N = 640: spare = max(8, ceil(640/64) = 10) rows per segment; 10 single-token appends write
    # in place (the buffers never move), the 11th lays the layer out again with a new spare
    B, Hkv, D, N = 2, 3, 8, 640
    rc = RaggedKVCache()
    k0, v0 = _states(B, Hkv, N, D, 0)
    rc.update(k0, v0, 0)
    layer = rc.layers[0]
    assert layer.caps == [N + 10] * (B * Hkv) and layer.stride == N + 10 and rc.relayouts() == 1
    ptr = layer.k.data_ptr()
    ks, vs = [k0], [v0]
    for step in range(10):
        k1, v1 = _states(B, Hkv, 1, D, 100 + step)
        rc.update(k1, v1, 0)
        ks.append(k1), vs.append(v1)
        assert layer.k.data_ptr() == ptr and rc.relayouts() == 1
    assert rc.slack_bytes() == 0  # exactly full
    k1, v1 = _states(B, Hkv, 1, D, 200)
    rc.update(k1, v1, 0)
    ks.append(k1), vs.append(v1)
    assert layer.k.data_ptr() != ptr and rc.relayouts() == 2
    n = N + 11
    spare = max(8, -(-n // 64))  # ceil(651 / 64) = 11 spare rows beyond the 651 held after this step
    assert layer.caps == [n + spare] * (B * Hkv)
    assert rc.slack_bytes() == B * Hkv * spare * 2 * D * 4
    full_k, full_v = torch.cat(ks, 2), torch.cat(vs, 2)
    for b in range(B):
        for h in range(Hkv):
            k, v = layer.segment(b, h)
            assert torch.equal(k, full_k[b, h]) and torch.equal(v, full_v[b, h])


def test_ragged_appends_relayout_and_bias_follow_the_entries():
    # a ragged layer (unequal lengths after evict, with bias): appends through several relayouts keep every
    # segment's entries and bias, appended entries get bias 0; checked against plain per-segment lists
    B, Hkv, D, N = 1, 4, 8, 40
    rc = RaggedKVCache(growth=1 / 8, min_spare=2)
    k0, v0 = _states(B, Hkv, N, D, 1)
    rc.update(k0, v0, 0)
    sizes = [0, 1, 17, 33]
    keep = random_keep([N] * 4, sizes, seed=3)
    bias = [torch.randn(s, generator=torch.Generator().manual_seed(7 + s)) for s in sizes]
    rc.evict(0, keep, bias)
    layer = rc.layers[0]
    assert layer.stride is None and layer.relayouts == 1
    spare = int(51 / 4 / 8)  # floor(growth * mean kept) = floor(12.75 / 8) = 1
    assert layer.caps == [s + spare for s in sizes]
    ref = [[k0[0, h, keep[h]], v0[0, h, keep[h]], bias[h]] for h in range(Hkv)]
    for step in range(12):
        L = 1 if step % 3 else 2
        k1, v1 = _states(B, Hkv, L, D, 50 + step)
        view, _ = rc.update(k1, v1, 0)
        for h in range(Hkv):
            ref[h] = [torch.cat([ref[h][0], k1[0, h]]), torch.cat([ref[h][1], v1[0, h]]),
                      torch.cat([ref[h][2], torch.zeros(L)])]
        assert view.host_lengths == [len(r[0]) for r in ref] and view.max_len == max(view.host_lengths)
    assert layer.relayouts >= 3  # several relayouts happened on the way
    for (k, v, b), (rk, rv, rb) in zip(_segments(layer), ref):
        assert torch.equal(k, rk) and torch.equal(v, rv) and torch.equal(b, rb)
    # slack: the buffers' unoccupied rows, K + V + bias
    assert rc.slack_bytes() == (layer.k.shape[0] - layer.entries()) * (2 * D * 4 + 4)
    assert rc.physical_bytes() == rc.nominal_bytes() + rc.slack_bytes() + layer.entries() * 4 + 2 * 8 * Hkv


def test_uniform_eviction_keeps_a_strided_layout():
    # the same budget everywhere: equal lengths and capacities, one [S, cap, D] strided layout
    B, Hkv, D, N = 2, 2, 8, 300
    rc = RaggedKVCache()
    k0, v0 = _states(B, Hkv, N, D, 2)
    rc.update(k0, v0, 0)
    keep = torch.stack([torch.stack(random_keep([N] * Hkv, [130] * Hkv, seed=b)) for b in range(B)])
    rc.evict(0, keep)
    layer = rc.layers[0]
    assert layer.caps == [132] * 4 and layer.stride == 132  # floor(130 / 64) = 2 spare rows
    assert rc.slack_bytes() == 4 * 2 * 2 * D * 4
    assert rc.slack_bytes() <= 0.02 * rc.physical_bytes()
    for b in range(B):
        for h in range(Hkv):
            k, v = layer.segment(b, h)
            assert torch.equal(k, k0[b, h, keep[b, h]]) and torch.equal(v, v0[b, h, keep[b, h]])


def test_cache_options_are_validated():
    with pytest.raises(InputError, match="growth"):
        RaggedKVCache(growth=-1)
    with pytest.raises(InputError, match="min_spare"):
        RaggedKVCache(min_spare=0)


# --- sliding-window layers (issue 18, item 2) ------------------------------------------------------


def test_window_layer_keeps_positions_and_at_most_its_window():
    # window W = 5, 4 segments; prefill 9 tokens, then 30 single-token appends through several relayouts:
    # before each append the entries at positions <= seen - W are dropped (a prefix, starts advance), so
    # each segment holds exactly the last W positions after the append; K/V follow their positions
    B, Hkv, D, W = 2, 2, 4, 5
    rc = RaggedKVCache(windows=[W, None])
    k0, v0 = _states(B, Hkv, 9, D, 0)
    rc.update(k0, v0, 0)
    rc.update(k0, v0, 1)
    win, full = rc.layers[0], rc.layers[1]
    assert win.window == W and full.window is None and full.pos is None
    assert win.segment_positions(0, 0).tolist() == list(range(9))  # the prompt's update trims nothing
    ks = [k0]
    for step in range(30):
        k1, v1 = _states(B, Hkv, 1, D, 50 + step)
        rc.update(k1, v1, 0)
        ks.append(k1)
        seen = 10 + step
        allk = torch.cat(ks, 2)
        for b in range(B):
            for h in range(Hkv):
                assert win.segment_positions(b, h).tolist() == list(range(seen - W, seen))
                assert torch.equal(win.segment(b, h)[0], allk[b, h, seen - W:])
    # physical rows after the relayouts (which copy only the W - 1 entries held + the appended one): at
    # most W + min_spare per segment, held + spare + the dead prefix rows the trims left since
    assert win.k.shape[0] <= B * Hkv * (W + win.min_spare) < B * Hkv * 39
    assert rc.relayouts() > 2 and win.stride is not None  # still one strided layout (starts advanced alike)
    assert rc.get_seq_length(0) == 39
    # positions are int32 on the CPU, counted in physical_bytes, and in slack_bytes for the unused rows
    assert win.pos.dtype == torch.int32 and win.pos.shape[0] == win.k.shape[0]
    assert win.physical_bytes() == (win.k.untyped_storage().nbytes() + win.v.untyped_storage().nbytes()
                                    + 4 * win.k.shape[0] + 2 * 8 * B * Hkv)
    assert win.slack_bytes() == (win.k.shape[0] - win.entries()) * (2 * D * 4 + 4)


def test_window_eviction_keeps_original_positions_then_trims():
    B, Hkv, D, W = 1, 2, 4, 6
    rc = RaggedKVCache(windows={0: W})
    k0, v0 = _states(B, Hkv, 10, D, 1)
    rc.update(k0, v0, 0)
    rc.evict(0, [torch.tensor([0, 5, 8]), torch.tensor([2, 3, 4, 9])])
    layer = rc.layers[0]
    assert layer.segment_positions(0, 0).tolist() == [0, 5, 8]
    assert layer.segment_positions(0, 1).tolist() == [2, 3, 4, 9]
    k1, v1 = _states(B, Hkv, 1, D, 2)
    rc.update(k1, v1, 0)  # at position 10: keys at positions > 10 - 6 = 4 stay
    assert layer.segment_positions(0, 0).tolist() == [5, 8, 10]
    assert layer.segment_positions(0, 1).tolist() == [9, 10]
    assert torch.equal(layer.segment(0, 1)[0], torch.cat([k0[0, 1, 9:], k1[0, 1]]))


def test_from_dense_sliding_layer_and_window_validation():
    B, Hkv, D, W = 1, 2, 4, 5
    dense = DynamicCache()
    dense.layers = [DynamicSlidingWindowLayer(sliding_window=W)]
    k0, v0 = _states(B, Hkv, 11, D, 3)
    dense.update(k0, v0, 0)  # holds the last W - 1 = 4 of 11 tokens
    rc = RaggedKVCache.from_dense(dense)
    layer = rc.layers[0]
    assert layer.window == W and rc.get_seq_length(0) == 11
    assert layer.segment_positions(0, 1).tolist() == [7, 8, 9, 10]
    assert torch.equal(layer.segment(0, 1)[0], k0[0, 1, 7:])
    with pytest.raises(InputError, match="sliding window must be a positive integer"):
        RaggedKVCache(windows=[0])
    with pytest.raises(InputError, match="given sliding window 5, its attention uses 7"):
        layer.set_window(7)
