"""Task files in kvpress's dataset columns: writing (``write_tasks``) and reading (``read_tasks``).

Columns: ``context`` (str), ``question`` (str), ``answer_prefix`` (str), ``answer`` (list of str; a
plain string is read as a one-element list), ``max_new_tokens`` (int); optional ``task`` (default
``"task"``) and ``id`` (default the row number). JSON lines (``.jsonl``/``.json``) or Parquet.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight.errors import InputError

REQUIRED = ("context", "question", "answer_prefix", "answer", "max_new_tokens")
COLUMNS = REQUIRED + ("task", "id")
SCHEMA = pa.schema([("context", pa.string()), ("question", pa.string()), ("answer_prefix", pa.string()),
                    ("answer", pa.list_(pa.string())), ("max_new_tokens", pa.int64()), ("task", pa.string()),
                    ("id", pa.string())])


def task_file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise InputError(f"{path}: task file must end in .jsonl or .parquet")


def write_tasks(examples: list[dict], out: str | os.PathLike) -> Path:
    """Write examples (dicts with :data:`COLUMNS`) atomically as JSON lines or Parquet (by suffix)."""
    out = Path(out)
    kind = task_file_kind(out)
    fio.check_output_file(out)
    if kind == "parquet":
        table = pa.table({c: [e[c] for e in examples] for c in COLUMNS}, schema=SCHEMA)
        return fio.write_table_atomic(table, out)
    with fio.atomic_path(out) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for e in examples:
                f.write(json.dumps({c: e[c] for c in COLUMNS}, ensure_ascii=False) + "\n")
    return out


def _records(path: Path) -> list[dict]:
    if task_file_kind(path) == "parquet":
        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"--tasks {path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise InputError(f"--tasks {path}: line {n}: not JSON ({exc})") from None
            if not isinstance(rec, dict):
                raise InputError(f"--tasks {path}: line {n}: expected a JSON object")
            records.append(rec)
    return records


def read_tasks(path: str | os.PathLike, max_examples: int | None = None) -> list[dict]:
    """Read and check a task file; examples as dicts with every column of :data:`COLUMNS`.

    Raises InputError (naming the file and row) for a missing file, a missing column, an empty
    context, a non-list answer, a negative ``max_new_tokens`` or repeated ids.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--tasks {path}: no such file")
    records = _records(path)
    if not records:
        raise InputError(f"--tasks {path}: no examples")
    if max_examples is not None:
        if max_examples < 1:
            raise InputError(f"--max-examples must be >= 1, got {max_examples}")
        records = records[:max_examples]
    out, seen = [], set()
    for i, rec in enumerate(records):
        missing = [c for c in REQUIRED if c not in rec or rec[c] is None]
        if missing:
            raise InputError(f"--tasks {path}: row {i}: missing column(s) {', '.join(missing)}")
        ans = rec["answer"]
        if isinstance(ans, str):
            ans = [ans]
        if not isinstance(ans, (list, tuple)) or not all(isinstance(a, str) for a in ans):
            raise InputError(f"--tasks {path}: row {i}: answer must be a list of strings")
        for c in ("context", "question", "answer_prefix"):
            if not isinstance(rec[c], str):
                raise InputError(f"--tasks {path}: row {i}: {c} must be a string")
        if not rec["context"].strip():
            raise InputError(f"--tasks {path}: row {i}: empty context")
        try:
            mnt = int(rec["max_new_tokens"])
            if mnt != float(rec["max_new_tokens"]):  # 2.5 is not a length (int() truncated it to 2)
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"--tasks {path}: row {i}: max_new_tokens must be an integer") from None
        if mnt < 0:
            raise InputError(f"--tasks {path}: row {i}: max_new_tokens must be >= 0")
        ex_id = str(rec.get("id") if rec.get("id") is not None else i)
        if ex_id in seen:
            raise InputError(f"--tasks {path}: row {i}: repeated id {ex_id!r}")
        seen.add(ex_id)
        out.append({"context": rec["context"], "question": rec["question"], "answer_prefix": rec["answer_prefix"],
                    "answer": list(ans), "max_new_tokens": mnt, "task": str(rec.get("task") or "task"),
                    "id": ex_id})
    return out
