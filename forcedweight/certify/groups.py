"""Frozen-head group voting under GQA (docs/report.md): one kept set shared by a KV group's query heads.

For each KV group ``(model, text_id, layer, kv_head, query_pos)`` of dumped rows with G query
heads present, and each subset H of those heads with ``2 <= |H| = g <= G``, the shared kept set
is the top-s keys of the summed weights ``sum_{h in H} p_h`` (ties to the lower index). Each
member head h then pays

- ``cost_top  = E_h(shared) / E_h(own top-mass set)``,
- ``cost_pool = E_h(shared) / ES_pool_h`` (``certify.pool.pool_best``: the pool certify uses,
  shrunk the same way when ``C(pool, s)`` exceeds ``pool_max_subsets``),

both ``nan`` when the denominator is 0 (undefined). When a group has more than ``max_subsets``
subsets of one size, a seeded random sample of ``max_subsets`` distinct subsets of that size is
used (seed from ``seed`` and the group key, so the sample does not depend on file order).
Member rows with ``N <= s`` (every set keeps everything) are skipped.

Heads of one group must share the query position: dump with ``--all-positions`` (positions are
sampled per head otherwise, and such groups end up with a single head and are skipped).
"""

from __future__ import annotations

import math
import os
import zlib
from itertools import combinations
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from forcedweight.certify.pool import MAX_SUBSETS, pool_best
from forcedweight.core import operator as op
from forcedweight.errors import InputError, RowError, check_seed
from forcedweight.io import check_dump_complete, check_output_file, list_parquet_files, open_parquet, output_lock, progress as progress_bar, read_guard, write_table_atomic
from forcedweight.rows import Row, iter_batches, rows_from_batch
from forcedweight.core.stats import selector_ratio

GROUP_KEY = ("model", "text_id", "layer", "kv_head", "query_pos")
NEEDED = ("text_id", "layer", "head", "kv_head", "query_pos")

OUTPUT_SCHEMA = pa.schema([
    ("model", pa.string()), ("text_id", pa.int64()), ("layer", pa.int64()), ("kv_head", pa.int64()),
    ("query_pos", pa.int64()), ("subset", pa.string()), ("g", pa.int64()), ("head", pa.int64()),
    ("row_id", pa.int64()), ("s", pa.int64()), ("n_keys", pa.int64()), ("es_shared", pa.float64()),
    ("es_top", pa.float64()), ("es_pool", pa.float64()), ("cost_top", pa.float64()), ("cost_pool", pa.float64()),
])


