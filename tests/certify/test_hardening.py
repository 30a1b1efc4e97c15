"""Concurrency and crash hardening of certify and groups (issue 16 items 1-4)."""

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from forcedweight.certify import certify_file
from forcedweight.errors import InputError
from tests.certify.test_certify import OPTS, REPO, _rec, _run_sub, _write
from tests.test_io import hold_lock


@pytest.fixture()
def rows_file(tmp_path):
    return _write(tmp_path / "rows.parquet", [_rec(i, n) for i, n in enumerate([12, 9, 14, 10])],
                  row_group_size=2)


def test_second_concurrent_certify_is_refused(rows_file, tmp_path):
    out = tmp_path / "res.parquet"
    holder = hold_lock(out)
    try:
        res = _run_sub([rows_file, "--s", 3, "--out", out])
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            certify_file(rows_file, out, [3], **OPTS)
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and f"pid {holder.pid}" in lines[0]
    assert not out.exists()
    certify_file(rows_file, out, [3], **OPTS)  # the lock is gone with its holder
    assert pq.read_table(out).num_rows == 4


def test_groups_refused_while_its_output_is_locked(rows_file, tmp_path):
    from forcedweight.certify.groups import group_voting

    out = tmp_path / "groups.parquet"
    holder = hold_lock(out)
    try:
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            group_voting(rows_file, [2], out)
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists()
