"""Bounded-memory pieces of the capture (issue 15, long rows): the mask check in blocks of query
rows, and the Parquet batches of a layer built one at a time."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from forcedweight.dump import capture, hook
from forcedweight.dump.hook import LayerCapture, _check_pattern
from forcedweight.errors import InputError

from tests.dump.masks import attention_module, causal


@pytest.mark.parametrize("rows", [1, 3, 4, 1024])
def test_blocked_mask_check_accepts_and_refuses_like_the_whole_mask(monkeypatch, rows):
    monkeypatch.setattr(hook, "_CHECK_ROWS", rows)
    t, mod = 11, attention_module(5)
    neg = torch.finfo(torch.float32).min
    _check_pattern(mod, causal(t)[None, None], "sdpa", t, None, "cpu")
    _check_pattern(mod, torch.zeros(t, t).masked_fill(~causal(t, 4), neg)[None, None], "eager", t, 4, "cpu")
    _check_pattern(mod, causal(t).expand(3, t, t)[None], "sdpa", t, None, "cpu")  # same mask on 3 heads
    # one wrong entry, in the last block: refused whatever the block size
    bad = causal(t).clone()
    bad[t - 1, 0] = False
    with pytest.raises(InputError, match="layer 5 .* not causal"):
        _check_pattern(mod, bad[None, None], "sdpa", t, None, "cpu")
    heads = causal(t).expand(2, t, t).clone()
    heads[1, t - 1, 1] = False
    with pytest.raises(InputError, match="differs across heads"):
        _check_pattern(mod, heads[None], "sdpa", t, None, "cpu")
    bias = torch.zeros(t, t).masked_fill(~causal(t), neg)
    bias[t - 1, 2] = -0.5
    with pytest.raises(InputError, match="adds a bias"):
        _check_pattern(mod, bias[None, None], "eager", t, None, "cpu")
    with pytest.raises(InputError, match="not causal"):
        _check_pattern(mod, causal(t + 1)[None, None, :t], "sdpa", t + 1, None, "cpu")  # rows != t


def _capture(seed=0, r=7, t=13, d=3, hkv=2):
    rng = np.random.default_rng(seed)
    pos = np.sort(rng.choice(np.arange(1, t), size=r, replace=False))
    n = pos + 1
    w = np.zeros((r, t), np.float32)
    for i in range(r):
        x = rng.random(n[i]).astype(np.float32)
        w[i, : n[i]] = x / x.sum()
    return LayerCapture(layer=2, heads=np.arange(r) % 4, kv_heads=(np.arange(r) % 4) // 2, positions=pos,
                        weights=w, values=rng.normal(size=(hkv, t, d)).astype(np.float32),
                        keys=rng.normal(size=(hkv, t, d)).astype(np.float32),
                        queries=rng.normal(size=(r, d)).astype(np.float32),
                        logits=rng.normal(size=(r, t)).astype(np.float32))


def test_batches_are_built_lazily_and_give_the_same_rows(monkeypatch):
    cap = _capture()
    schema, one = capture.capture_table(cap, 4, 100, "m", True)
    whole = pa.Table.from_batches(list(one), schema=schema)
    monkeypatch.setattr(capture, "_MAX_BATCH_VALUES", 20)  # a few rows per batch
    schema2, gen = capture.capture_table(cap, 4, 100, "m", True)
    assert not isinstance(gen, list)  # a generator: batches are built as they are written
    parts = list(gen)
    assert len(parts) > 2 and sum(b.num_rows for b in parts) == len(cap.heads)
    assert pa.Table.from_batches(parts, schema=schema2).equals(whole)
    # each row's values are that row's keys 0..n-1 of its KV head (float32, exact)
    vals = whole.column("values").to_pylist()
    for i in range(len(cap.heads)):
        n = cap.positions[i] + 1
        assert np.array_equal(np.asarray(vals[i], np.float32), cap.values[cap.kv_heads[i], :n].ravel())
