"""Where a report's inputs came from: the certify settings and the dump that produced the rows.

``certify`` stores in its output's Parquet metadata the fingerprint it resumes by (input files,
budgets, options) and a provenance record (the command line, and the dump manifest's model, options
and command when the rows came from ``forcedweight dump``). ``results_provenance`` reads them back so
``report.md`` states the full settings and the command chain dump → certify → report, and the
report's own tables carry the same record in their Parquet metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight.certify.run import FINGERPRINT_KEY, PROVENANCE_KEY
from forcedweight.io import list_parquet_files

#: the Parquet (schema) metadata key of the provenance record in the report's own tables
REPORT_KEY = b"forcedweight.report.provenance"


def _metadata(path: Path) -> dict:
    try:
        return pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return {}


def results_provenance(results_path: str | os.PathLike) -> list[dict]:
    """One record per results file: ``{"file", "fingerprint", "provenance"}`` (None where absent)."""
    out = []
    for f in list_parquet_files(results_path):
        meta = _metadata(f)
        rec = {"file": str(f), "fingerprint": None, "provenance": None}
        for key, name in ((FINGERPRINT_KEY, "fingerprint"), (PROVENANCE_KEY, "provenance")):
            if key in meta:
                try:
                    rec[name] = json.loads(meta[key])
                except ValueError:
                    pass
        out.append(rec)
    return out


def settings_lines(records: list[dict]) -> list[str]:
    """Markdown bullet lines: certify options and budgets, the dump's model and options, the commands."""
    lines: list[str] = []
    for rec in records:
        fp, prov = rec.get("fingerprint") or {}, rec.get("provenance") or {}
        name = Path(rec["file"]).name
        if not fp and not prov:
            lines.append(f"- `{name}`: no settings recorded (written by another tool or an older version)")
            continue
        opts = fp.get("options") or {}
        if opts:
            shown = ", ".join(f"{k} = {v}" for k, v in opts.items())
            lines.append(f"- certify (`{name}`): budgets s = {fp.get('s_values')}; {shown}; "
                         f"skip_invalid = {fp.get('skip_invalid')}")
        dump = prov.get("dump")
        if dump:
            dopts = dump.get("options") or {}
            shown = ", ".join(f"{k} = {v}" for k, v in dopts.items())
            texts = dump.get("texts") or {}
            lines.append(f"- dump: model {dump.get('model')} ({dump.get('dtype')}), {texts.get('count')} texts "
                         f"(sha256 {str(texts.get('sha256'))[:12]}…), {dump.get('n_rows')} rows; {shown}")
        for step, cmd in (("dump", (dump or {}).get("command")), ("certify", prov.get("command"))):
            if cmd:
                lines.append(f"- {step} command: `{cmd}`")
    return lines


__all__ = ["REPORT_KEY", "results_provenance", "settings_lines"]
