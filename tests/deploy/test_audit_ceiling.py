"""Selection ceiling (issue 13): top-mass at s = all keys is full attention (same greedy tokens as an
independent eager run); the certified best set is never worse than top-mass on any row (E recomputed
here in float64); the targeted switch is balancing exactly where top-mass drops more than the threshold."""

from __future__ import annotations

import numpy as np
import pytest

from forcedweight.deploy.audit.ceiling import ceiling_example, check_options, choose
from forcedweight.deploy.evaluate_protocol import continuation_nll, greedy_answer, prompt_ids
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import copy_dense_cache, prefill_context
from forcedweight.errors import InputError
from forcedweight.models import byte_tokenizer, tiny_llama

CONTEXT = "the cat sat on the mat while the dog ran to the park and the bird sang a song " * 2
EX = {"id": "q", "task": "niah_single_1", "context": CONTEXT, "question": " Where did the dog run? ",
      "answer_prefix": " A:", "answer": ["park"], "max_new_tokens": 6}
CONT = {"id": "c", "task": "continuation", "context": CONTEXT, "question": "", "answer_prefix": "",
        "answer": [" the cat sat on the mat again"], "max_new_tokens": 0}


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(3, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=300), byte_tokenizer()


def _forced_error(p, V, S):
    """Independent float64: ||sum_S p v / p(S) - sum p v||."""
    m = p[S] @ V[S] / p[S].sum()
    return float(np.linalg.norm(m - p @ V))


def test_top_mass_at_all_keys_is_full_attention(tiny):
    model, tok = tiny
    rows, steps = ceiling_example(model, tok, EX, [0, 1], [100_000], ["top"])
    full, top = rows
    assert full["method"] == "full" and top["method"] == "top"
    # an independent greedy run: the eager attention of transformers over a plain dense cache
    prompt = prompt_ids(tok, EX, False)
    pre = prefill_context(model, tok, prompt.context)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        ids = greedy_answer(model, copy_dense_cache(pre.cache, model), prompt.question, pre.n_tokens, EX["max_new_tokens"])
    finally:
        model.set_attn_implementation(previous)
    eager = tok.decode(ids, skip_special_tokens=True)
    assert top["answer"] == full["answer"] == eager
    # every row of both layers and every head was restricted, keeping all its keys: error 0
    n_rows = prompt.question.shape[1] + len(ids) - 1
    assert len(steps) == n_rows * 2 * 4 and top["rows"] == len(steps)
    assert all(r["kept"] == r["n_keys"] and r["error"] == 0.0 for r in steps)


def test_a_soft_capped_layer_is_refused():
    # the restricted rows are plain softmax: on a soft-capped layer top-mass at every key differed from
    # the model's own attention (CE 5.7149 against 5.7110 at cap 1)
    from forcedweight.models import tiny_family_model

    model = tiny_family_model("gemma2", 0)
    with pytest.raises(InputError, match="layer 1 has attention-logit soft-cap"):
        ceiling_example(model, byte_tokenizer(), CONT, [1], [100_000], ["top"])


def test_continuation_ce_top_at_all_keys_equals_full(tiny):
    model, tok = tiny
    rows, _ = ceiling_example(model, tok, CONT, [0, 1], [100_000], ["top"])
    full, top = rows
    prompt = prompt_ids(tok, CONT, False)
    pre = prefill_context(model, tok, prompt.context)
    ref = continuation_nll(model, copy_dense_cache(pre.cache, model), pre.logits_last, prompt.continuation, pre.n_tokens)
    assert full["ce"] == pytest.approx(ref, abs=1e-4) and top["ce"] == pytest.approx(ref, abs=1e-4)


def test_best_never_worse_than_top_on_any_row(tiny):
    model, tok = tiny
    s = 6
    rows, steps = ceiling_example(model, tok, EX, [1], [s], ["top", "best", "balancing"], time_limit=0.2,
                                  keep_rows=True, policies={"knorm": make_policy("knorm")})
    best = [r for r in steps if r["method"] == "best"]
    assert best and all(r["layer"] == 1 for r in best)
    for r in best:
        p, V, S = r["p"], r["V"], r["kept_set"]
        assert p.shape[0] == r["n_keys"] and S.size == s and np.isclose(p.sum(), 1.0, atol=1e-12)
        top = np.argsort(-p, kind="stable")[:s]  # ties to the lower index
        e_best, e_top = _forced_error(p, V, S), _forced_error(p, V, top)
        assert e_best == pytest.approx(r["error"], rel=1e-9, abs=1e-13)
        assert e_top == pytest.approx(r["error_top"], rel=1e-9, abs=1e-13)
        assert e_best <= e_top * (1 + 1e-9) + 1e-13  # (c) <= (a), on every row
        assert r["status"] in ("optimal", "improved", "unsolved")
        assert r["lower_bound"] <= r["error"] * (1 + 1e-9)
        if r["status"] == "optimal":
            assert r["lower_bound"] == pytest.approx(r["error"])
    assert any(r["error"] < r["error_top"] * (1 - 1e-6) for r in best)  # the solver found better sets
    kinds = {(r["kind"], r["method"]) for r in rows}
    assert kinds == {("reference", "full"), ("selection", "top"), ("selection", "best"),
                     ("selection", "balancing"), ("policy", "knorm")}


def test_choose_targeted_switch():
    rng = np.random.default_rng(0)
    for t in range(20):
        n = 40
        p = rng.dirichlet(np.full(n, 0.3 if t % 2 else 3.0))
        V = rng.normal(size=(n, 4))
        top, _ = choose("top", p, V, 5)
        bal, _ = choose("balancing", p, V, 5)
        tg, info = choose("targeted", p, V, 5, threshold=0.5)
        dropped = 1.0 - p[top].sum()
        assert info["switched"] == (dropped > 0.5)
        assert np.array_equal(tg, bal if dropped > 0.5 else top)
        best, info = choose("best", p, V, 5, time_limit=1.0)
        assert _forced_error(p, V, best) <= _forced_error(p, V, bal) * (1 + 1e-9)  # warm start at balancing
    # s at or above the row's keys: everything kept, the best set optimal (its status was empty)
    for s in (3, 10):
        kept, info = choose("best", np.array([0.5, 0.3, 0.2]), np.eye(3), s)
        assert kept.tolist() == [0, 1, 2] and info["status"] == "optimal" and info["lower_bound"] == 0.0


def test_bad_options():
    for args, match in (([[0], ["top"], "bnb", 1.0, 0.5, None], "--s"), ([[8], ["nope"], "bnb", 1.0, 0.5, None], "--selection"),
                        ([[8], ["top"], "none", 1.0, 0.5, None], "--solver"), ([[8], ["top"], "bnb", 0.0, 0.5, None], "--time-limit"),
                        ([[8], ["top"], "bnb", 1.0, 1.5, None], "--threshold"), ([[8], ["top"], "bnb", 1.0, 0.5, 0], "--steps")):
        with pytest.raises(InputError, match=match):
            check_options(*args)


def test_steps_limit_rows(tiny):
    model, tok = tiny
    _, steps = ceiling_example(model, tok, CONT, [0], [4], ["top"], steps=5)
    n = prompt_ids(tok, CONT, False).n_context
    assert sorted({r["position"] for r in steps}) == list(range(n, n + 5))
