"""The paired ContourKV experiment and the enforcement experiment, end to end on a tiny model."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from forcedweight.deploy.contourkv_experiment import enforcement_experiment, merge, paired_experiment
from forcedweight.deploy.tasks import CONTINUATION_TASK
from forcedweight.deploy.tasks.files import write_tasks
from forcedweight.errors import InputError
from forcedweight.models import LoadedModel, byte_tokenizer, tiny_llama


def _tasks(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 4
    exs = [{"context": text + f"the key is {i}{i}{i}.", "question": " what is the key?", "answer_prefix": " it is",
            "answer": [f"{i}{i}{i}"], "max_new_tokens": 4, "task": "niah_single_1", "id": f"n-{i}"} for i in range(3)]
    exs += [{"context": text, "question": "", "answer_prefix": "", "answer": ["a lazy dog again"], "max_new_tokens": 0,
             "task": CONTINUATION_TASK, "id": f"c-{i}"} for i in range(2)]
    return write_tasks(exs, tmp_path / "tasks.jsonl")


def _model():
    m = tiny_llama(seed=0, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=300)
    return LoadedModel(m, byte_tokenizer(512), "tiny", "python")


def test_paired_experiment_tables_and_matched_bytes(tmp_path):
    md = paired_experiment(_model(), _tasks(tmp_path), tmp_path / "out", ratios=(0.5, 0.75), progress=False)
    rows = pq.read_table(tmp_path / "out" / "results.parquet").to_pylist()
    methods = {f"{r['policy']}/{r['allocator']}" for r in rows}
    assert {"kvzip/contourkv", "snapkv/contourkv", "kvzip/global", "kvzip/uniform", "kvzip/adakv",
            "snapkv/uniform"} <= methods
    # every method keeps the same number of entries per (example, ratio): the same budget
    kept = {}
    for r in rows:
        kept.setdefault((r["id"], r["compression_ratio"]), set()).add(r["kept_entries"])
    assert all(len(v) == 1 for v in kept.values())
    table = pq.read_table(tmp_path / "out" / "contourkv.parquet").to_pylist()
    opp = {(t["contourkv"], t["opponent"]) for t in table}
    assert ("kvzip/contourkv", "kvzip/global") in opp
    for t in table:
        assert t["wins"] + t["losses"] + t["ties"] == t["n"]
        assert t["n"] == (3 if t["metric"] != "ce_nats" else 2) * 2  # examples x ratios
    assert "kvzip/global" in md.read_text()
    # a re-merge keeps the run's ratios by default and refuses ratios it did not run (the default
    # 0.5 / 0.75 / 0.9 used to empty results.parquet of a run made at other ratios)
    before = pq.read_table(tmp_path / "out" / "results.parquet")
    merge(tmp_path / "out")
    assert pq.read_table(tmp_path / "out" / "results.parquet").equals(before)
    with pytest.raises(InputError, match="not among the ratios ContourKV ran"):
        merge(tmp_path / "out", ratios=(0.9,))
    assert pq.read_table(tmp_path / "out" / "results.parquet").equals(before)
    with pytest.raises(InputError, match="--baseline"):  # a missing baseline: refused before any group runs
        paired_experiment(_model(), _tasks(tmp_path), tmp_path / "out2", baseline=tmp_path / "nope", progress=False)
    assert not (tmp_path / "out2").exists()


def test_enforcement_masked_equals_ragged_and_holds_the_dense_bytes(tmp_path):
    md = enforcement_experiment(_model(), _tasks(tmp_path), tmp_path / "enf", ratios=(0.5, 0.75))
    rows = pq.read_table(tmp_path / "enf" / "enforcement.parquet").to_pylist()
    by = {(r["id"], r["compression_ratio"], r["storage"]): r for r in rows}
    for (i, ratio, st), r in by.items():
        if st == "masked":
            rag = by[(i, ratio, "ragged")]
            assert r["score"] == rag["score"] or abs(r["score"] - rag["score"]) < 1e-5  # same answers
            assert r["physical_bytes"] >= r["dense_bytes"] > rag["physical_bytes"]
            assert r["kept_entries"] == rag["kept_entries"]
        if st == "token_union":
            assert r["kept_entries"] >= by[(i, ratio, "ragged")]["kept_entries"]  # the union holds more
    assert "enforcing the nominal budget" in md.read_text()
    # a ratio whose budget cannot hold the policy's sinks + recent window names the ratio (it named --budget)
    with pytest.raises(InputError, match=r"--compression-ratio 0.99: example n-0 keeps 1 entries per KV head"):
        enforcement_experiment(_model(), _tasks(tmp_path), tmp_path / "enf2", policy="streaming_llm", ratios=(0.99,))
    assert not (tmp_path / "enf2" / "enforcement.parquet").exists()


def test_enforcement_resumes_after_a_crash_and_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    import pytest

    from forcedweight.deploy import contourkv_experiment as ce

    tasks = _tasks(tmp_path)
    whole = ce.enforcement_experiment(_model(), tasks, tmp_path / "a", ratios=(0.5,), max_examples=3, progress=False)
    real, calls = ce.enforcement_example, []

    def crash_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a kill after two finished examples
        return real(*args, **kwargs)

    monkeypatch.setattr(ce, "enforcement_example", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        ce.enforcement_experiment(_model(), tasks, tmp_path / "b", ratios=(0.5,), max_examples=3, progress=False)
    assert not (tmp_path / "b" / "enforcement.parquet").exists()  # nothing final written by the killed run
    monkeypatch.setattr(ce, "enforcement_example", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    calls.clear()
    ce.enforcement_experiment(_model(), tasks, tmp_path / "b", ratios=(0.5,), max_examples=3, progress=False)
    assert len(calls) == 1  # only the unfinished example was run again
    drop = ("seconds",)
    a = [{k: v for k, v in r.items() if k not in drop} for r in pq.read_table(tmp_path / "a" / "enforcement.parquet").to_pylist()]
    b = [{k: v for k, v in r.items() if k not in drop} for r in pq.read_table(tmp_path / "b" / "enforcement.parquet").to_pylist()]
    assert a == b
    assert not (tmp_path / "b" / ".enforcement.parts").exists()
    assert whole.read_text() == (tmp_path / "b" / "enforcement.md").read_text()
    # the parts of a killed run over another task file content are not resumed (only the path was recorded)
    monkeypatch.setattr(ce, "enforcement_example", crash_on_third)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        ce.enforcement_experiment(_model(), tasks, tmp_path / "c", ratios=(0.5,), max_examples=3, progress=False)
    tasks.write_text(_edited(tasks))
    monkeypatch.setattr(ce, "enforcement_example", real)
    ce.enforcement_experiment(_model(), tasks, tmp_path / "c", ratios=(0.5,), max_examples=3, progress=False)
    ce.enforcement_experiment(_model(), tasks, tmp_path / "d", ratios=(0.5,), max_examples=3, progress=False)
    c = [{k: v for k, v in r.items() if k not in drop} for r in pq.read_table(tmp_path / "c" / "enforcement.parquet").to_pylist()]
    d = [{k: v for k, v in r.items() if k not in drop} for r in pq.read_table(tmp_path / "d" / "enforcement.parquet").to_pylist()]
    assert c == d != a


def _edited(tasks) -> str:
    """The task file with every context changed (the same ids)."""
    return tasks.read_text().replace("the quick brown fox", "a quick red fox")


def test_merge_refuses_groups_of_other_inputs_and_reads_the_opponents_from_the_baseline(tmp_path):
    from forcedweight.deploy.evaluate import evaluate

    tasks = _tasks(tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text(_edited(tasks))
    out, kw = tmp_path / "out", dict(ratios=(0.5,), max_examples=2, progress=False)
    paired_experiment(_model(), tasks, out, **kw)
    # ContourKV rerun on other contexts: the kvzip and uniform groups left from the first run were paired with it
    with pytest.raises(InputError, match="kvzip: run with another task file, model or seed"):
        paired_experiment(_model(), other, out, only=["contourkv"], **kw)
    base = tmp_path / "base"
    evaluate(_model(), other, base, ["kvzip"], ["global"], compression_ratios=[0.5], max_examples=2, progress=False,
             report=False, quiet=True)
    paired_experiment(_model(), other, out, baseline=base, **kw)  # the stale groups are not read
    rows = pq.read_table(out / "results.parquet").to_pylist()
    opponents = [r for r in rows if f"{r['policy']}/{r['allocator']}" not in ("kvzip/contourkv", "snapkv/contourkv")]
    drop = ("prefill_s", "scoring_s", "evict_s", "decode_s")
    strip = lambda rs: sorted(({k: v for k, v in r.items() if k not in drop} for r in rs), key=str)  # noqa: E731
    assert strip(opponents) == strip(pq.read_table(base / "results.parquet").to_pylist())
    with pytest.raises(InputError, match="--baseline .*another task file"):
        paired_experiment(_model(), tasks, tmp_path / "out3", baseline=base, **kw)
