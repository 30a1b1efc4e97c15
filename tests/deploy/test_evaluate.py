"""evaluate: the protocol through the ragged cache (none = model.generate token for token), physical
bytes after eviction, one scoring per policy and example, budgets, query-aware split, resume after a
kill, bad inputs (exit 2, nothing written), the report's paired comparisons, core.stats.paired_comparison."""

from __future__ import annotations

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
from scipy.stats import binomtest
from typer.testing import CliRunner

from forcedweight.cli import app
from forcedweight.core.stats import paired_comparison
from forcedweight.deploy.allocate import budget_for
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate import KILL_HOOK, evaluate
from forcedweight.errors import InputError
from forcedweight.deploy.evaluate_protocol import greedy_answer, prompt_ids
from forcedweight.deploy.evaluate_report import paired as paired_table, setting_ratio
from forcedweight.deploy.policies import KnormPolicy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import continuation, make_tasks, write_tasks
from forcedweight.models import LoadedModel, byte_tokenizer, load_model, save_tiny_model, tiny_llama

REPO = Path(__file__).resolve().parents[2]
WINDOW = 1024
TIMING = ("prefill_s", "scoring_s", "evict_s", "decode_s")


def _tiny():
    return LoadedModel(tiny_llama(0, max_positions=WINDOW), byte_tokenizer(WINDOW), "tiny", "python")


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory):
    tok = byte_tokenizer(WINDOW)
    ex = make_tasks(tok, ["niah_single_1", "niah_multikey_2"], 600, 2, seed=0, max_new_tokens=8)
    ex.append(continuation(500, tok, 0, 0, continuation_tokens=40))
    return write_tasks(ex, tmp_path_factory.mktemp("tasks") / "tasks.jsonl")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", max_positions=WINDOW)


def _rows(path):
    return pq.read_table(path).to_pylist()


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_none_equals_model_generate_token_for_token(tasks_file, tmp_path):
    lm = _tiny()
    out = evaluate(lm, tasks_file, tmp_path / "run", ["none"], progress=False, report=False, quiet=True)
    rows = {r["id"]: r for r in _rows(out)}
    ref = tiny_llama(0, max_positions=WINDOW)  # a fresh copy with transformers' own attention
    ragged = use_ragged_attention(tiny_llama(0, max_positions=WINDOW))
    examples = [json.loads(line) for line in Path(tasks_file).read_text().splitlines()]
    checked = 0
    for ex in examples:
        if ex["task"] == "continuation":
            continue
        pr = prompt_ids(lm.tokenizer, ex)
        ids = torch.cat([pr.context, pr.question], 1)
        gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=ex["max_new_tokens"],
                           do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
        pre = prefill_context(ragged, lm.tokenizer, pr.context)
        ours = greedy_answer(ragged, pre.ragged_cache(), pr.question, pr.n_context, ex["max_new_tokens"])
        assert ours == gen, ex["id"]
        assert rows[ex["id"]]["answer"] == lm.tokenizer.decode(gen, skip_special_tokens=True)
        assert rows[ex["id"]]["answer_tokens"] == len(gen)
        checked += 1
    assert checked == 4


def test_physical_bytes_and_budgets(tasks_file, tmp_path):
    lm = _tiny()
    cfg = lm.model.config
    L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    out = evaluate(lm, tasks_file, tmp_path / "run", ["none", "knorm", "random", "streaming_llm"],
                   ["uniform", "adakv", "global"], [0.5, 0.8], progress=False, report=False, quiet=True)
    rows = _rows(out)
    assert len(rows) == 5 * (1 + 3 * 3 * 2)
    per_entry = 2 * D * 4  # K and V, float32
    for r in rows:
        n = r["context_tokens"]
        r_kept = L * H * n if r["policy"] == "none" else budget_for(n, L, H, r["compression_ratio"])
        assert r["kept_entries"] == r_kept
        assert r["nominal_bytes"] == r_kept * per_entry
        # after eviction the storage is the kept entries plus the cache's spare rows (1/64) and offsets:
        # within 2% of kept x bytes per entry; the unevicted cache also has the append spare (8 rows)
        slack = 0 if r["policy"] != "none" else 8 * L * H * per_entry
        assert r_kept * per_entry <= r["physical_bytes"] <= 1.02 * r_kept * per_entry + slack, r
        assert r["dense_bytes"] >= L * H * n * per_entry
    dense = {r["id"]: r["physical_bytes"] for r in rows if r["policy"] == "none"}
    assert all(r["dense_bytes"] == dense[r["id"]] for r in rows)
    cont = [r for r in rows if r["task"] == "continuation"]
    assert all(r["metric"] == "ce_nats" and r["score"] > 0 for r in cont)
    full = next(r for r in cont if r["policy"] == "none")
    assert all(abs(r["ce_delta"] - (r["score"] - full["score"])) < 1e-9 for r in cont)  # float64 arithmetic
    # --budget: mean kept entries per KV head
    out = evaluate(lm, tasks_file, tmp_path / "budget", ["knorm"], ["uniform"], budgets=[16], progress=False,
                   report=False, quiet=True)
    for r in _rows(out):
        assert r["kept_entries"] == 16 * L * H and r["budget"] == 16.0
        assert abs(r["compression_ratio"] - (1 - 16 / r["context_tokens"])) < 1e-12


