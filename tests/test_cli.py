"""The CLI's exit contract on bad input (issue 16 item 6): one ``error:`` line, exit 2, nothing written."""

import errno
import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.certify.test_certify import _rec, _write


def cli(monkeypatch, capsys, args):
    """Run ``forcedweight ARGS`` in-process; return (exit code, stderr lines)."""
    from forcedweight.cli import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["forcedweight", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        main()
    got = capsys.readouterr()
    cli.out = got.out  # the command's stdout, for the tests that read it
    return exc.value.code or 0, got.err.strip().splitlines()


def one_error(code, err, *words):
    assert code == 2 and len(err) == 1 and err[0].startswith("error:"), err
    for w in words:
        assert w in err[0], err


def corrupt_pages(path):
    """Flip bytes in the data pages, keeping the footer (and the magic) intact."""
    b = bytearray(path.read_bytes())
    footer = int.from_bytes(b[-8:-4], "little")
    for i in range(8, len(b) - footer - 8, 7):
        b[i] ^= 0x5A
    path.write_bytes(bytes(b))
    assert pq.ParquetFile(path).metadata.num_rows > 0  # the footer still reads


@pytest.fixture()
def rows_file(tmp_path):
    return _write(tmp_path / "rows.parquet", [_rec(i, 10) for i in range(4)])


def test_corrupt_data_pages_under_an_intact_footer(monkeypatch, capsys, tmp_path):
    bad = _write(tmp_path / "bad.parquet", [_rec(i, 60) for i in range(20)])
    corrupt_pages(bad)
    code, err = cli(monkeypatch, capsys, ["certify", bad, "--s", 3, "--out", tmp_path / "o.parquet", "--no-progress"])
    one_error(code, err, str(bad), "unreadable Parquet data")
    assert not (tmp_path / "o.parquet").exists()


def test_report_of_corrupt_results_and_disk_full_leave_nothing(monkeypatch, capsys, rows_file, tmp_path):
    from forcedweight.certify import CertifyOptions, certify_file
    from forcedweight.report import figures

    res = certify_file(rows_file, tmp_path / "res.parquet", [3], CertifyOptions(time_limit=5.0), progress=False)
    good = tmp_path / "good.parquet"
    good.write_bytes(res.read_bytes())
    corrupt_pages(res)
    code, err = cli(monkeypatch, capsys, ["report", res, "--out", tmp_path / "rep"])
    one_error(code, err, "unreadable Parquet data")
    assert not (tmp_path / "rep").exists() or not any((tmp_path / "rep").iterdir())
    # the disk fills while the figures are written: no tables/ without figures/, no report.md
    real = figures.write_all

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "rep2" / "figures" / "x.png"))

    monkeypatch.setattr(figures, "write_all", full)
    code, err = cli(monkeypatch, capsys, ["report", good, "--out", tmp_path / "rep2"])
    one_error(code, err, "no space left on device")
    assert sorted(p.name for p in (tmp_path / "rep2").iterdir()) == []
    monkeypatch.setattr(figures, "write_all", real)
    code, err = cli(monkeypatch, capsys, ["report", good, "--out", tmp_path / "rep2"])
    assert code == 0, err
    assert {"tables", "figures", "report.md"} <= {p.name for p in (tmp_path / "rep2").iterdir()}


def test_disk_full_while_certify_writes(monkeypatch, capsys, rows_file, tmp_path):
    import forcedweight.io as fio

    def full(table, target, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fio.pq, "write_table", full)
    out = tmp_path / "o.parquet"
    code, err = cli(monkeypatch, capsys, ["certify", rows_file, "--s", 3, "--out", out, "--no-progress"])
    one_error(code, err, "no space left on device")
    assert not out.exists()


