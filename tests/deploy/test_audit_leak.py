"""Query-leak audit (issue 13): with the question visible an attention policy's kept context set follows
the question; without it (or for a policy that reads no attention) it does not; the harness runs pair."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forcedweight.deploy.audit.leak import LEAK_SCHEMA, kept_context_sets, leak_audit, leak_margins, leak_rows
from forcedweight.deploy.evaluate_protocol import prompt_ids
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import write_tasks
from forcedweight.models import byte_tokenizer, tiny_llama

CONTEXT = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa " * 2


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(0, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=300), byte_tokenizer()


def _ex(question: str, i: int = 0) -> dict:
    return {"id": str(i), "task": "niah_single_1", "context": CONTEXT, "question": question, "answer_prefix": " A:",
            "answer": ["kilo"], "max_new_tokens": 3}


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))


@pytest.mark.parametrize("policy", ["tova", "snapkv"])
def test_question_moves_an_attention_policy_only_when_visible(tiny, policy):
    model, tok = tiny
    q1, q2 = " Which word follows juliet? ", " Name the seventh word, now "
    assert len(tok.encode(q1, add_special_tokens=False)) == len(tok.encode(q2, add_special_tokens=False))
    aware = [kept_context_sets(model, tok, _ex(q), policy, 0.5, True) for q in (q1, q2)]
    agnostic = [kept_context_sets(model, tok, _ex(q), policy, 0.5, False) for q in (q1, q2)]
    assert _same(*agnostic)  # the question is never seen: same kept set whatever it asks
    assert not _same(*aware)  # the question's tokens carry attention into the scores
    # the aware kept set differs from the agnostic one as well
    assert not _same(aware[0], agnostic[0])


def test_knorm_reads_no_attention_so_the_question_cannot_move_its_context_scores(tiny):
    """The control: a policy reading no attention scores the context the same whatever the question
    (causal keys); an attention policy (tova) does not. Only the budget's competition with the
    question's own entries can then move knorm's kept set."""
    model, tok = tiny
    n_ctx = prompt_ids(tok, _ex(""), False).n_context

    def context_scores(policy, q):
        pre = prefill_context(model, tok, prompt_ids(tok, _ex(q), True).context)
        return [s[:, :n_ctx] for s in make_policy(policy).score(pre)]

    q1, q2 = " Which word follows juliet? ", " Name the seventh word, now "
    k1, k2 = context_scores("knorm", q1), context_scores("knorm", q2)
    # float32 forward passes of different lengths: equal to rounding (rtol 1e-5)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(k1, k2))
    t1, t2 = context_scores("tova", q1), context_scores("tova", q2)
    # tova's context scores move by far more than rounding: relative change > 1e-4 (knorm's < 1e-5)
    assert max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(t1, t2)) > 1e-4


def test_pairing_and_margins():
    rows = []
    for mode, bonus in (("agnostic", 0.0), ("aware", 1.0)):
        for i in range(12):
            rows.append({"id": str(i), "task": "niah", "metric": "string_match_all", "policy": "tova",
                         "allocator": "uniform", "compression_ratio": 0.5, "score": float(i % 2 == 0) * bonus
                         + (0.0 if mode == "aware" else float(i % 2 == 0) * 0.0), "kept_entries": 10 + (mode == "aware")})
        rows.append({"id": "0", "task": "niah", "metric": "string_match_all", "policy": "none", "allocator": "none",
                     "compression_ratio": 0.0, "score": 1.0, "kept_entries": 99})
    ag = pa.Table.from_pylist([r for r in rows if r["kept_entries"] in (10, 99)][:13])
    aw = pa.Table.from_pylist([r for r in rows if r["kept_entries"] in (11, 99)][-13:])
    t = leak_rows(ag, aw)
    assert t.schema == LEAK_SCHEMA and t.num_rows == 12  # "none" is not a policy
    assert t.column("score_query_aware").to_pylist() == [float(i % 2 == 0) for i in range(12)]
    m = leak_margins(t).to_pylist()
    assert len(m) == 1 and m[0]["margin"] == pytest.approx(0.5) and m[0]["wins"] == 6 and m[0]["ties"] == 6
    assert m[0]["lo"] <= 0.5 <= m[0]["hi"]
    # cross-entropy: lower is better, so a lower aware CE is a positive margin
    ce = t.to_pylist()
    for r in ce:
        r.update(metric="ce_nats", score_query_agnostic=2.0, score_query_aware=1.5)
    assert leak_margins(pa.Table.from_pylist(ce, schema=LEAK_SCHEMA)).to_pylist()[0]["margin"] == pytest.approx(0.5)


def test_leak_audit_through_the_harness(tiny, tmp_path):
    model, tok = tiny
    tasks = write_tasks([_ex(" Which word follows juliet? ", 0), _ex(" Name the seventh word, now ", 1)],
                        tmp_path / "t.jsonl")
    path = leak_audit((model, tok), tasks, tmp_path / "out", ["tova", "knorm"], [0.5], quiet=True, progress=False)
    t = pq.read_table(path)
    assert t.num_rows == 2 * 2 and set(t.column("policy").to_pylist()) == {"tova", "knorm"}
    r = t.to_pylist()
    # the aware run's prefill holds context + question, so at the same ratio it keeps more entries
    assert all(x["kept_entries_query_aware"] > x["kept_entries_query_agnostic"] for x in r)
    ag = pq.read_table(tmp_path / "out" / "leak" / "agnostic" / "results.parquet").to_pylist()
    assert {(x["id"], x["policy"], x["score"]) for x in ag} == {(x["id"], x["policy"], x["score_query_agnostic"]) for x in r}
    assert pq.read_table(tmp_path / "out" / "leak_margins.parquet").num_rows == 2