def test_each_policy_scored_once_per_example(tasks_file, tmp_path, monkeypatch):
    calls = []
    original = KnormPolicy.score

    def counting(self, prefill, compression_ratio=None):
        calls.append(prefill.n_tokens)
        return original(self, prefill, compression_ratio)

    monkeypatch.setattr(KnormPolicy, "score", counting)
    evaluate(_tiny(), tasks_file, tmp_path / "run", ["knorm"], ["uniform", "adakv", "global"], [0.3, 0.6, 0.9],
             progress=False, report=False, quiet=True)
    assert len(calls) == 5


def test_query_aware_prefills_context_and_question(tasks_file, tmp_path):
    lm = _tiny()
    ex = json.loads(Path(tasks_file).read_text().splitlines()[0])
    agn, qa = prompt_ids(lm.tokenizer, ex), prompt_ids(lm.tokenizer, ex, query_aware=True)
    enc = lambda s: lm.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert agn.context[0].tolist() == enc("<s>" + ex["context"])
    assert agn.question[0].tolist() == enc(ex["question"] + "\n" + ex["answer_prefix"])
    assert qa.context[0].tolist() == enc("<s>" + ex["context"] + ex["question"])
    assert qa.question[0].tolist() == enc("\n" + ex["answer_prefix"])
    out = evaluate(lm, tasks_file, tmp_path / "qa", ["knorm"], ["uniform"], [0.5], max_examples=1,
                   query_aware=True, progress=False, report=False, quiet=True)
    (row,) = _rows(out)
    assert row["query_aware"] and row["context_tokens"] == qa.n_context


def _cli(*args):
    return CliRunner().invoke(app, ["evaluate", *map(str, args), "--no-progress"])


