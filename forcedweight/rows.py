"""The attention-row contract (docs/concepts.md): Arrow schema, validation, streaming Parquet I/O.

One row is one query's attention over N keys in one head: weights ``p`` (N,) and values
``V`` (N, value_dim). Analysis always happens in float64 on renormalised weights.

Everything here streams: a file or a directory of Parquet files is read row group by row
group, so a dump larger than memory is never loaded whole. Writes are atomic: a temporary
file in the destination directory, renamed over the target on success.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight.errors import InputError, RowError
from forcedweight.io import check_column_types, check_dump_complete, list_parquet_files, open_parquet, read_guard

REQUIRED_COLUMNS = ("weights", "values", "value_dim")
PROVENANCE_COLUMNS = ("model", "text_id", "layer", "head", "kv_head", "query_pos", "n_keys")
ARRAY_COLUMNS = ("logits", "keys", "query")
# Optional provenance (null when not applicable): the sliding window W of the row's layer (the row
# then holds keys query_pos - n_keys + 1 .. query_pos), and the learned sink's share of the model's
# softmax (gpt-oss; the row's weights are renormalised over its keys).
OPTIONAL_PROVENANCE_COLUMNS = ("window", "sink_mass")


#: the largest |value| accepted: squared distances summed over dims must stay below 1.8e308
MAX_VALUE = 1e150


def row_schema(weights_type: pa.DataType = pa.float32(), with_keys: bool = False) -> pa.Schema:
    """Arrow schema of rows written by ``dump`` (required columns, provenance, optional arrays)."""
    fields = [
        pa.field("row_id", pa.int64()),
        pa.field("weights", pa.list_(weights_type)),
        pa.field("values", pa.list_(weights_type)),
        pa.field("value_dim", pa.int32()),
        pa.field("model", pa.string()),
        pa.field("text_id", pa.int64()),
        pa.field("layer", pa.int32()),
        pa.field("head", pa.int32()),
        pa.field("kv_head", pa.int32()),
        pa.field("query_pos", pa.int32()),
        pa.field("n_keys", pa.int32()),
        pa.field("window", pa.int32()),
        pa.field("sink_mass", pa.float64()),
    ]
    if with_keys:
        fields += [pa.field(name, pa.list_(weights_type)) for name in ARRAY_COLUMNS]
    return pa.schema(fields)


@dataclass
class Row:
    """One validated attention row.

    Attributes
    ----------
    row_id : int
    p : ndarray, shape (N,), float64, non-negative, sums to 1 (renormalised).
    V : ndarray, shape (N, d_v), float64.
    extra : dict
        Every other column of the input row (provenance, keys/query/logits as lists,
        unknown columns), carried through untouched.
    """

    row_id: int
    p: np.ndarray
    V: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_keys(self) -> int:
        return int(self.p.shape[0])

    def array(self, name: str) -> np.ndarray | None:
        """``keys`` as (N, d), ``query`` as (d,), ``logits`` as (N,) in float64, or None."""
        raw = self.extra.get(name)
        if raw is None:
            return None
        arr = np.asarray(raw, dtype=np.float64)
        if name == "keys":
            n = self.n_keys
            check_keys_query(n, arr.size, None, self.row_id)
            arr = arr.reshape(n, arr.size // n)
        return arr


@dataclass
class InvalidRow:
    """A row that failed validation, kept so that ``--skip-invalid`` can record it."""

    row_id: int
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


def validate_row(weights: Any, values: Any, value_dim: Any, row_id: int, source: str | None = None):
    """Check one row against the contract and return ``(p, V)`` in float64.

    Parameters
    ----------
    weights : sequence of float, length N
    values : sequence of float, length N * value_dim (row-major)
    value_dim : int
    row_id : int
        Used in the error message.

    Returns
    -------
    p : ndarray (N,) float64, renormalised to sum 1
    V : ndarray (N, value_dim) float64

    Raises
    ------
    RowError
        NaN/inf, negative or all-zero weights, a length mismatch, a missing field.
    """
    if weights is None:
        raise RowError(row_id, "weights is null", source)
    if values is None:
        raise RowError(row_id, "values is null", source)
    if value_dim is None:
        raise RowError(row_id, "value_dim is null", source)
    p = np.asarray(weights, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    n = p.shape[0]
    d = int(value_dim)
    if n == 0:
        raise RowError(row_id, "weights is empty (N = 0)", source)
    if d < 1:
        raise RowError(row_id, f"value_dim must be >= 1, got {d}", source)
    if not np.all(np.isfinite(p)):
        raise RowError(row_id, "weights contain NaN or inf", source)
    if np.any(p < 0):
        raise RowError(row_id, f"weights contain a negative value (min {p.min():.3g})", source)
    peak = p.max()
    if not peak > 0:
        raise RowError(row_id, "weights are all zero", source)
    # divide by the largest weight before summing: weights near the float64 maximum (1e308) would
    # overflow their sum to inf; p / peak is exact to one rounding and the sum of N <= 2^53 terms in
    # [0, 1] is finite, so the renormalised row is the same as for any common scale of the weights
    p = p / peak
    total = p.sum()
    if v.shape[0] != n * d:
        raise RowError(
            row_id, f"values has length {v.shape[0]}, expected N*value_dim = {n}*{d} = {n * d}", source
        )
    if not np.all(np.isfinite(v)):
        raise RowError(row_id, "values contain NaN or inf", source)
    big = np.abs(v).max(initial=0.0)
    if big > MAX_VALUE:
        raise RowError(row_id, f"values reach {big:.3g}; beyond ±{MAX_VALUE:g} the squared distances of the "
                       "operator overflow float64 (rescale the values)", source)
    p = p / total
    if np.any((p > 0) & (p < np.finfo(np.float64).tiny)):  # (float32 captures never come near: >= 1.4e-45)
        raise RowError(row_id, "weights hold subnormal masses (below 2.2e-308 of the row's total); their "
                               "contributions p_i (v_i - mu) keep only a few bits in float64: set them to 0", source)
    return p, v.reshape(n, d)


def validate_budget(s: int, n: int, row_id: int, source: str | None = None) -> None:
    """Raise RowError unless 1 <= s <= N."""
    if s < 1:
        raise RowError(row_id, f"budget s={s} is below 1", source)
    if s > n:
        raise RowError(row_id, f"budget s={s} exceeds N={n}", source)


def keys_query_problem(n: int, keys_len: int | None, query_len: int | None) -> str | None:
    """What is wrong with a row's ``keys`` / ``query`` lengths (None = nothing, or absent).

    ``keys`` (flattened) must be a non-empty multiple of N (its key dim ``d_k = len / N``) and
    ``query``, when present with keys, of length ``d_k``.
    """
    if keys_len is None:
        return None
    if n <= 0 or keys_len == 0 or keys_len % n:
        return f"keys length {keys_len} is not a multiple of N={n}"
    if query_len is not None and query_len != keys_len // n:
        return f"query length {query_len} differs from the key dim {keys_len // n}"
    return None


def check_keys_query(n: int, keys_len: int | None, query_len: int | None, row_id: int,
                     source: str | None = None) -> None:
    """Raise RowError (naming the row) when ``keys_query_problem`` finds something."""
    reason = keys_query_problem(n, keys_len, query_len)
    if reason is not None:
        raise RowError(row_id, reason, source)


def check_columns(path: Path, schema: pa.Schema, required: Sequence[str] = REQUIRED_COLUMNS) -> None:
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise InputError(f"{path}: missing required column(s) {', '.join(missing)}")
    check_column_types(path, schema, {"row_id": "integers", "value_dim": "integers", "weights": "lists of numbers",
                                      "values": "lists of numbers", "keys": "lists of numbers",
                                      "query": "lists of numbers"})  # the contract's types


def iter_batches(
    path: str | os.PathLike,
    columns: Sequence[str] | None = None,
    required: Sequence[str] = REQUIRED_COLUMNS,
) -> Iterator[tuple[Path, int, pa.RecordBatch]]:
    """Stream ``(file, first_position, batch)`` over a file or directory, one row group at a time.

    ``first_position`` is the global position (over all files, in sorted order) of the batch's
    first row; it is the row id of rows that carry no ``row_id`` column.
    """
    position = 0
    for file in list_parquet_files(path):
        pf = open_parquet(file)
        check_columns(file, pf.schema_arrow, required)
        cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
        for rg in range(pf.num_row_groups):
            with read_guard(file):
                batch_table = pf.read_row_group(rg, columns=cols)
            for batch in batch_table.to_batches():
                yield file, position, batch
                position += batch.num_rows


def count_rows(path: str | os.PathLike) -> int:
    """Total rows over a file or directory, from Parquet metadata only."""
    return sum(open_parquet(f).metadata.num_rows for f in list_parquet_files(path))


def iter_rows(path: str | os.PathLike, skip_invalid: bool = False) -> Iterator[Row | InvalidRow]:
    """Stream validated rows. Invalid rows raise RowError, or come back as InvalidRow when skipping."""
    for file, start, batch in iter_batches(path):
        for row in rows_from_batch(batch, start, source=str(file), skip_invalid=skip_invalid):
            yield row


def rows_by_id(path: str | os.PathLike, ids) -> dict[int, Row]:
    """The valid rows of a file or directory whose ``row_id`` is in ``ids``, keyed by it (one streaming
    pass; invalid rows and ids not found are left out)."""
    wanted = {int(i) for i in ids}
    return {r.row_id: r for r in iter_rows(path, skip_invalid=True) if isinstance(r, Row) and r.row_id in wanted}


def rows_from_batch(
    batch: pa.RecordBatch | pa.Table, start: int = 0, source: str | None = None, skip_invalid: bool = False
) -> list[Row | InvalidRow]:
    """Validate the rows of one Arrow batch; row ids come from ``row_id`` or from ``start + i``."""
    data = batch.to_pydict()
    n = batch.num_rows
    ids = data.get("row_id") or [None] * n
    out: list[Row | InvalidRow] = []
    for i in range(n):
        rid = ids[i] if ids[i] is not None else start + i
        extra = {k: v[i] for k, v in data.items() if k not in ("weights", "values", "row_id")}
        try:
            p, V = validate_row(data["weights"][i], data["values"][i], data["value_dim"][i], rid, source)
        except RowError as exc:
            if not skip_invalid:
                raise
            out.append(InvalidRow(int(rid), exc.reason, extra))
            continue
        out.append(Row(int(rid), p, V, extra))
    return out


def make_row_table(rows: Sequence[dict[str, Any]], schema: pa.Schema | None = None) -> pa.Table:
    """Build a Table from a list of row dicts (``weights``/``values`` as arrays or lists)."""
    cols: dict[str, list] = {}
    for r in rows:
        for k in r:
            cols.setdefault(k, [])
    for r in rows:
        for k in cols:
            v = r.get(k)
            cols[k].append(v.tolist() if isinstance(v, np.ndarray) else v)
    if schema is not None:
        names = [f.name for f in schema if f.name in cols]
        extra = [k for k in cols if k not in names]
        table = pa.table({n: pa.array(cols[n], type=schema.field(n).type) for n in names})
        for k in extra:
            table = table.append_column(k, pa.array(cols[k]))
        return table
    return pa.table(cols)


def read_table(path: str | os.PathLike, columns: Sequence[str] | None = None) -> pa.Table:
    """Read a whole (small) Parquet file or directory — for results tables, not for dumps."""
    tables = []
    for file in list_parquet_files(path):
        pf = open_parquet(file)
        cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
        with read_guard(file):
            tables.append(pf.read(columns=cols))
    return pa.concat_tables(tables, promote_options="default")


def load_rows(path: str | os.PathLike, allow_incomplete: bool = False):
    """The rows of a dump directory (or a Parquet file) as one polars LazyFrame, sidecars left out.

    ``pl.scan_parquet(DIR)`` would also read ``texts.parquet`` and ``stats-*.parquet`` (other
    schemas) and trip on ``manifest.json``; this scans the row shards only (``io.list_parquet_files``),
    with the columns of the row contract (``weights`` list (N,), ``values`` list (N * value_dim,),
    ``value_dim``, provenance). An unfinished dump is refused unless ``allow_incomplete``.

    Example: ``load_rows("dumps/default/rows").filter(pl.col("layer") == 3).collect()``.
    """
    import polars as pl

    check_dump_complete(path, allow_incomplete)
    files = [str(f) for f in list_parquet_files(path)]
    return pl.scan_parquet(files)
