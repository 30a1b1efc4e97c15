"""``forcedweight audit`` end to end on a tiny model directory: the three tables and the report; bad input
→ ``error:`` + exit 2 with nothing written; ``forcedweight memory`` still answers (the quick form)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from forcedweight.cli import app
from forcedweight.deploy.tasks import write_tasks
from forcedweight.models import save_tiny_model

CONTEXT = "one two three four five six seven eight nine ten eleven twelve " * 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit")
    model = save_tiny_model(d / "model", seed=0, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=300)
    exs = [{"id": str(i), "task": "niah_single_1", "context": CONTEXT + f" the key is {i}{i}.", "question": " Key? ",
            "answer_prefix": " A:", "answer": [f"{i}{i}"], "max_new_tokens": 3} for i in range(2)]
    exs.append({"id": "c", "task": "continuation", "context": CONTEXT, "question": "", "answer_prefix": "",
                "answer": [" thirteen fourteen"], "max_new_tokens": 0})
    return model, write_tasks(exs, d / "tasks.jsonl"), d


def test_audit_writes_every_table(setup):
    model, tasks, d = setup
    out = d / "out"
    res = CliRunner().invoke(app, ["audit", "--model", str(model), "--tasks", str(tasks), "--policy", "knorm,tova",
                                   "--compression-ratio", "0.25,0.5", "--allocator", "uniform,adakv", "--out", str(out),
                                   "--s", "4", "--layers", "1", "--selection", "top,best", "--time-limit", "0.05",
                                   "--ceiling-examples", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    mem = pq.read_table(out / "memory.parquet")
    assert mem.column_names[:6] == ["policy", "allocator", "compression_ratio", "storage", "bytes", "dense_bytes"]
    assert mem.num_rows == 2 * 2 * 2 * 3 and set(mem.column("storage").to_pylist()) == {"ragged", "masked", "nominal"}
    leak = pq.read_table(out / "leak.parquet")
    assert leak.column_names[:8] == ["policy", "allocator", "compression_ratio", "task", "metric", "id",
                                     "score_query_agnostic", "score_query_aware"]
    assert leak.num_rows == 3 * 2 * 2 * 2  # examples x policies x allocators x ratios
    ceil = pq.read_table(out / "ceiling.parquet").to_pylist()
    # 2 examples x (full + 2 selections + 2 policies) at s = 4
    assert len(ceil) == 2 * 5 and {r["kind"] for r in ceil} == {"reference", "selection", "policy"}
    steps = pq.read_table(out / "ceiling_steps.parquet").to_pylist()
    assert steps and {r["layer"] for r in steps} == {1}
    assert all(r["error"] <= r["error_top"] * (1 + 1e-9) + 1e-13 for r in steps if r["method"] == "best")
    report = (out / "report.md").read_text()
    for head in ("## Memory", "## Query leak", "## Selection ceiling", "0 rows with E(best) > E(top-mass)"):
        assert head in report
    assert (out / "memory.png").stat().st_size > 1000


@pytest.mark.parametrize("args, msg", [
    (["--policy", "nope", "--compression-ratio", "0.5"], "unknown policy"),
    (["--policy", "knorm", "--compression-ratio", "1.5"], "--compression-ratio"),
    (["--policy", "knorm", "--compression-ratio", "x"], "not a number"),
    (["--policy", "knorm"], "--compression-ratio"),
    (["--policy", "knorm", "--compression-ratio", "0.5", "--part", "bytes"], "--part"),
    (["--policy", "knorm", "--part", "ceiling", "--s", "0"], "--s"),
    (["--policy", "knorm", "--part", "ceiling", "--layers", "7"], "--layers"),
    (["--policy", "knorm", "--compression-ratio", "0.5", "--allocator", "even"], "allocator"),
    # refused after memory.parquet was written (the leak part's evaluate checked it)
    (["--policy", "random", "--compression-ratio", "0.5", "--part", "memory,leak", "--seed", "-1"], "--seed"),
    (["--policy", "sampled-h2o", "--part", "ceiling", "--s", "4"], "topk-h2o"),  # was measured as its top-s
])
def test_bad_input_exit_2_nothing_written(setup, tmp_path, args, msg):
    model, tasks, _ = setup
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["audit", "--model", str(model), "--tasks", str(tasks), "--out", str(out),
                                   "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert "error:" in res.output and msg in res.output
    assert not out.exists() or not any(out.rglob("*.parquet")) and not (out / "report.md").exists()


@pytest.mark.parametrize("layer", ["7", "-1"])
def test_bad_layers_refused_before_the_output_directory(setup, tmp_path, layer):
    # checked from the model's config.json before any weights load: no empty output directory is left
    model, tasks, _ = setup
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["audit", "--model", str(model), "--tasks", str(tasks), "--out", str(out),
                                   "--no-progress", "--policy", "knorm", "--part", "ceiling", "--layers", layer])
    assert res.exit_code == 2 and f"--layers: [{layer}]" in res.output, res.output
    assert not out.exists()


def test_parts_of_one_directory_share_their_inputs(setup, tmp_path):
    # report.md sets the parts side by side: a part left from another task file is refused, not reported with it
    model, tasks, _ = setup
    other = tmp_path / "other.jsonl"
    other.write_text(tasks.read_text().replace("the key is", "the code is"))
    out = tmp_path / "o"
    base = ["audit", "--model", str(model), "--policy", "knorm", "--compression-ratio", "0.5", "--out", str(out),
            "--no-progress", "--s", "4", "--layers", "1", "--selection", "top", "--ceiling-examples", "1"]
    assert CliRunner().invoke(app, base + ["--tasks", str(tasks), "--part", "memory"]).exit_code == 0
    before = (out / "report.md").read_text()
    res = CliRunner().invoke(app, base + ["--tasks", str(other), "--part", "ceiling"])
    assert res.exit_code == 2 and "memory.parquet was made from another task file or model" in res.output, res.output
    assert not (out / "ceiling.parquet").exists() and (out / "report.md").read_text() == before
    res = CliRunner().invoke(app, base + ["--tasks", str(tasks), "--part", "ceiling"])  # the same inputs: added
    assert res.exit_code == 0 and (out / "ceiling.parquet").is_file(), res.output
    res = CliRunner().invoke(app, base + ["--tasks", str(other), "--part", "memory,ceiling"])  # every part redone
    assert res.exit_code == 0, res.output


def test_missing_tasks_and_memory_alias(setup, tmp_path):
    res = CliRunner().invoke(app, ["audit", "--policy", "knorm", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--tasks" in res.output
    res = CliRunner().invoke(app, ["audit", "--tasks", str(tmp_path / "none.jsonl"), "--policy", "knorm",
                                   "--compression-ratio", "0.5", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "error:" in res.output
    res = CliRunner().invoke(app, ["memory", "--tokens", "64", "--compression-ratio", "0.5"])
    assert res.exit_code == 0 and "ragged" in res.output and "forcedweight audit --part memory" in res.output
