"""report.md and the report's tables record the full settings and the command chain dump → certify → report."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from forcedweight import rows
from forcedweight.certify import CertifyOptions, certify_file
from forcedweight.certify.run import PROVENANCE_KEY
from forcedweight.report import build_report
from forcedweight.report.provenance import REPORT_KEY, results_provenance


def _dump_dir(tmp_path, n_rows=12, n=14, d=3):
    rng = np.random.default_rng(0)
    recs = []
    for i in range(n_rows):
        p = rng.dirichlet(np.full(n, 0.5))
        recs.append(dict(row_id=i, weights=p, values=rng.normal(size=(n, d)).ravel(), value_dim=d,
                         model="m", text_id=i % 2, layer=i % 3, head=0, kv_head=0, query_pos=n - 1, n_keys=n))
    rows_dir = tmp_path / "dump" / "rows"
    rows_dir.mkdir(parents=True)
    pq.write_table(rows.make_row_table(recs), rows_dir / "part-0.parquet")
    manifest = dict(model="m", dtype="float32", options=dict(layers=[0, 1, 2], positions=4, seed=3),
                    texts=dict(count=2, sha256="ab" * 32), n_rows=n_rows, complete=True,
                    command="forcedweight dump --model m --positions 4 --seed 3 --out dump/rows")
    (tmp_path / "dump" / "manifest.json").write_text(json.dumps(manifest))
    return rows_dir


def test_report_records_settings_and_commands(tmp_path):
    rows_dir = _dump_dir(tmp_path)
    res = certify_file(rows_dir, tmp_path / "res.parquet", [4], CertifyOptions(solver="bnb", time_limit=5.0,
                       node_limit=100000, pool_mass=6, pool_error=3, seed=7), progress=False)
    prov = json.loads(pq.read_schema(res).metadata[PROVENANCE_KEY])
    assert prov["dump"]["command"].startswith("forcedweight dump --model m")
    assert prov["dump"]["options"] == {"layers": [0, 1, 2], "positions": 4, "seed": 3}
    recs = results_provenance(res)
    assert recs[0]["fingerprint"]["options"]["pool_mass"] == 6 and recs[0]["fingerprint"]["s_values"] == [4]

    md = build_report(res, tmp_path / "rep", n_boot=20, command="forcedweight report res.parquet --out rep").read_text()
    settings = md.split("## Settings", 1)[1].split("## ", 1)[0]
    for text in ("solver = bnb", "time_limit = 5.0", "node_limit = 100000", "pool_mass = 6", "pool_error = 3",
                 "seed = 7", "budgets s = [4]", "model m (float32), 2 texts", "positions = 4",
                 "dump command: `forcedweight dump --model m", "certify command: `"):
        assert text in settings, text
    assert "forcedweight report res.parquet --out rep" in md
    meta = json.loads(pq.read_schema(tmp_path / "rep" / "tables" / "medians.parquet").metadata[REPORT_KEY])
    assert meta["report_command"] == "forcedweight report res.parquet --out rep"
    assert meta["inputs"][0]["provenance"]["dump"]["options"]["seed"] == 3


def test_results_without_provenance_say_so(tmp_path):
    rows_dir = _dump_dir(tmp_path)
    res = certify_file(rows_dir, tmp_path / "res.parquet", [4], CertifyOptions(solver="bnb", time_limit=5.0),
                       progress=False)
    bare = pq.read_table(res).replace_schema_metadata({})
    pq.write_table(bare, tmp_path / "bare.parquet")
    md = build_report(tmp_path / "bare.parquet", tmp_path / "rep", n_boot=20).read_text()
    assert "no settings recorded" in md
