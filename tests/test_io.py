"""io.output_lock (two processes), fsync'd atomic writes."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forcedweight import io as fio
from forcedweight.errors import InputError

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
from forcedweight.io import output_lock
with output_lock(sys.argv[1], "certify"):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold_lock(out, seconds=60.0):
    """A second process holding the lock on ``out``; returns once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), str(seconds)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "res.parquet"
    holder = hold_lock(out)
    try:
        with pytest.raises(InputError) as exc:
            with fio.output_lock(out, "certify"):
                pass
        msg = str(exc.value)
        assert f"pid {holder.pid}" in msg and str(out) in msg and "\n" not in msg
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the killed holder's lock: the output can be locked again
    with fio.output_lock(out) as lock:
        assert lock.read_text().strip() == str(os.getpid())
    assert not fio.lock_path_for(out).exists()


def test_lock_is_reentrant_in_one_process_and_released(tmp_path):
    out = tmp_path / "d"
    with fio.output_lock(out):
        with fio.output_lock(out):
            assert fio.lock_path_for(out).exists()
        assert fio.lock_path_for(out).exists()
    assert not fio.lock_path_for(out).exists()
    # after release another process can take it at once
    proc = hold_lock(out, 0.1)
    proc.wait(timeout=30)
    assert proc.returncode == 0


def test_atomic_write_fsyncs_before_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    target = tmp_path / "t.parquet"
    fio.write_table_atomic(pa.table({"x": [1, 2, 3]}), target)
    assert calls[:2] == ["fsync", "replace"]  # file flushed before it is renamed into place
    assert pq.read_table(target).column("x").to_pylist() == [1, 2, 3]


def test_dump_and_evaluate_hold_the_output_lock(tmp_path):
    """A second dump / evaluate / audit on an output another process holds is refused with one line, nothing run."""
    import subprocess
    import sys
    import time

    import pytest

    from forcedweight.deploy.audit.run import audit
    from forcedweight.deploy.evaluate import evaluate
    from forcedweight.dump import dump_rows
    from forcedweight.errors import InputError
    from forcedweight.io import lock_path_for

    from forcedweight.deploy.robustness import RobustnessConfig, run_robustness
    from forcedweight.report import build_report

    from forcedweight.deploy.tasks import write_task_file
    from forcedweight.instances import write_partition
    from forcedweight.models import byte_tokenizer

    # (audit, report, robustness, instances and tasks took no lock: the last run's output won)
    for out in (tmp_path / "dump", tmp_path / "eval", tmp_path / "audit", tmp_path / "report", tmp_path / "robust",
                tmp_path / "inst" / "partition-m20.parquet", tmp_path / "tasks.jsonl"):
        holder = subprocess.Popen([sys.executable, "-c", (
            "import sys, time; from forcedweight.io import output_lock\n"
            f"with output_lock({str(out)!r}, 'test holder'):\n"
            "    print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(InputError, match=rf"pid {holder.pid}"):
                if out.name == "dump":
                    dump_rows("no-such-model", ["x"], out, progress=False)
                elif out.name == "audit":
                    audit("no-such-model", tmp_path / "no-tasks.jsonl", out, ["knorm"], [0.5])
                elif out.name == "report":
                    build_report(tmp_path / "no-results.parquet", out)
                elif out.name == "robust":
                    run_robustness("no-such-model", tmp_path / "no-tasks.jsonl", out, RobustnessConfig())
                elif out.name == "tasks.jsonl":
                    write_task_file(byte_tokenizer(), ["niah_single_1"], 300, 1, out)
                elif out.parent.name == "inst":
                    write_partition(out.parent, 20, 2, 0)
                else:
                    evaluate("no-such-model", tmp_path / "no-tasks.jsonl", out, ["none"])
            assert not out.exists() and lock_path_for(out).exists()
        finally:
            holder.kill()
            holder.wait()
        time.sleep(0.1)


def test_stderr_notes_write_to_stderr_unless_quiet(capsys):
    fio.stderr_notes()("loaded")
    fio.stderr_notes(quiet=True)("hidden")
    got = capsys.readouterr()
    assert got.err == "loaded\n" and got.out == ""
