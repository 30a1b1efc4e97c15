"""Tasks: RULER-style generators (deterministic, contain their answers, fitted lengths), continuation
examples, task files and the reader's errors, RULER scoring, ``forcedweight tasks``."""

from __future__ import annotations

import collections
import json
import re

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from forcedweight.cli import app
from forcedweight.deploy.tasks import (ALL_KINDS, continuation, make_tasks, read_tasks, score_answer,
                                       string_match_all, string_match_part, write_tasks)
from forcedweight.deploy.tasks.ruler import _rng, builder, count_tokens, fit
from forcedweight.dump.corpus import builtin_texts
from forcedweight.errors import InputError
from forcedweight.models import byte_tokenizer, save_tiny_model

TOKENS = 1500


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(4096)


@pytest.fixture(scope="module")
def examples(tok):
    return make_tasks(tok, list(ALL_KINDS), TOKENS, 3, seed=0, continuation_tokens=40)


def test_deterministic_and_seeded(tok, examples):
    again = make_tasks(tok, list(ALL_KINDS), TOKENS, 3, seed=0, continuation_tokens=40)
    assert again == examples
    other = make_tasks(tok, ["niah_single_1", "vt"], TOKENS, 3, seed=1)
    assert [e["answer"] for e in other] != [e["answer"] for e in examples if e["task"] in ("niah_single_1", "vt")]
    assert len({e["id"] for e in examples}) == len(examples) == 3 * len(ALL_KINDS)


def test_every_example_contains_its_answers_and_fits(tok, examples):
    for e in examples:
        if e["task"] == "continuation":
            continue
        assert e["answer"], e["id"]
        for a in e["answer"]:
            assert a in e["context"], (e["id"], a)
        n = count_tokens(tok, e)
        # fitted by binary search: at most the target, and the next haystack size is over it
        assert n <= TOKENS, (e["id"], n)
        if e["task"] == "cwe":  # cwe's word pool caps its size (longer lists repeat the last one)
            continue
        build = builder(e["task"])
        index = int(e["id"].rsplit("-", 1)[1])
        size = next(s for s in range(1, 5000) if build(s, _rng(0, e["task"], index))["context"] == e["context"])
        while (nxt := build(size, _rng(0, e["task"], index)))["context"] == e["context"]:
            size += 1  # the next larger haystack (sizes may round to the same text)
        assert count_tokens(tok, nxt) > TOKENS, e["id"]


def test_kind_structures(examples):
    by = collections.defaultdict(list)
    for e in examples:
        by[e["task"]].append(e)
    counts = {"niah_single_1": 1, "niah_single_3": 1, "niah_multikey_1": 1, "niah_multikey_3": 1,
              "niah_multivalue": 4, "niah_multiquery": 4, "vt": 5, "cwe": 10, "fwe": 3}
    for kind, k in counts.items():
        assert all(len(e["answer"]) == k for e in by[kind]), kind
    uuid = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
    assert all(uuid.match(e["answer"][0]) for e in by["niah_single_3"])
    assert all(re.fullmatch(r"\d{7}", e["answer"][0]) for e in by["niah_single_1"])
    assert all("The grass is green." in e["context"] for e in by["niah_single_1"])
    # RULER's wording: singular when one value is asked, plural otherwise
    assert all(e["question"].startswith("What is the special magic number for ") and
               e["context"].startswith("A special magic number is hidden") for e in by["niah_single_2"])
    assert all(e["question"].startswith("What are all the special magic numbers for ") for e in by["niah_multivalue"])
    assert all("The grass is green." not in e["context"] for e in by["niah_single_2"])
    # multikey: 4 needles in the text, one asked
    for e in by["niah_multikey_1"]:
        assert e["context"].count("One of the special magic numbers for") == 4
        assert e["question"].split(" for ")[1].split(" mentioned")[0] in e["context"]
    for e in by["cwe"]:  # the answer words are exactly the most frequent ones of the list
        words = re.findall(r"\d+\. (\S+)", e["context"])
        c = collections.Counter(words)
        top = sorted(c, key=lambda w: -c[w])[:10]
        assert sorted(top) == sorted(e["answer"]) and min(c[w] for w in e["answer"]) > max(
            c[w] for w in c if w not in e["answer"])
    for e in by["fwe"]:
        body = e["context"].split("coded words. ", 1)[1]
        c = collections.Counter(w for w in body.split() if w != "....")
        ranked = sorted(c, key=lambda w: -c[w])
        assert ranked[:3] == e["answer"] and c[ranked[2]] > c[ranked[3]]
    for e in by["vt"]:  # the chain: first var gets the value, each next one the previous var
        names = e["answer"]
        value = e["question"].split("value ")[1].split(" ")[0]
        assert f"VAR {names[0]} = {value}." in e["context"]
        for a, b in zip(names, names[1:]):
            assert f"VAR {b} = VAR {a}." in e["context"]