@pytest.mark.parametrize("args, words", [
    (["--s", 10**20, "--skip-invalid"], ["--s"]),
    (["--s", 3, "--solver", "scip", "--time-limit", "1e300"], ["--time-limit"]),
    (["--s", 3, "--time-limit", "inf"], ["--time-limit"]),
])
def test_out_of_range_options(monkeypatch, capsys, rows_file, tmp_path, args, words):
    out = tmp_path / "o.parquet"
    code, err = cli(monkeypatch, capsys, ["certify", rows_file, *args, "--out", out, "--no-progress"])
    one_error(code, err, *words)
    assert not out.exists()


def test_huge_values_are_refused_naming_the_row(monkeypatch, capsys, tmp_path):
    recs = [_rec(i, 8, keys=False) for i in range(3)]
    recs[2]["values"] = np.where(np.arange(24) % 2, 1e160, -1e160)
    bad = _write(tmp_path / "big.parquet", recs)
    out = tmp_path / "o.parquet"
    code, err = cli(monkeypatch, capsys, ["certify", bad, "--s", 3, "--out", out, "--no-progress"])
    one_error(code, err, "row 2", "1e+160")
    assert not out.exists()
    # under --skip-invalid the row is recorded invalid, the others certified
    code, err = cli(monkeypatch, capsys, ["certify", bad, "--s", 3, "--out", out, "--no-progress", "--skip-invalid"])
    assert code == 0, err
    t = pq.read_table(out).to_pylist()
    assert [r["status"] for r in t][2] == "invalid" and all(r["status"] != "invalid" for r in t[:2])


def test_a_non_utf8_path_is_one_line(monkeypatch, capsys, rows_file, tmp_path):
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/r\xff.parquet")
    os.link(rows_file, odd)
    code, err = cli(monkeypatch, capsys, ["certify", odd, "--s", 3, "--out", tmp_path / "o.parquet", "--no-progress"])
    one_error(code, err, "not valid UTF-8")
    assert not (tmp_path / "o.parquet").exists()


def test_version_and_help_markup(monkeypatch, capsys):
    from forcedweight import __version__

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["forcedweight", "--version"])
    from forcedweight.cli import main

    with pytest.raises(SystemExit) as exc:
        main()
    assert (exc.value.code or 0) == 0 and capsys.readouterr().out.strip() == f"forcedweight {__version__}"
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", ["forcedweight", "instances", "partition", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert "SeedSequence([seed, m, i])" in capsys.readouterr().out  # not swallowed as a markup tag


def test_a_bad_layers_list_fails_before_the_model_load(monkeypatch, capsys, tmp_path):
    from forcedweight import models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", no_load)
    code, err = cli(monkeypatch, capsys, ["dump", "--layers", "1,x", "--out", tmp_path / "d"])
    one_error(code, err, "--layers")
    assert not (tmp_path / "d").exists()


def test_memory_without_options_audits_half_the_cache(monkeypatch, capsys):
    code, err = cli(monkeypatch, capsys, ["memory", "--tokens", "64"])
    assert code == 0, err
    default, _ = cli.out, None
    code, err = cli(monkeypatch, capsys, ["memory", "--tokens", "64", "--compression-ratio", "0.5"])
    assert code == 0 and cli.out == default and cli.out.strip()  # the default is r = 0.5


@pytest.mark.smollm2
def test_the_gguf_conversion_bar_is_silenced_from_python(capfd):
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from forcedweight import models

    original = gguf_utils.tqdm
    models.load_model(progress=False)
    assert gguf_utils.tqdm is original  # restored after the load
    assert "Converting and de-quantizing" not in capfd.readouterr().err


@pytest.mark.parametrize("command", [["evaluate"], ["audit"], ["contourkv", "paired"], ["contourkv", "enforcement"],
                                     ["probabilistic", "robustness"]])