def _run_sub(args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    code = "from forcedweight.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, "evaluate", *map(str, args), "--no-progress"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)  # a contended CPU


def test_resume_after_kill_equals_uninterrupted(tasks_file, model_dir, tmp_path):
    args = ["--model", model_dir, "--tasks", tasks_file, "--policy", "none,knorm,random", "--allocator",
            "uniform", "--allocator", "global", "--compression-ratio", "0.5,0.75", "--no-report"]
    ref = evaluate(load_model(model_dir), tasks_file, tmp_path / "ref", ["none", "knorm", "random"],
                   ["uniform", "global"], [0.5, 0.75], progress=False, report=False, quiet=True)
    out = tmp_path / "run"
    killed = _run_sub(args + ["--out", out], {KILL_HOOK: "2"})
    assert killed.returncode == -9, killed.stderr
    parts = sorted((out / ".results.parquet.parts").glob("part-*.parquet"))
    assert len(parts) == 2 and not (out / "results.parquet").exists()
    for p in parts:  # mark the finished parts: the rerun must reuse them, not recompute them
        t = pq.read_table(p)
        pq.write_table(t.set_column(t.column_names.index("decode_s"), "decode_s", pa.array([-1.0] * t.num_rows)), p)
    again = _run_sub(args + ["--out", out])
    assert again.returncode == 0, again.stderr
    got = _rows(out / "results.parquet")
    assert sum(r["decode_s"] == -1.0 for r in got) == 2 * (1 + 2 * 2 * 2)
    assert _strip(got) == _strip(_rows(ref))
    assert not (out / ".results.parquet.parts").exists()
    # a finished run with one more method: the earlier rows are reused, only the new method runs
    more = _run_sub(args[:5] + ["none,knorm,random,streaming_llm"] + args[6:] + ["--out", out])
    assert more.returncode == 0, more.stderr
    got2 = _rows(out / "results.parquet")
    assert sum(r["decode_s"] == -1.0 for r in got2) == 2 * (1 + 2 * 2 * 2)
    assert len(got2) == 5 * (1 + 3 * 2 * 2) and _strip([r for r in got2 if r["policy"] != "streaming_llm"]) == _strip(got)


def test_bad_inputs_exit_2_and_write_nothing(tasks_file, model_dir, tmp_path):
    good = Path(tasks_file).read_text().splitlines()[0]
    rec = json.loads(good)

    def file(name, records):
        p = tmp_path / name
        p.write_text("".join(json.dumps(r) + "\n" for r in records))
        return p

    missing = file("missing.jsonl", [{k: v for k, v in rec.items() if k != "question"}])
    empty = file("empty.jsonl", [dict(rec, context="")])
    long = file("long.jsonl", [dict(rec, context="x" * (WINDOW + 10))])
    base = ["--model", model_dir, "--policy", "knorm"]
    cases = [
        (["--tasks", missing, "--compression-ratio", "0.5"], "missing column(s) question"),
        (["--tasks", empty, "--compression-ratio", "0.5"], "empty context"),
        (["--tasks", long, "--compression-ratio", "0.5"], "exceeds the model's window"),
        (["--tasks", tasks_file, "--compression-ratio", "1.0"], "outside [0, 1)"),
        (["--tasks", tasks_file, "--compression-ratio", "-0.1"], "outside [0, 1)"),
        (["--tasks", tasks_file, "--compression-ratio", "x"], "is not a number"),
        (["--tasks", tasks_file, "--compression-ratio", "0.5", "--policy", "nope"], "unknown policy 'nope'"),
        (["--tasks", tasks_file, "--compression-ratio", "0.5", "--allocator", "nope"], "unknown allocator 'nope'"),
        (["--tasks", tasks_file, "--budget", "2", "--policy", "streaming_llm"], "below streaming_llm's sinks"),
        (["--tasks", tasks_file, "--budget", "8", "--compression-ratio", "0.5"], "not both"),
        (["--tasks", tasks_file], "give --compression-ratio or --budget"),
        (["--tasks", tmp_path / "nope.jsonl", "--compression-ratio", "0.5"], "no such file"),
        (["--tasks", tasks_file, "--compression-ratio", "0.5", "--max-examples", "0"], "--max-examples"),
        (["--tasks", tasks_file, "--budget", "inf"], "--budget: inf must be a finite number"),  # was OverflowError
    ]
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        res = _cli(*base, *extra, "--out", out)
        assert res.exit_code == 2, (extra, res.output)
        lines = [ln for ln in res.output.splitlines() if ln.strip() and not ln.startswith(("loading", "loaded"))]
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (extra, res.output)
        assert not out.exists(), extra


def test_cli_run_and_report(tasks_file, model_dir, tmp_path):
    out = tmp_path / "run"
    res = _cli("--model", model_dir, "--tasks", tasks_file, "--policy", "none", "--policy", "knorm,streaming_llm",
               "--compression-ratio", "0.5", "--compression-ratio", "0.8", "--out", out)
    assert res.exit_code == 0, res.output
    rows = _rows(out / "results.parquet")
    md = (out / "report" / "report.md").read_text()
    assert "Paired comparisons" in md and (out / "report" / "score_vs_bytes-niah_single_1.png").stat().st_size > 0
    # the paired table against a hand count
    pairs = {(p["metric"], p["method_a"], p["method_b"]): p for p in _rows(out / "report" / "paired.parquet")}
    a = {(r["task"], r["compression_ratio"], r["id"]): r["score"] for r in rows
         if r["policy"] == "knorm" and r["metric"] == "string_match_all"}
    b = {(r["task"], r["compression_ratio"], r["id"]): r["score"] for r in rows
         if r["policy"] == "streaming_llm" and r["metric"] == "string_match_all"}
    p = pairs[("string_match_all", "knorm/uniform", "streaming_llm/uniform")]
    assert p["n"] == len(a) == 8
    assert p["wins"] == sum(a[k] > b[k] for k in a) and p["losses"] == sum(a[k] < b[k] for k in a)
    c = pairs[("ce_nats", "knorm/uniform", "streaming_llm/uniform")]
    ca = {r["compression_ratio"]: r["score"] for r in rows if r["policy"] == "knorm" and r["task"] == "continuation"}
    cb = {r["compression_ratio"]: r["score"] for r in rows if r["policy"] == "streaming_llm" and r["task"] == "continuation"}
    assert c["wins"] == sum(ca[k] < cb[k] for k in ca)  # lower cross-entropy wins
    assert 0.999 < p["bytes_ratio"] < 1.001  # matched physical bytes
    # a run still going (only parts): a partial report from its finished parts, same tables
    partial = tmp_path / "partial" / ".results.parquet.parts"
    partial.mkdir(parents=True)
    pq.write_table(pq.read_table(out / "results.parquet"), partial / "part-000000-000.parquet")
    res = _cli("report", tmp_path / "partial")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "partial" / "report" / "summary.csv").read_text() == (out / "report" / "summary.csv").read_text()
    assert "(partial)" in (tmp_path / "partial" / "report" / "report.md").read_text()
    res = _cli("report", out, "--out", tmp_path / "rep2")
    assert res.exit_code == 0 and (tmp_path / "rep2" / "report.md").read_text() == md.replace(
        str(out / "results.parquet"), str(out / "results.parquet"))