def head_subsets(heads: Sequence[int], g: int, max_subsets: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """All g-subsets of ``heads`` (sorted tuples), or ``max_subsets`` distinct ones sampled at random."""
    heads = sorted(heads)
    total = math.comb(len(heads), g)
    if total <= max_subsets:
        return list(combinations(heads, g))
    chosen: set[tuple[int, ...]] = set()
    while len(chosen) < max_subsets:
        chosen.add(tuple(sorted(rng.choice(heads, size=g, replace=False).tolist())))
    return sorted(chosen)


def shared_set(ps: Sequence[np.ndarray], s: int) -> np.ndarray:
    """Top-s keys of the summed weights of the heads (each ``p`` of shape (N,)); sorted (s,) int64."""
    return op.top_mass_set(np.sum(ps, axis=0), s)


def group_records(
    key: dict, rows: Sequence[Row], s_values: Sequence[int], pool_mass: int = 12, pool_error: int = 8,
    max_subsets: int = 64, seed: int = 0, pool_max_subsets: int = MAX_SUBSETS,
) -> list[dict]:
    """Records of one KV group: one per (subset, member head, s) for subsets of size 2..G.

    Parameters
    ----------
    key : the group's ``GROUP_KEY`` values.
    rows : the group's rows (one per query head; ``extra["head"]`` names it), equal N.
    """
    by_head: dict[int, Row] = {}
    for r in rows:
        h = int(r.extra["head"])
        if h in by_head:
            raise RowError(r.row_id, f"head {h} appears twice in KV group {key}")
        by_head[h] = r
    n = {r.n_keys for r in rows}
    if len(n) > 1:
        raise RowError(rows[0].row_id, f"rows of KV group {key} have different key counts {sorted(n)}")
    heads = sorted(by_head)
    if len(heads) < 2:
        return []
    n_keys = n.pop()
    ident = [zlib.crc32(str(key["model"]).encode()), *(int(key[k]) for k in GROUP_KEY[1:])]
    # the subsets of each size g, drawn once from (seed, group key, g): the same for every budget s
    subsets = {g: head_subsets(heads, g, max_subsets, np.random.default_rng([int(seed), *ident, g]))
               for g in range(2, len(heads) + 1)}
    out = []
    A = {h: op.centred_contributions(by_head[h].p, by_head[h].V) for h in heads}
    for s in s_values:
        if n_keys <= s:
            continue
        es_top = {h: op.forced_error(by_head[h].p, by_head[h].V, op.top_mass_set(by_head[h].p, s), A=A[h]) for h in heads}
        es_pool = {h: pool_best(by_head[h].p, by_head[h].V, s, pool_mass, pool_error, pool_max_subsets)[0]
                   for h in heads}
        for g in range(2, len(heads) + 1):
            for subset in subsets[g]:
                S = shared_set([by_head[h].p for h in subset], s)
                label = ",".join(str(h) for h in subset)
                for h in subset:
                    e = op.forced_error(by_head[h].p, by_head[h].V, S, A=A[h])
                    out.append({
                        **key, "subset": label, "g": g, "head": h, "row_id": by_head[h].row_id, "s": int(s),
                        "n_keys": n_keys, "es_shared": e, "es_top": es_top[h], "es_pool": es_pool[h],
                        "cost_top": float(selector_ratio(e, es_top[h])),
                        "cost_pool": float(selector_ratio(e, es_pool[h])),
                    })
    return out


def _group_sizes(path) -> dict[tuple, int]:
    """Rows per KV group, from the provenance columns only (first pass)."""
    frames = []
    for f in list_parquet_files(path):
        pf = open_parquet(f)
        missing = [c for c in NEEDED if c not in pf.schema_arrow.names]
        if missing:
            raise InputError(f"{f}: missing provenance column(s) {', '.join(missing)} needed for group voting (dump rows)")
        cols = [c for c in GROUP_KEY if c in pf.schema_arrow.names]
        lf = pl.scan_parquet(f).select(cols)
        if "model" not in cols:
            lf = lf.with_columns(pl.lit("").alias("model"))
        frames.append(lf.select(pl.col("model").cast(pl.Utf8).fill_null(""), *[pl.col(c).cast(pl.Int64) for c in GROUP_KEY[1:]]))
    with read_guard(path):
        df = pl.concat(frames).group_by(list(GROUP_KEY)).len().collect()
    return {tuple(r[:-1]): r[-1] for r in df.iter_rows()}


def _vote(rows_path, sizes: dict, pending: dict, records: list, s_values, pool_mass, pool_error, max_subsets,
          seed, pool_max_subsets, advance) -> None:
    """Stream the rows, gather each KV group's heads, and append its records when it is whole."""
    for file, start, batch in iter_batches(rows_path):
        for row in rows_from_batch(batch, start, source=str(file)):
            model = row.extra.get("model")
            nulls = [c for c in NEEDED if row.extra.get(c) is None]
            if nulls:
                raise RowError(row.row_id, f"provenance {', '.join(nulls)} is null", str(file))
            k = ("" if model is None else str(model), *(int(row.extra[c]) for c in GROUP_KEY[1:]))
            pending.setdefault(k, []).append(row)
            if len(pending[k]) == sizes[k]:
                group = pending.pop(k)
                records.extend(group_records(dict(zip(GROUP_KEY, k)), group, s_values, pool_mass, pool_error,
                                              max_subsets, seed, pool_max_subsets))
                advance()


def group_voting(
    rows_path: str | os.PathLike,
    s_values: Sequence[int],
    out: str | os.PathLike,
    pool_mass: int = 12,
    pool_error: int = 8,
    max_subsets: int = 64,
    seed: int = 0,
    pool_max_subsets: int = MAX_SUBSETS,
    allow_incomplete: bool = False,
    progress: bool = True,
) -> Path:
    """Group-voting costs of every KV group in dumped rows; writes one Parquet file atomically.

    Parameters
    ----------
    rows_path : rows Parquet file or directory (``dump`` output: weights, values, provenance).
    s_values : budgets.
    out : output Parquet file, one record per (group, subset, member head, s); columns
        ``OUTPUT_SCHEMA`` (``subset`` is the comma-joined head list, ``g`` its size).
    pool_mass, pool_error : candidate pool for ``ES_pool`` (as in ``certify``).
    max_subsets : cap on head subsets per group and size g (sampled with ``seed`` above it).
    pool_max_subsets : cap on C(pool, s) for ``ES_pool`` (certify's ``--max-subsets``).
    progress : a progress bar over the KV groups (rows of every head at one position) on stderr.

    Returns
    -------
    Path of ``out``.
    """
    s_values = sorted({int(s) for s in s_values})
    if not s_values or s_values[0] < 1:
        raise InputError(f"--s: budgets must be >= 1, got {s_values}")
    if max_subsets < 1:
        raise InputError(f"--max-subsets must be >= 1, got {max_subsets}")
    if pool_max_subsets < 1:
        raise InputError(f"pool_max_subsets must be >= 1, got {pool_max_subsets}")
    if pool_mass < 0 or pool_error < 0:
        raise InputError(f"--pool-mass and --pool-error must be >= 0, got {pool_mass} and {pool_error}")
    check_seed(seed)
    src, out = Path(rows_path), Path(out)
    check_dump_complete(rows_path, allow_incomplete)
    if src.is_dir() and src.resolve() in out.resolve().parents:
        raise InputError(f"{out}: output inside the input directory {src} would be read as input")
    with output_lock(out, "groups"):
        check_output_file(out)
        sizes = _group_sizes(rows_path)
        pending: dict[tuple, list[Row]] = {}
        records: list[dict] = []
        with progress_bar("groups", enabled=progress, transient=True) as bar:
            task = bar.add_task("KV groups", total=len(sizes))
            _vote(rows_path, sizes, pending, records, s_values, pool_mass, pool_error, max_subsets, seed,
                  pool_max_subsets, lambda: bar.advance(task))
        if not records:
            raise InputError(
                f"{rows_path}: no KV group has two or more query heads at one query position with N > s "
                "(dump with --all-positions and every head of a KV group)"
            )
        cols = {f.name: [r[f.name] for r in records] for f in OUTPUT_SCHEMA}
        table = pa.table({name: pa.array(v, type=OUTPUT_SCHEMA.field(name).type) for name, v in cols.items()}, schema=OUTPUT_SCHEMA)
        return write_table_atomic(table, out)