def test_threads_below_one_is_refused_before_any_work(monkeypatch, capsys, tmp_path, command):
    # one home for --threads (cli.options.torch_threads): every command that takes it refuses 0 in one line
    # and writes nothing, before reading the task file or loading a model
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "o"
    tasks.write_text("")
    code, err = cli(monkeypatch, capsys, [*command, "--tasks", tasks, "--out", out, "--threads", 0])
    one_error(code, err, "--threads", ">= 1")
    assert not out.exists()


@pytest.mark.parametrize("command", [
    ["evaluate", "--tasks", "{tasks}"], ["audit", "--tasks", "{tasks}"], ["probabilistic", "robustness", "--tasks", "{tasks}"],
    ["pipeline"], ["instances", "partition", "--m", 8, "--count", 1],
])
def test_a_file_as_the_output_directory_is_one_line(monkeypatch, capsys, tmp_path, command):
    # one home (io.check_output_dir): the same line from every command that writes a directory, the file untouched
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "taken"
    tasks.write_text("")
    out.write_text("mine")
    args = [str(tasks) if a == "{tasks}" else a for a in command]
    code, err = cli(monkeypatch, capsys, [*args, "--out", out])
    one_error(code, err, "--out", str(out), "exists and is not a directory")
    assert out.read_text() == "mine"


@pytest.mark.parametrize("command", ["evaluate", "audit"])
@pytest.mark.parametrize("missing", ["--tasks", "--out"])
def test_generation_commands_name_a_missing_tasks_or_out(monkeypatch, capsys, tmp_path, command, missing):
    # one home (cli.options.require_tasks_and_out): the line names the missing option, nothing is written
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "o"
    tasks.write_text("")
    given = {"--tasks": tasks, "--out": out}
    del given[missing]
    code, err = cli(monkeypatch, capsys, [command, *[x for kv in given.items() for x in kv]])
    one_error(code, err, missing, "give a")
    assert not out.exists()


@pytest.mark.parametrize("command", [
    ["report", "{rows}", "--out", "{out}"],
    ["groups", "{rows}", "--s", "2", "--out", "{out}/g.parquet"],
    ["dump", "--out", "{out}"],
    ["probabilistic", "study", "{rows}", "--out", "{out}"],
    ["instances", "partition", "--m", "4", "--count", "1", "--out", "{out}"],
    ["evaluate", "--tasks", "{rows}", "--policy", "sampled-h2o", "--compression-ratio", "0.5", "--out", "{out}"],
])
def test_a_negative_seed_is_one_line_before_any_work(monkeypatch, capsys, rows_file, tmp_path, command):
    # NumPy's SeedSequence refuses negative seeds: these commands printed its traceback (exit 1), and
    # dump left a manifest and texts behind, the study an empty directory
    from forcedweight import models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", no_load)
    out = tmp_path / "out"
    args = [a.format(rows=rows_file, out=out) for a in command]
    code, err = cli(monkeypatch, capsys, [*args, "--seed", "-1"])
    one_error(code, err, "--seed", "-1")
    assert not out.exists()


def test_tasks_options_are_checked_before_the_model_loads(monkeypatch, capsys, tmp_path):
    from forcedweight import models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(models, "loaded_model", no_load)
    for opts, word in ((["--max-new-tokens", "-1"], "--max-new-tokens"), (["--n", "0"], "--n"),
                       (["--tokens", "0"], "--tokens")):  # -1 was written, then refused by evaluate
        code, err = cli(monkeypatch, capsys, ["tasks", "--kinds", "vt", *opts, "--out", tmp_path / "t.jsonl"])
        one_error(code, err, word)
    assert not (tmp_path / "t.jsonl").exists()


def test_certify_refuses_a_negative_bound_time(monkeypatch, capsys, rows_file, tmp_path):
    code, err = cli(monkeypatch, capsys, ["certify", rows_file, "--s", 3, "--out", tmp_path / "o.parquet",
                                          "--bound-time", -1, "--no-progress"])
    one_error(code, err, "--bound-time")
    assert not (tmp_path / "o.parquet").exists()