def test_a_rerun_drops_the_last_reports_files(tasks_file, model_dir, tmp_path):
    out = tmp_path / "run"
    base = ("--model", model_dir, "--tasks", tasks_file, "--policy", "none,knorm,tova", "--out", out)
    assert _cli(*base, "--compression-ratio", "0.5", "--compression-ratio", "0.8").exit_code == 0
    rep = out / "report"
    assert (rep / "score_vs_bytes-niah_multikey_2.png").is_file()
    assert {p["method_b"] for p in _rows(rep / "paired.parquet")} >= {"tova/uniform"}
    # fewer examples and one policy: no pair left, one task gone (the old paired table and figure stayed)
    res = _cli(*base[:4], "--policy", "none,knorm", "--out", out, "--compression-ratio", "0.5", "--max-examples", "1")
    assert res.exit_code == 0, res.output
    assert not (rep / "paired.parquet").exists() and not (rep / "paired.csv").exists()
    assert sorted(p.name for p in rep.glob("*.png")) == ["score_vs_bytes-niah_single_1.png"]
    # --no-report: the report of the rows just replaced is removed, not left beside them
    res = _cli(*base, "--compression-ratio", "0.8", "--max-examples", "1", "--no-report")
    assert res.exit_code == 0 and not rep.exists(), res.output


def test_another_model_of_the_same_name_is_another_run(tasks_file, tmp_path):
    # a LoadedModel from a directory (as robustness, contourkv and the audit pass it) is fingerprinted by its
    # files, not by its name: a second model in another folder called "tiny" used to reuse the first's rows
    a = load_model(save_tiny_model(tmp_path / "a" / "tiny", seed=0, max_positions=WINDOW))
    b = load_model(save_tiny_model(tmp_path / "b" / "tiny", seed=1, max_positions=WINDOW))
    kw = dict(policies=["knorm"], compression_ratios=[0.5], max_examples=1, progress=False, quiet=True, report=False)
    evaluate(a, tasks_file, tmp_path / "run", **kw)
    got = _strip(_rows(evaluate(b, tasks_file, tmp_path / "run", **kw)))
    assert got == _strip(_rows(evaluate(b, tasks_file, tmp_path / "fresh", **kw)))
    assert got != _strip(_rows(evaluate(a, tasks_file, tmp_path / "fresh_a", **kw)))


