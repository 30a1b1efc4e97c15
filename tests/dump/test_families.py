"""Capture on the model families researchers use: every dumped row equals the family's own
eager attention probabilities (transformers' ``attn_implementation="eager"``,
``output_attentions=True``) for the same query, on tiny random models built from each family's
config (2 layers, 4 query heads over 2 KV heads, sliding window 12 tokens where the family has
one, texts longer than the window). Also: the kernel's key offset and soft-cap against a float64
brute force, the Triton path against the PyTorch path on a windowed soft-capped model, keys and
logits of windowed rows, the clean refusals, and ``dump --model DIR`` on saved family models."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from forcedweight import models
from forcedweight.dump import dump_rows
from forcedweight.dump.hook import LayerPlan, Recorder, _check_pattern, run_capture
from forcedweight.errors import InputError
from forcedweight.kernels.attention_stats import attention_rows_torch, attention_rows_triton

from tests.dump.masks import attention_module, causal

# Longer than the 12-token window (the byte tokenizer gives one token per byte): 70 tokens.
TEXT = "Sliding windows, soft caps and sinks: each family attends its own way."
W = models.TINY_WINDOW
# Dumped float32 weights vs the model's float32 eager probabilities: the two differ only by the
# float32 rounding of the scores and softmax (and, for families whose default is SDPA, of the
# earlier layers' outputs): measured at most 3.3e-7 over all families. Tolerance 1e-5 x the
# largest entry of the eager row (entries <= 1). A wrong window, scaling, cap or sink is off by
# 1e-2 or more (Mistral's ignored window: 0.08).
REL = 1e-5
SINK_FAMILIES = {"gpt_oss"}


def loaded(family: str, seed: int = 0, **overrides) -> models.LoadedModel:
    model = models.tiny_family_model(family, seed, **overrides)
    return models.LoadedModel(model, models.byte_tokenizer(), f"tiny-{family}", "memory")


def read_rows(out: Path) -> list[dict]:
    files = sorted(out.glob("rows-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("row_id").to_pylist()


def eager_attentions(model, token_ids):
    """The model's own eager attention probabilities: per layer (H_q, T, T) float64."""
    ref = copy.deepcopy(model)
    ref.config._attn_implementation = "eager"
    with torch.no_grad():
        out = ref(torch.tensor(token_ids)[None], output_attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


def expected_window(config, layer: int):
    """The sliding window of ``layer`` as the config declares it (None: full causal attention)."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return config.sliding_window if types[layer] == "sliding_attention" else None
    return getattr(config, "sliding_window", None)


def check_against_eager(model, out: Path, family: str) -> int:
    """Every row of the dump in ``out`` equals the eager row of the same (layer, head, position)."""
    rows = read_rows(out)
    token_ids = pq.read_table(out / "texts.parquet").column("token_ids").to_pylist()[0]
    att = eager_attentions(model, token_ids)
    cfg = model.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    t_len = len(token_ids)
    assert len(rows) == cfg.num_hidden_layers * cfg.num_attention_heads * (t_len - 1)  # all positions >= 1
    for r in rows:
        layer, head, t = r["layer"], r["head"], r["query_pos"]
        window = expected_window(cfg, layer)
        assert r["window"] == window
        n = t + 1 if window is None else min(window, t + 1)
        assert r["n_keys"] == n == len(r["weights"])
        assert r["kv_head"] == head // group  # GQA
        w = np.asarray(r["weights"], dtype=np.float64)
        if family in SINK_FAMILIES:
            # rows are renormalised over the keys; the sink's share of the model's softmax is recorded
            assert w.sum() == pytest.approx(1.0, abs=1e-6)
            assert 0 < r["sink_mass"] < 1
            w = w * (1.0 - r["sink_mass"])
        else:
            assert r["sink_mass"] is None
        got = np.zeros(t_len)
        got[t + 1 - n : t + 1] = w  # the row's keys are positions t - n + 1 .. t
        want = att[layer][head, t]
        err = np.abs(got - want).max()
        assert err <= REL * want.max(), f"{family} layer {layer} head {head} t {t}: error {err:.3g}"
    return len(rows)


@pytest.mark.parametrize("family", models.TINY_FAMILIES)
def test_rows_equal_eager_attention(family, tmp_path):
    lm = loaded(family)
    out = dump_rows(lm, [TEXT], tmp_path / "d", all_positions=True, progress=False, backend="torch")
    assert check_against_eager(lm.model, out, family) > 0
    rows = read_rows(out)
    windowed = [r for r in rows if r["window"] is not None]
    if any(expected_window(lm.model.config, layer) is not None for layer in range(2)):
        # the window bites: rows past it hold W keys, fewer than query_pos + 1
        assert max(r["query_pos"] for r in windowed) >= W and all(r["n_keys"] <= W for r in windowed)
    else:
        assert not windowed


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_rows_equal_eager_attention_when_run_eager(family, tmp_path):
    # the same families loaded with eager attention (the capture then wraps the eager function)
    lm = loaded(family, attn_implementation="eager")
    out = dump_rows(lm, [TEXT], tmp_path / "d", all_positions=True, progress=False, backend="torch")
    assert check_against_eager(lm.model, out, family) > 0


def test_a_multimodal_gemma3_dumps_its_language_model(tmp_path):
    # Gemma3ForConditionalGeneration keeps layers, heads and window in text_config: the dump read them
    # from the top-level config (AttributeError: no num_hidden_layers)
    import transformers

    from forcedweight.compat import attention_configs

    text = models.tiny_family_config("gemma3")
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                    image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    lm = models.LoadedModel(model, models.byte_tokenizer(), "tiny-gemma3-multimodal", "memory")
    out = dump_rows(lm, [TEXT], tmp_path / "d", all_positions=True, progress=False, backend="torch")
    rows = read_rows(out)
    token_ids = pq.read_table(out / "texts.parquet").column("token_ids").to_pylist()[0]
    ref = copy.deepcopy(model)
    for c in attention_configs(ref):
        c._attn_implementation = "eager"
    with torch.no_grad():
        att = [a[0].double().numpy() for a in ref(torch.tensor(token_ids)[None], output_attentions=True).attentions]
    tc = model.config.text_config
    assert len(rows) == tc.num_hidden_layers * tc.num_attention_heads * (len(token_ids) - 1)
    for r in rows:
        layer, head, t = r["layer"], r["head"], r["query_pos"]
        assert r["window"] == expected_window(tc, layer)
        got = np.zeros(len(token_ids))
        got[t + 1 - r["n_keys"] : t + 1] = r["weights"]
        want = att[layer][head, t]
        assert np.abs(got - want).max() <= REL * want.max()


def test_sink_mass_is_the_model_softmax_share(tmp_path):
    lm = loaded("gpt_oss")
    out = dump_rows(lm, [TEXT], tmp_path / "d", layers="1", heads="0", positions=5, progress=False)
    token_ids = pq.read_table(out / "texts.parquet").column("token_ids").to_pylist()[0]
    att = eager_attentions(lm.model, token_ids)
    for r in read_rows(out):
        # eager rows of gpt-oss sum to 1 - (the sink's share): float32 sums, 1e-6
        assert att[1][0, r["query_pos"]].sum() == pytest.approx(1.0 - r["sink_mass"], abs=1e-6)


def test_windowed_softcapped_keys_and_logits(tmp_path):
    lm = loaded("gemma2")
    cfg = lm.model.config
    out = dump_rows(lm, [TEXT], tmp_path / "d", layers="0", positions=6, with_keys=True, progress=False)
    scaling = cfg.query_pre_attn_scalar ** -0.5
    cap = cfg.attn_logit_softcapping
    rows = read_rows(out)
    assert rows and all(r["window"] == W for r in rows)
    for r in rows:
        n, d = r["n_keys"], cfg.head_dim
        keys = np.reshape(r["keys"], (n, d)).astype(np.float64)
        q = np.asarray(r["query"], dtype=np.float64)
        logits = np.asarray(r["logits"], dtype=np.float64)
        # the stored logits are the capped scores of the stored keys (float32: 1e-5 x cap)
        np.testing.assert_allclose(logits, cap * np.tanh(scaling * keys @ q / cap), rtol=0, atol=1e-5 * cap)
        assert np.abs(logits).max() < cap
        p = np.exp(logits - logits.max())
        np.testing.assert_allclose(r["weights"], p / p.sum(), rtol=0, atol=1e-6)


def test_triton_backend_matches_torch_on_window_and_softcap(tmp_path):
    lm = loaded("gemma2")
    # layer 0 is sliding and soft-capped; few rows: the Triton interpreter is slow
    kw = dict(layers="0", heads="1,2", positions=3, seed=1, stats_s=(2, 5), with_keys=True, progress=False)
    a = read_rows(dump_rows(lm, [TEXT], tmp_path / "a", backend="torch", **kw))
    b = read_rows(dump_rows(lm, [TEXT], tmp_path / "b", backend="triton", **kw))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert (x["layer"], x["head"], x["query_pos"], x["n_keys"], x["window"]) == (
            y["layer"], y["head"], y["query_pos"], y["n_keys"], y["window"])
        # float32 on both paths, summation order differs: 1e-6 on weights, 1e-5 on capped logits
        np.testing.assert_allclose(x["weights"], y["weights"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(x["logits"], y["logits"], rtol=0, atol=1e-5)
        assert x["values"] == y["values"] and x["keys"] == y["keys"]


@pytest.mark.parametrize("softcap", [None, 2.5])
def test_kernel_key_start_and_softcap_against_float64(softcap):
    g = torch.Generator().manual_seed(7)
    r, hkv, t, d = 8, 2, 29, 11
    q = torch.randn(r, d, generator=g)
    k = 2 * torch.randn(hkv, t, d, generator=g)
    kv = torch.randint(0, hkv, (r,), generator=g)
    n = torch.randint(1, 10, (r,), generator=g)
    start = torch.tensor([int(torch.randint(0, t - int(x) + 1, (1,), generator=g)) for x in n])
    start[0], n[0] = t - 9, 9  # a row ending at the last key
    s_values = [1, 3, 12]
    for fn in (attention_rows_torch, attention_rows_triton):
        w, lg, dropped = fn(q, k, kv, n, 0.4, s_values, key_start=start, softcap=softcap)
        for i in range(r):
            a, m = int(start[i]), int(n[i])
            ref = 0.4 * k[kv[i], a : a + m].double() @ q[i].double()
            if softcap is not None:
                ref = softcap * torch.tanh(ref / softcap)
            p = torch.softmax(ref, 0)
            # float32 scores of |score| <= ~30: 1e-5; weights 1e-6; padding exactly zero
            torch.testing.assert_close(lg[i, :m].double(), ref, rtol=0, atol=1e-5)
            torch.testing.assert_close(w[i, :m].double(), p, rtol=0, atol=1e-6)
            assert torch.all(w[i, m:] == 0)
            desc = torch.sort(p, descending=True).values
            for j, s in enumerate(s_values):
                assert float(dropped[i, j]) == pytest.approx(float(desc[s:].sum()), abs=1e-6)


def test_bidirectional_attention_is_refused(tmp_path):
    lm = loaded("gemma3", use_bidirectional_attention=True)
    with pytest.raises(InputError, match=r"layer 0 \(Gemma3Attention\): bidirectional attention is not supported"):
        dump_rows(lm, [TEXT], tmp_path / "d", positions=2, progress=False)
    assert not list((tmp_path / "d").glob("rows-*.parquet"))


def test_mask_pattern_check():
    t = 10
    mod = attention_module(3)
    _check_pattern(mod, causal(t)[None, None], "sdpa", t, None, "cpu")  # causal: accepted
    _check_pattern(mod, causal(t, 4)[None, None], "sdpa", t, 4, "cpu")  # causal within the window
    _check_pattern(mod, None, "sdpa", t, 12, "cpu")  # SDPA's is_causal, window longer than the text
    neg = torch.finfo(torch.float32).min
    additive = torch.zeros(t, t).masked_fill(~causal(t, 4), neg)[None, None]
    _check_pattern(mod, additive, "eager", t, 4, "cpu")  # eager's additive mask
    with pytest.raises(InputError, match="layer 3 .* not causal with a 4-token sliding window"):
        _check_pattern(mod, causal(t)[None, None], "sdpa", t, 4, "cpu")  # window claimed, mask full
    chunked = causal(t) & ((torch.arange(t)[:, None] // 4) == (torch.arange(t)[None, :] // 4))
    with pytest.raises(InputError, match="not causal"):
        _check_pattern(mod, chunked[None, None], "sdpa", t, None, "cpu")  # chunked attention
    with pytest.raises(InputError, match="adds a bias"):
        bias = additive - 0.5 * torch.arange(t, dtype=torch.float32)[None, :]  # ALiBi-like slope
        _check_pattern(mod, bias.masked_fill(~causal(t, 4), neg), "eager", t, 4, "cpu")
    with pytest.raises(InputError, match="no attention mask"):
        _check_pattern(mod, None, "sdpa", t, 4, "cpu")  # a window shorter than the text needs a mask
    with pytest.raises(InputError, match="no attention mask"):
        _check_pattern(mod, None, "eager", t, None, "cpu")  # eager without a mask is not causal


def test_refused_keyword_features():
    lm = loaded("llama")
    attn = lm.model.model.layers[0].self_attn
    original = attn.forward

    def chunked_forward(*args, **kwargs):  # a layer passing a chunk size to its attention function
        return original(*args, attention_chunk_size=4, **kwargs)

    attn.forward = chunked_forward
    rec = Recorder(plans={0: LayerPlan(np.array([0]), np.array([3]))}, sink=lambda cap: None)
    with pytest.raises(InputError, match="layer 0 .*: chunked attention is not supported"):
        run_capture(lm.model, torch.arange(3, 12), rec)


FORCEDWEIGHT_ARGS = ["--all-positions", "--no-progress", "--device", "cpu"]


@pytest.mark.parametrize("family", ["qwen2_sliding", "gemma2", "gpt_oss"])
def test_cli_dump_model_directory(family, tmp_path, monkeypatch, capsys):
    from forcedweight.cli import main

    model_dir = models.save_tiny_family_model(tmp_path / "m", family, seed=2)
    assert (model_dir / "config.json").exists() and list(model_dir.glob("*.safetensors"))
    (tmp_path / "t.txt").write_text(TEXT)
    out = tmp_path / "o"
    monkeypatch.setattr(sys, "argv", ["forcedweight", "dump", "--out", str(out), "--model", str(model_dir),
                                      "--text-file", str(tmp_path / "t.txt"), *FORCEDWEIGHT_ARGS])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == str(out)
    reloaded = models.load_model(model_dir)  # compare with the model as loaded from the directory
    assert type(reloaded.model).__name__ == type(models.tiny_family_model(family)).__name__
    assert check_against_eager(reloaded.model, out, family) > 0


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_dump_model_gguf(family, tmp_path, monkeypatch, capsys):
    from forcedweight.cli import main

    gguf_path = models.save_tiny_gguf(tmp_path / f"{family}.gguf", family, seed=4)
    (tmp_path / "t.txt").write_text(TEXT)
    out = tmp_path / "o"
    monkeypatch.setattr(sys, "argv", ["forcedweight", "dump", "--out", str(out), "--model", str(gguf_path),
                                      "--text-file", str(tmp_path / "t.txt"), *FORCEDWEIGHT_ARGS])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    reloaded = models.load_model(gguf_path)
    assert check_against_eager(reloaded.model, out, family) > 0
    # the GGUF holds the same model: its rows equal those of the model built in memory (float32: 1e-6)
    same = models.tiny_family_model(family, 4, **models._GGUF_OVERRIDES.get(family, {}))
    ref = dump_rows(models.LoadedModel(same, models.byte_tokenizer(), "mem", "memory"), [TEXT], tmp_path / "r",
                    all_positions=True, progress=False)
    a, b = read_rows(out), read_rows(ref)
    assert len(a) == len(b) and [r["n_keys"] for r in a] == [r["n_keys"] for r in b]
    assert max(np.abs(np.subtract(x["weights"], y["weights"])).max() for x, y in zip(a, b)) <= 1e-6
