"""forcedweight dump: captured rows against an independent float64 recomputation, GQA mapping,
row ids, position sampling, the dropped-mass statistics (PyTorch path vs NumPy, Triton kernel in
interpret mode vs PyTorch), resume after a kill, refused option changes and bad inputs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from forcedweight import models, rows
from forcedweight.dump import builtin_texts, dump_rows, parse_index_list, read_text_files, read_texts_table
from forcedweight.dump.capture import sample_positions
from forcedweight.dump.corpus import builtin_genres
from forcedweight.dump.hook import LayerPlan, Recorder, run_capture
from forcedweight.kernels.attention_stats import attention_rows_torch, attention_rows_triton, dropped_mass_torch
from forcedweight.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
FORCEDWEIGHT = [sys.executable, "-c", "from forcedweight.cli import main; main()"]

# Float32 capture vs float64 recomputation from the same weights and token ids. Float32 rounding
# through the layers leaves errors proportional to the magnitude of each array (hidden states,
# hence q/k/v and scores): measured on SmolLM2 layers 0-20 at most 3e-6 x max|array| for
# weights, values, keys, queries and scores. Tolerance: 1e-5 x max|array| (3x margin). A wrong
# row, head, KV head or position is off by O(max|array|).
REL = 1e-5

TEXTS = [
    "Attention rows: a query attends to every earlier key.",
    "Short.",
    "The third text is the longest of the three, so that its rows see more keys than the others do.",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # 4 query heads over 2 KV heads: GQA with groups of 2.
    return models.save_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=3, layers=3, heads=4, kv_heads=2,
                                  head_dim=16, max_positions=128)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return models.load_model(tiny_dir)


def read_dump(out: Path, kind: str = "rows") -> pa.Table:
    files = sorted(out.glob(f"{kind}-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).sort_by("row_id")


def recompute_float64(m64, token_ids, layers):
    """Independent float64 q, k, v of some layers: the model's own modules, no capture function.

    ``m64`` is a float64 copy of the model, run with its default attention; the input of each
    layer's attention is taken from a forward hook on its ``input_layernorm``, then projected,
    and the model's RoPE (``rotary_emb`` + ``apply_rotary_pos_emb``) applied by hand.
    Returns layer -> (q (Hq, T, d), k (Hkv, T, d), v (Hkv, T, d)) as float64 numpy arrays.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cfg = m64.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    got, handles = {}, []
    for layer in layers:
        norm = m64.model.layers[layer].input_layernorm
        handles.append(norm.register_forward_hook(lambda mod, inp, out, layer=layer: got.__setitem__(layer, out)))
    ids = torch.tensor(token_ids)[None]
    t = ids.shape[1]
    out = {}
    with torch.no_grad():
        try:
            m64.model(input_ids=ids, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        cos, sin = m64.model.rotary_emb(got[layers[0]], torch.arange(t)[None])
        for layer in layers:
            h, att = got[layer], m64.model.layers[layer].self_attn
            q = att.q_proj(h).view(1, t, -1, d).transpose(1, 2)
            k = att.k_proj(h).view(1, t, -1, d).transpose(1, 2)
            v = att.v_proj(h).view(1, t, -1, d).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            out[layer] = (q[0].numpy(), k[0].numpy(), v[0].numpy())
    return out


def assert_close_scaled(got, want, rel):
    """max |got - want| <= rel * max |want|: float32 errors scale with the array's magnitude."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= rel * scale, f"max error {err:.3g} > {rel:g} x {scale:.3g}"


def check_rows_against_float64(hf_model, out: Path, with_keys: bool):
    """Every dumped row equals softmax(q k^T / sqrt(d)) recomputed in float64 from texts.parquet."""
    table = read_dump(out).to_pylist()
    texts = pq.read_table(out / "texts.parquet").to_pylist()
    cfg = hf_model.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    m64 = copy.deepcopy(hf_model).to(torch.float64)
    checked = 0
    for text in texts:
        mine = [r for r in table if r["text_id"] == text["text_id"]]
        layers = sorted({r["layer"] for r in mine})
        if not layers:
            continue
        qkv = recompute_float64(m64, text["token_ids"], layers)
        for r in mine:
            q, k, v = qkv[r["layer"]]
            d = q.shape[-1]
            h, t = r["head"], r["query_pos"]
            assert r["kv_head"] == h // group  # GQA: consecutive query heads share a KV head
            assert r["n_keys"] == t + 1 == len(r["weights"])
            kv = k[h // group, : t + 1]
            logits = kv @ q[h, t] / np.sqrt(d)
            p = np.exp(logits - logits.max())
            p /= p.sum()
            assert_close_scaled(r["weights"], p, REL)
            assert_close_scaled(np.reshape(r["values"], (t + 1, d)), v[h // group, : t + 1], REL)
            if with_keys:
                assert_close_scaled(np.reshape(r["keys"], (t + 1, d)), kv, REL)
                assert_close_scaled(r["query"], q[h, t], REL)
                assert_close_scaled(r["logits"], logits, REL)
            checked += 1
    return checked


def test_rows_equal_float64_recomputation_with_gqa(tiny, tmp_path):
    out = dump_rows(tiny, TEXTS, tmp_path / "d", positions=3, seed=5, with_keys=True, stats_s=(2, 5), progress=False)
    table = read_dump(out)
    assert table.column("row_id").to_pylist() == list(range(table.num_rows))  # running count, no gaps
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["n_rows"] == table.num_rows
    # 3 layers x 4 heads x min(3, T - 1) positions per text
    n_tokens = [len(t) for t in pq.read_table(out / "texts.parquet").column("token_ids").to_pylist()]
    assert table.num_rows == sum(3 * 4 * min(3, n - 1) for n in n_tokens)
    assert set(table.column("kv_head").to_pylist()) == {0, 1}
    assert check_rows_against_float64(tiny.model, out, with_keys=True) == table.num_rows
    # every row passes the row contract
    assert sum(1 for _ in rows.iter_rows(out)) == table.num_rows


def test_stats_dropped_mass_matches_numpy(tiny, tmp_path):
    out = dump_rows(tiny, TEXTS, tmp_path / "d", layers="1", positions=6, stats_s=(1, 3, 40), progress=False)
    table, stats = read_dump(out), read_dump(out, "stats")
    assert stats.column("row_id").to_pylist() == table.column("row_id").to_pylist()
    for w, s1, s3, s40 in zip(table.column("weights").to_pylist(), *(stats.column(f"dropped_mass_s{s}").to_pylist()
                                                                      for s in (1, 3, 40))):
        desc = np.sort(np.asarray(w, dtype=np.float64))[::-1]
        # same float32 weights summed in float64 in another order: agreement to 1e-12
        for s, got in ((1, s1), (3, s3), (40, s40)):
            assert got == pytest.approx(desc[s:].sum(), abs=1e-12)
            assert got == pytest.approx(1.0 - desc[:s].sum(), abs=1e-6)  # float32 weights sum to 1 within ~1e-7


@pytest.mark.parametrize("r,hkv,t,d,block_k", [(1, 1, 1, 1, 1), (5, 3, 17, 7, 4), (9, 2, 33, 13, 8), (4, 1, 64, 64, 64)])
def test_triton_kernel_interpret_matches_torch_path(r, hkv, t, d, block_k):
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest before the kernel was defined
    g = torch.Generator().manual_seed(r * 100 + t)
    q = torch.randn(r, d, generator=g)
    k = 2 * torch.randn(hkv, t, d, generator=g)
    kv = torch.randint(0, hkv, (r,), generator=g)
    n = torch.randint(1, t + 1, (r,), generator=g)
    n[0] = t  # one full row
    s_values = [1, 2, 5, t + 3]  # includes s >= N (dropped mass 0)
    w1, l1, d1 = attention_rows_triton(q, k, kv, n, 0.37, s_values, block_k=block_k)
    w2, l2, d2 = attention_rows_torch(q, k, kv, n, 0.37, s_values)
    # both in float32; scores differ by summation order (~1e-7 relative of |score| <= ~30)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w1, w2, rtol=1e-5, atol=1e-6)
    # tail sums of float32 weights: kernel sums in float32, torch path in float64
    torch.testing.assert_close(d1, d2, rtol=0, atol=1e-6)
    assert torch.all(w1[torch.arange(t)[None, :] >= n[:, None]] == 0)
    assert torch.all(d1[:, -1] == 0)


def test_torch_path_dropped_mass_brute_force():
    g = torch.Generator().manual_seed(0)
    w = torch.rand(6, 11, generator=g)
    w[2, 7:] = 0  # padded row
    got = dropped_mass_torch(w, [1, 4, 11, 20]).numpy()
    for i in range(6):
        row = w[i].double().numpy()
        for j, s in enumerate([1, 4, 11, 20]):
            assert got[i, j] == pytest.approx(row.sum() - np.sort(row)[::-1][:s].sum(), abs=1e-12)


def test_triton_backend_dump_matches_torch_backend(tiny, tmp_path):
    kw = dict(layers="0,2", heads="1,2", positions=2, stats_s=(2, 4), with_keys=True, progress=False)
    a = dump_rows(tiny, TEXTS[:1], tmp_path / "torch", backend="torch", **kw)
    b = dump_rows(tiny, TEXTS[:1], tmp_path / "triton", backend="triton", **kw)
    ta, tb = read_dump(a), read_dump(b)
    # values, keys, queries and provenance are bit-identical (the layer outputs do not depend on the backend)
    assert ta.drop_columns(["weights", "logits"]).equals(tb.drop_columns(["weights", "logits"]))
    for col, tol in (("weights", 1e-6), ("logits", 1e-5)):  # float32 rounding of two summation orders
        for x, y in zip(ta.column(col).to_pylist(), tb.column(col).to_pylist()):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=tol)
    sa, sb = read_dump(a, "stats"), read_dump(b, "stats")
    for c in ("dropped_mass_s2", "dropped_mass_s4"):
        np.testing.assert_allclose(sa.column(c).to_numpy(), sb.column(c).to_numpy(), atol=1e-6)


def test_capture_layer_output_equals_plain_forward(tiny):
    """With the capture active the decoder computes exactly what a plain SDPA forward computes."""
    net = tiny.model
    ids = torch.tensor(tiny.tokenizer(TEXTS[2])["input_ids"])
    with torch.no_grad():
        ref = net.model(input_ids=ids[None], use_cache=False).last_hidden_state
    seen = []
    plans = {l: LayerPlan(np.array([0, 3]), np.array([1, len(ids) - 1])) for l in range(3)}
    rec = Recorder(plans=plans, sink=seen.append, stop_early=False)
    got = {}
    handle = net.model.norm.register_forward_hook(lambda m, i, o: got.__setitem__("h", o))
    try:
        run_capture(net, ids, rec)
    finally:
        handle.remove()
    assert [c.layer for c in seen] == [0, 1, 2]
    assert torch.equal(got["h"], ref)  # bit-identical: the capture never changes the forward pass
    assert net.config._attn_implementation != "forcedweight_capture"  # restored


def test_positions_reproducible_and_independent_of_selection(tiny, tmp_path):
    p = sample_positions(7, 2, 1, 3, 50, 4, False)
    assert p.tolist() == sample_positions(7, 2, 1, 3, 50, 4, False).tolist()
    assert len(set(p.tolist())) == 4 and p.min() >= 1 and p.max() <= 49
    assert sample_positions(7, 2, 1, 3, 3, 4, False).tolist() == [1, 2]  # fewer candidates than K
    assert sample_positions(7, 2, 1, 3, 1, 4, False).size == 0  # a one-token text has no rows
    a = read_dump(dump_rows(tiny, TEXTS, tmp_path / "a", layers="0,1", seed=9, progress=False))
    b = read_dump(dump_rows(tiny, TEXTS, tmp_path / "b", layers="1", heads="2,3", seed=9, progress=False))
    key = ["text_id", "layer", "head", "query_pos"]
    a_rows = {tuple(r[k] for k in key): r["weights"] for r in a.to_pylist()}
    for r in b.to_pylist():
        assert a_rows[tuple(r[k] for k in key)] == r["weights"]  # same position, bit-identical capture


def test_all_positions(tiny, tmp_path):
    out = dump_rows(tiny, TEXTS[:2], tmp_path / "d", layers="2", heads="0", all_positions=True, progress=False)
    t = read_dump(out)
    n_tokens = [len(x) for x in pq.read_table(out / "texts.parquet").column("token_ids").to_pylist()]
    expected = [(i, p) for i, n in enumerate(n_tokens) for p in range(1, n)]
    assert list(zip(t.column("text_id").to_pylist(), t.column("query_pos").to_pylist())) == expected


def run_cli(*args, env=None, timeout=120):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(FORCEDWEIGHT + list(args), capture_output=True, text=True, env=full_env, cwd=ROOT,
                          timeout=timeout)


def test_resume_after_kill_gives_uninterrupted_rows(tiny_dir, tiny, tmp_path):
    files = []
    for i, text in enumerate(TEXTS):
        files += ["--text-file", str(tmp_path / f"t{i}.txt")]
        (tmp_path / f"t{i}.txt").write_text(text)
    args = ["dump", "--out", str(tmp_path / "killed"), "--model", str(tiny_dir), *files, "--positions", "2",
            "--stats-s", "3", "--with-keys", "--no-progress"]
    # simulate kill -9 right after the first shard lands (os._exit: no cleanup, no final manifest)
    first = run_cli(*args, env={"FORCEDWEIGHT_DUMP_EXIT_AFTER_SHARDS": "1"})
    assert first.returncode == 137, first.stderr
    assert len(list((tmp_path / "killed").glob("rows-*.parquet"))) == 1
    assert not json.loads((tmp_path / "killed" / "manifest.json").read_text())["complete"]
    (survivor,) = (tmp_path / "killed").glob("rows-*.parquet")
    stamp = survivor.stat().st_mtime_ns
    # a kill in the middle of a write leaves only a hidden temporary file, never a partial shard
    (tmp_path / "killed" / ".rows-t000001-l000.parquet.abc123.tmp").write_bytes(b"PAR1 truncated")
    # rerun with the same arguments (in-process, to keep the test fast: same library call as the CLI)
    texts = read_text_files([tmp_path / f"t{i}.txt" for i in range(len(TEXTS))])
    kw = dict(positions=2, stats_s=(3,), with_keys=True, progress=False)
    dump_rows(str(tiny_dir), texts, tmp_path / "killed", **kw)
    full = dump_rows(tiny, TEXTS, tmp_path / "full", **kw)
    assert survivor.stat().st_mtime_ns == stamp  # finished shards are skipped, not rewritten
    for kind in ("rows", "stats"):
        got, want = read_dump(tmp_path / "killed", kind), read_dump(full, kind)
        assert got.num_rows == want.num_rows and got.equals(want)
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == sorted(p.name for p in full.iterdir())


def test_a_dump_missing_a_shard_is_refused(tiny, tmp_path):
    # its manifest says complete: a deleted shard used to be certified as if the dump held only the rest
    from forcedweight.certify import CertifyOptions, certify_file
    from forcedweight.rows import load_rows

    out = dump_rows(tiny, TEXTS[:2], tmp_path / "d", layers="0,1", progress=False)
    assert load_rows(out).collect().height == 2 * 2 * 4 * 4  # texts x layers x heads x positions
    sorted(out.glob("rows-*.parquet"))[-1].unlink()
    for read in (lambda: load_rows(out), lambda: certify_file(out, tmp_path / "r.parquet", [2], CertifyOptions())):
        with pytest.raises(InputError, match="damaged dump: manifest.json says 64 rows, its row shards hold 48"):
            read()


def test_rerun_with_other_options_is_refused(tiny, tmp_path):
    out = dump_rows(tiny, TEXTS[:1], tmp_path / "d", layers="0", progress=False)
    before = sorted(p.name for p in out.iterdir())
    dump_rows(tiny, TEXTS[:1], out, layers="0", progress=False)  # same options: a no-op resume
    with pytest.raises(InputError, match="different options"):
        dump_rows(tiny, TEXTS[:1], out, layers="0,1", progress=False)
    with pytest.raises(InputError, match="different texts"):
        dump_rows(tiny, TEXTS[:2], out, layers="0", progress=False)
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(layers="0,3"), "--layers: layer 3 out of range"),
        (dict(heads="4"), "--heads: head 4 out of range"),
        (dict(layers="1-x"), "--layers: cannot parse"),
        (dict(texts=["x" * 200]), "text 0 .* 200 tokens exceeds the model's context of 128"),
        (dict(stats_s=(0,)), "--stats-s"),
        (dict(texts=["x", ""]), "no text has 2 or more tokens"),  # rows start at query position 1
        (dict(model="missing-dir"), "--model: .*missing-dir"),
    ],
)
def test_bad_inputs_fail_before_writing(tiny, tmp_path, kwargs, needle):
    model = kwargs.pop("model", tiny)
    if model != tiny:
        model = str(tmp_path / model)
    texts = kwargs.pop("texts", TEXTS)
    with pytest.raises(InputError, match=needle):
        dump_rows(model, texts, tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_unwritable_output(tiny, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(InputError, match="--out: .*file"):
        dump_rows(tiny, TEXTS, tmp_path / "file", progress=False)
    with pytest.raises(InputError, match="--out: .*sub: cannot write output .*file is not a directory"):
        dump_rows(tiny, TEXTS, tmp_path / "file" / "sub", progress=False)


def test_cli_bad_layer_is_one_line_exit_2(tiny_dir, tmp_path, monkeypatch, capsys):
    from forcedweight.cli import main

    (tmp_path / "t.txt").write_text(TEXTS[0])
    monkeypatch.setattr(sys, "argv", ["forcedweight", "dump", "--out", str(tmp_path / "o"), "--model", str(tiny_dir),
                                      "--text-file", str(tmp_path / "t.txt"), "--layers", "0,7", "--no-progress"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --layers: layer 7 out of range (the model has 3 layers: 0..2)"
    assert not (tmp_path / "o").exists()


def test_parse_index_list():
    assert parse_index_list("0,3,5-7", "--layers") == [0, 3, 5, 6, 7]
    assert parse_index_list(" 2 , 2,1", "--heads") == [1, 2]
    assert parse_index_list(None, "--layers") is None
    with pytest.raises(InputError, match="--heads: empty range"):
        parse_index_list("5-3", "--heads")
    with pytest.raises(InputError, match="--layers: '0-99999999999' reaches index 99999999999"):
        parse_index_list("0-99999999999", "--layers")  # refused before the range is built (it filled the memory)


def test_text_readers(tmp_path):
    (tmp_path / "a.txt").write_text("first text")
    assert read_text_files([tmp_path / "a.txt"]) == ["first text"]
    with pytest.raises(InputError, match="--text-file: .*nope.txt"):
        read_text_files([tmp_path / "nope.txt"])
    pq.write_table(pa.table({"id": [1, 2], "text": ["x y", "z"]}), tmp_path / "t.parquet")
    assert read_texts_table(tmp_path / "t.parquet") == ["x y", "z"]
    (tmp_path / "t.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "other": 1}\n')
    assert read_texts_table(tmp_path / "t.jsonl") == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"txt": "two"}\n')
    with pytest.raises(InputError, match="bad.jsonl:2"):
        read_texts_table(tmp_path / "bad.jsonl")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "nocol.parquet")
    with pytest.raises(InputError, match="no 'text' column"):
        read_texts_table(tmp_path / "nocol.parquet")


def test_builtin_corpus_genres():
    texts, genres = builtin_texts(), builtin_genres()
    assert len(texts) == len(genres) >= 6 and len(set(genres)) == len(genres)
    assert {"narrative", "technical", "dialogue", "news", "code", "poetry"} <= set(genres)
    assert len(set(texts)) == len(texts) and all(len(t) > 400 for t in texts)


# ------------------------------------------------------------------------------ real SmolLM2


@pytest.mark.smollm2
def test_smollm2_rows_equal_float64_recomputation(smollm2, tmp_path):
    cfg = smollm2.model.config
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3)
    text = builtin_texts()[2][:300]  # a short piece of the dialogue passage
    out = dump_rows(smollm2, [text], tmp_path / "d", layers="0,5", positions=2, seed=1, with_keys=True,
                    stats_s=(8,), progress=False)
    table = read_dump(out)
    assert table.num_rows == 2 * 9 * 2
    assert sorted(set(zip(table.column("head").to_pylist(), table.column("kv_head").to_pylist()))) == [
        (h, h // 3) for h in range(9)
    ]
    assert check_rows_against_float64(smollm2.model, out, with_keys=True) == table.num_rows
    stats = read_dump(out, "stats")
    for w, got in zip(table.column("weights").to_pylist(), stats.column("dropped_mass_s8").to_pylist()):
        assert got == pytest.approx(np.sort(np.asarray(w, dtype=np.float64))[::-1][8:].sum(), abs=1e-12)
    # the built-in corpus is "a few thousand tokens" with the real tokenizer
    n_tokens = sum(len(smollm2.tokenizer(t)["input_ids"]) for t in builtin_texts())
    assert 2000 <= n_tokens <= 6000


def test_out_of_range_layers_fail_before_the_model_loads(tiny_dir, tmp_path, monkeypatch):
    """A --layers/--heads outside the model is refused from its config, before any weights load."""
    from forcedweight import models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", no_load)
    with pytest.raises(InputError, match=r"--layers: layer 7 out of range \(the model has 3 layers"):
        dump_rows(str(tiny_dir), TEXTS, tmp_path / "out", layers="0,7", progress=False)
    with pytest.raises(InputError, match=r"--heads: head 99 out of range"):
        dump_rows(str(tiny_dir), TEXTS, tmp_path / "out", heads="99", progress=False)
    assert models.peek_architecture(tiny_dir)[0] == 3
    assert not (tmp_path / "out").exists()


@pytest.mark.smollm2
def test_the_embedded_gguf_architecture_is_read_from_its_metadata():
    from forcedweight import models

    assert models.peek_architecture() == (30, 9)  # SmolLM2-135M: 30 layers, 9 query heads