def test_report_of_a_damaged_results_file_is_one_line(tmp_path):
    import pyarrow as pa

    from forcedweight.deploy.evaluate_report import RESULT_SCHEMA, write_report

    row = {c: None for c in RESULT_SCHEMA.names} | dict(
        id="a", task="niah_single_1", metric="string_match_all", policy="knorm", allocator="uniform",
        compression_ratio=0.5, score=1.0, physical_bytes=10, context_tokens=100)
    good = pa.Table.from_pylist([row], schema=RESULT_SCHEMA)
    pq.write_table(good, tmp_path / "good.parquet")
    assert write_report(tmp_path / "good.parquet", tmp_path / "r").is_file()
    # each was a TypeError deep in the summary
    i = RESULT_SCHEMA.get_field_index("score")
    pq.write_table(good.set_column(i, "score", pa.array(["1.0"])), tmp_path / "text.parquet")
    nulls = good.set_column(RESULT_SCHEMA.get_field_index("compression_ratio"), "compression_ratio",
                            pa.array([None], pa.float64()))
    pq.write_table(nulls, tmp_path / "null.parquet")
    pq.write_table(good.slice(0, 0), tmp_path / "empty.parquet")
    for name, msg in (("text", "column score holds string, not numbers"),
                      ("null", "result row 0 \\(id 'a'\\) has no compression_ratio"), ("empty", "no result rows")):
        with pytest.raises(InputError, match=msg):
            write_report(tmp_path / f"{name}.parquet", tmp_path / f"r-{name}")
        assert not (tmp_path / f"r-{name}").exists()


def test_paired_comparison_against_hand_count():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 3, 40).astype(float)
    b = rng.integers(0, 3, 40).astype(float)
    a[5] = np.nan
    c = paired_comparison(a, b, n_boot=4000, seed=1)
    keep = ~np.isnan(a)
    wins, losses = int((a[keep] > b[keep]).sum()), int((a[keep] < b[keep]).sum())
    assert (c.n, c.wins, c.losses, c.ties) == (39, wins, losses, 39 - wins - losses)
    assert c.pvalue == pytest.approx(binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-12)
    assert c.mean_diff == pytest.approx(float((a[keep] - b[keep]).mean()), abs=1e-12)
    assert c.lo < c.mean_diff < c.hi
    lower = paired_comparison(a, b, higher_is_better=False)
    assert (lower.wins, lower.losses) == (losses, wins) and lower.mean_diff == pytest.approx(-c.mean_diff)
    tie = paired_comparison([1.0, 2.0], [1.0, 2.0])
    assert tie.ties == 2 and tie.pvalue == 1.0 and tie.mean_diff == 0.0


def test_budget_mode_pairs_a_sampled_policy_at_its_nominal_ratio():
    # a sampled policy's effective ratio follows its random kept count (259 vs 256 entries): keyed on
    # it, the pair with any other method at the same budget never formed
    def row(i, policy, kept, score):
        n, heads = 128, 4
        return {"id": str(i), "task": "qa", "metric": "string_match", "policy": policy, "allocator": "uniform",
                "compression_ratio": 1 - kept / (n * heads), "budget": 64.0, "context_tokens": n, "score": score,
                "physical_bytes": kept * 8}

    rows = [row(i, "knorm", 256, 1.0) for i in range(5)] + [row(i, "sampled-knorm", 250 + i, 0.0) for i in range(5)]
    for r in rows:
        r["method"] = f"{r['policy']}/{r['allocator']}"
        r["ratio"] = setting_ratio(r)
    pairs = paired_table(rows, n_boot=50)
    assert len(pairs) == 1 and pairs[0]["n"] == 5 and pairs[0]["wins"] + pairs[0]["losses"] == 5
    assert {r["ratio"] for r in rows} == {0.5}


@pytest.mark.smollm2
def test_smollm2_two_examples_none_vs_knorm(smollm2, tmp_path):
    tok = smollm2.tokenizer
    ex = make_tasks(tok, ["niah_single_1"], 500, 2, seed=0, max_new_tokens=10)
    path = write_tasks(ex, tmp_path / "t.jsonl")
    out = evaluate(smollm2, path, tmp_path / "run", ["none", "knorm"], ["uniform"], [0.5], progress=False,
                   quiet=True)
    rows = _rows(out)
    assert len(rows) == 4 and (tmp_path / "run" / "report" / "report.md").exists()
    ref = load_model().model
    for e in ex:
        pr = prompt_ids(tok, e)
        assert tok.decode(pr.context[0]).startswith("<|im_start|>system")  # kvpress's chat-template split
        ids = torch.cat([pr.context, pr.question], 1)
        gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
        none = next(r for r in rows if r["id"] == e["id"] and r["policy"] == "none")
        assert none["answer"] == tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        kn = next(r for r in rows if r["id"] == e["id"] and r["policy"] == "knorm")
        assert kn["kept_entries"] == budget_for(kn["context_tokens"], 30, 3, 0.5)
        assert kn["physical_bytes"] <= 0.51 * none["physical_bytes"]