def test_continuation_is_a_prefix_of_the_cycled_corpus(tok):
    texts = builtin_texts()
    e = continuation(500, tok, 3, 2, continuation_tokens=60)
    joined = "\n\n".join(texts[(5 + k) % len(texts)] for k in range(len(texts)))
    assert joined.startswith(e["context"] + e["answer"][0])
    assert len(tok.encode(e["context"], add_special_tokens=False)) == 500
    assert len(tok.encode(e["answer"][0], add_special_tokens=False)) == 60
    assert e["task"] == "continuation" and e["question"] == "" and e["max_new_tokens"] == 0


def test_scoring_rules():
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert string_match_all("ABC-def", ["abc-DEF"]) == 1.0  # case-insensitive
    assert string_match_all("anything", []) == 0.0
    assert string_match_part("we found 456", ["123", "456"]) == 1.0
    assert string_match_part("we found none", ["123", "456"]) == 0.0
    assert score_answer("qa_1", "x 456", ["123", "456"]) == 1.0  # qa -> part
    assert score_answer("niah_multivalue", "x 456", ["123", "456"]) == 0.5  # others -> all


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_task_file_roundtrip(tmp_path, examples, suffix):
    path = write_tasks(examples, tmp_path / f"t{suffix}")
    assert read_tasks(path) == examples
    assert read_tasks(path, max_examples=4) == examples[:4]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


GOOD = {"context": "c", "question": "q", "answer_prefix": "", "answer": ["a"], "max_new_tokens": 3}


@pytest.mark.parametrize("record, message", [
    ({k: v for k, v in GOOD.items() if k != "answer_prefix"}, "missing column(s) answer_prefix"),
    (dict(GOOD, context="   "), "empty context"),
    (dict(GOOD, answer=[1, 2]), "answer must be a list of strings"),
    (dict(GOOD, max_new_tokens=-1), "max_new_tokens must be >= 0"),
    (dict(GOOD, max_new_tokens=2.5), "max_new_tokens must be an integer"),  # was truncated to 2
])
def test_reader_errors(tmp_path, record, message):
    path = _jsonl(tmp_path / "bad.jsonl", [GOOD, record])
    with pytest.raises(InputError, match=re.escape(message)) as exc:
        read_tasks(path)
    assert "row 1" in str(exc.value)


def test_reader_file_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_tasks(tmp_path / "none.jsonl")
    (tmp_path / "t.csv").write_text("x")
    with pytest.raises(InputError, match=".jsonl or .parquet"):
        read_tasks(tmp_path / "t.csv")
    with pytest.raises(InputError, match="repeated id"):
        read_tasks(_jsonl(tmp_path / "dup.jsonl", [dict(GOOD, id="x"), dict(GOOD, id="x")]))
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(InputError, match="line 1: not JSON"):
        read_tasks(tmp_path / "broken.jsonl")
    # a plain-string answer is read as a one-element list (kvpress datasets hold either)
    assert read_tasks(_jsonl(tmp_path / "s.jsonl", [dict(GOOD, answer="a")]))[0]["answer"] == ["a"]


def test_fit_too_short_is_an_input_error(tok):
    with pytest.raises(InputError, match="too short"):
        fit("niah_single_1", 50, tok, 0, 0)


def test_cli_tasks(tmp_path):
    model = save_tiny_model(tmp_path / "tiny", max_positions=2048)
    out = tmp_path / "t.parquet"
    runner = CliRunner()
    res = runner.invoke(app, ["tasks", "--model", str(model), "--kinds", "niah_single_2,vt", "--tokens", "600",
                              "--n", "2", "--out", str(out), "--max-new-tokens", "5"])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out).to_pylist()
    assert [r["task"] for r in rows] == ["niah_single_2"] * 2 + ["vt"] * 2
    assert all(r["max_new_tokens"] == 5 for r in rows)
    bad = tmp_path / "bad.jsonl"
    res = runner.invoke(app, ["tasks", "--model", str(model), "--kinds", "niah_nope", "--out", str(bad)])
    assert res.exit_code == 2 and "unknown task kind" in res.output and not bad.exists()
    res = runner.invoke(app, ["tasks", "--model", str(model), "--kinds", "vt", "--out", str(tmp_path / "t.csv")])
    assert res.exit_code == 2 and ".jsonl or .parquet" in res.output
