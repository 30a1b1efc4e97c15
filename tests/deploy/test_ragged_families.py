"""The ragged cache and its attention function on every tiny model family (issue 18, item 2).

What evaluate's ``none`` policy runs (``prefill_context`` -> ``Prefill.ragged_cache`` ->
``greedy_answer`` with the ``forcedweight_ragged`` attention) must equal ``model.generate`` with
transformers' own attention and DynamicCache, token for token, on each family it supports. A family
feature the ragged attention does not implement is refused with one line naming it: a sliding window
shorter than the tokens processed, attention-logit soft-capping (Gemma 2), learned sinks (gpt-oss).
A windowed family whose window never bites (context + answer within the window) is supported.
"""

from __future__ import annotations

import pytest
import torch

from forcedweight import models
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate_protocol import greedy_answer
from forcedweight.deploy.prefill import prefill_context
from forcedweight.errors import InputError

W = models.TINY_WINDOW  # 12
WINDOWED = {"qwen2_sliding", "mistral", "gemma3", "phi3"}
REFUSED = {"gemma2": "soft-capping", "gpt_oss": "sinks"}
NEW = 4  # generated tokens


def _ids(n, seed=0):
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))


def _generate(model, ids, n):
    """transformers' own greedy generation (the family's default attention, DynamicCache)."""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[0, ids.shape[1]:].tolist()


def _ours(model, ids, n):
    """evaluate's ``none``: context prefill (all but the last token), ragged copy, greedy from the last."""
    ragged = use_ragged_attention(model)
    pre = prefill_context(ragged, None, ids[:, :-1])
    return greedy_answer(ragged, pre.ragged_cache(), ids[:, -1:], pre.n_tokens, n)


@pytest.mark.parametrize("family", [f for f in models.TINY_FAMILIES if f not in REFUSED])
def test_none_equals_generate(family, monkeypatch):
    monkeypatch.setattr("forcedweight.deploy.evaluate_protocol.eos_ids", lambda model: set())
    n_ctx = W - NEW - 1 if family in WINDOWED else 24  # windowed: context + answer within the window
    ids = _ids(n_ctx + 1, seed=3)
    ref = _generate(models.tiny_family_model(family, 1), ids, NEW)
    assert len(ref) == NEW
    assert _ours(models.tiny_family_model(family, 1), ids, NEW) == ref, family


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_window_shorter_than_the_tokens_is_refused(family):
    with pytest.raises(InputError, match=f"sliding window of {W} tokens"):
        _ours(models.tiny_family_model(family, 1), _ids(W + 8), NEW)
    # the window is reached while generating: refused at the first step beyond it
    with pytest.raises(InputError, match=f"sliding window of {W} tokens"):
        _ours(models.tiny_family_model(family, 1), _ids(W - 2), NEW)


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_softcap_and_sinks_are_refused(family):
    with pytest.raises(InputError, match=REFUSED[family]):
        _ours(models.tiny_family_model(family, 1), _ids(6), NEW)
