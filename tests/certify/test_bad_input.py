"""Bad input that used to reach a traceback or a wrong answer in certify (issue 16 items 6-8, 11)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forcedweight import rows
from forcedweight.certify import certify_file
from forcedweight.errors import InputError
from tests.certify.test_certify import OPTS, _rec, _write


def test_weights_near_the_float64_maximum_are_rescaled_exactly(tmp_path):
    # all weights 1e308 overflow their plain sum; after rescaling the row is the uniform row
    huge = _rec(0, 8, keys=False)
    huge["weights"] = np.full(8, 1e308)
    plain = dict(huge, weights=np.ones(8))
    a = certify_file(_write(tmp_path / "a.parquet", [huge]), tmp_path / "ra.parquet", [3], **OPTS)
    b = certify_file(_write(tmp_path / "b.parquet", [plain]), tmp_path / "rb.parquet", [3], **OPTS)
    ra, rb = pq.read_table(a).to_pylist()[0], pq.read_table(b).to_pylist()[0]
    assert np.isfinite(ra["es_top"]) and ra["status"] == rb["status"] == "optimal"
    for k in ("es_top", "es_best"):
        assert ra[k] == pytest.approx(rb[k], rel=1e-12)  # same row up to one rounding per weight
    assert ra["best_set"] == rb["best_set"]
    p, _ = rows.validate_row(huge["weights"], huge["values"], 3, 0)
    np.testing.assert_allclose(p, np.full(8, 1 / 8), rtol=1e-15)


@pytest.mark.parametrize("ids", [[0, 1, 1], [None, 0, 2]])
def test_duplicate_row_ids_are_refused_naming_the_row(tmp_path, ids):
    t = rows.make_row_table([_rec(i, 6, keys=False) for i in range(3)])
    t = t.append_column("row_id", pa.array(ids, type=pa.int64()))
    pq.write_table(t, tmp_path / "dup.parquet")
    dup = 1 if ids[1] == 1 else 0  # a null row_id at position 0 collides with the explicit 0
    with pytest.raises(InputError, match=f"row_id {dup} appears more than once"):
        certify_file(tmp_path / "dup.parquet", tmp_path / "o.parquet", [2], **OPTS)
    with pytest.raises(InputError, match=f"row_id {dup} appears more than once"):
        certify_file(tmp_path / "dup.parquet", tmp_path / "o.parquet", [2], skip_invalid=True, **OPTS)
    assert not (tmp_path / "o.parquet").exists()
