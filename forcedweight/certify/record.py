"""THE certify output schema: one record per (row, s), its columns and their Arrow types.

``OUTPUT_COLUMNS`` lists the fixed columns in order with their Arrow type names; after them come
the input's carried columns (provenance and unknown columns: everything but the row arrays and
the columns certify computes itself). ``make_record`` assembles a certified record (the derived
metrics come from ``core.stats``), ``invalid_record`` the record of a bad (row, s) under
``--skip-invalid``, ``records_to_table`` a table of ``output_schema``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from forcedweight.core import operator as op
from forcedweight.core.stats import balancing_recovery, closable_share

#: input columns never carried into the output (the row arrays and recomputed ids)
DROPPED_COLUMNS = ("weights", "values", "keys", "query", "logits", "row_id", "n_keys")

#: the fixed output columns, in order, with their Arrow types (``ARROW_TYPES``)
OUTPUT_COLUMNS = (
    ("row_id", "int64"), ("s", "int64"), ("n_keys", "int64"),
    ("es_top", "float64"), ("es_balance", "float64"), ("swaps", "int64"),
    ("es_pool", "float64"), ("pool_size", "int64"),
    ("es_best", "float64"), ("best_set", "list<int64>"), ("best_by", "string"),
    ("lower_bound", "float64"), ("bound_gap", "float64"), ("status", "string"), ("proved", "bool"), ("solver", "string"),
    ("solver_improved", "bool"),
    ("closable_share", "float64"), ("balancing_recovery", "float64"), ("dropped_mass", "float64"),
    ("ef_top", "float64"), ("pi_top", "float64"), ("pi_best", "float64"),
    ("es_geometric", "float64"), ("es_free_geometry", "float64"), ("es_leverage", "float64"), ("es_random", "float64"),
    ("es_streaming", "float64"), ("es_knorm", "float64"), ("es_quest", "float64"),
    ("seconds", "float64"), ("reason", "string"),
)
ARROW_TYPES = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_(),
               "list<int64>": pa.list_(pa.int64())}
_OUTPUT_NAMES = frozenset(name for name, _ in OUTPUT_COLUMNS)


def _carried(name: str) -> bool:
    return name not in DROPPED_COLUMNS and name not in _OUTPUT_NAMES


def carried_columns(extra: dict) -> dict:
    """The input columns carried into the output (provenance and unknown columns)."""
    return {k: v for k, v in extra.items() if _carried(k)}


def output_schema(input_schema: pa.Schema | None = None) -> pa.Schema:
    """The fixed output columns, then the input's carried (provenance/unknown) columns."""
    fields = [pa.field(name, ARROW_TYPES[t]) for name, t in OUTPUT_COLUMNS]
    if input_schema is not None:
        fields += [f for f in input_schema if _carried(f.name)]
    return pa.schema(fields)


def records_to_table(records: list[dict], input_schema: pa.Schema | None) -> pa.Table:
    """Output records (``certify_row`` dicts) as an Arrow table of ``output_schema``."""
    schema = output_schema(input_schema)
    return pa.table({f.name: pa.array([r.get(f.name) for r in records], type=f.type) for f in schema},
                    schema=schema)


def invalid_record(row_id: int, s: int, reason: str, extra: dict | None = None, n_keys: int | None = None) -> dict:
    """The output record of a bad (row, s) under ``--skip-invalid``."""
    rec: dict[str, Any] = {name: None for name, _ in OUTPUT_COLUMNS}
    rec.update(row_id=int(row_id), s=int(s), n_keys=n_keys, status="invalid", proved=False, reason=reason)
    rec.update(carried_columns(extra or {}))
    return rec


def penalties(p: np.ndarray, V: np.ndarray, top: np.ndarray, best_set: np.ndarray,
              es_top: float, es_best: float) -> dict:
    """``ef_top``, ``pi_top``, ``pi_best`` of a row (p (N,), V (N, d)) with ``operator.penalty_ratio``'s round-off floor."""
    ef_top = op.free_weight_error(p, V, top)
    ef_best = op.free_weight_error(p, V, best_set)
    scale = op.penalty_scale(p, V)
    return {"ef_top": ef_top, "pi_top": op.penalty_ratio(es_top, ef_top, scale),
            "pi_best": op.penalty_ratio(es_best, ef_best, scale)}


def proof_gap(es_best: float, lower_bound: float) -> float:
    """``(es_best - lower_bound) / es_best``: 0 when proved, 1 when nothing above 0 is; 0 when es_best = 0."""
    if not es_best > 0:
        return 0.0
    return float(min(max((es_best - max(lower_bound, 0.0)) / es_best, 0.0), 1.0))


def make_record(row_id: int, s: int, n_keys: int, *, es_top: float, es_balance: float, swaps: int,
                es_pool: float, pool_size: int, es_best: float, best_set, best_by: str,
                lower_bound: float, status: str, proved: bool, solver: str, solver_improved: bool,
                dropped_mass: float, penalty: dict, selector_errors: dict, seconds: float,
                reason: str | None, extra: dict) -> dict:
    """One certified output record: the ``OUTPUT_COLUMNS`` in order, then the carried columns.

    ``closable_share`` and ``balancing_recovery`` are ``core.stats``'s (the report uses the same);
    ``gap`` is ``proof_gap(es_best, lower_bound)``.
    """
    rec = {
        "row_id": int(row_id), "s": int(s), "n_keys": int(n_keys),
        "es_top": es_top, "es_balance": es_balance, "swaps": int(swaps),
        "es_pool": es_pool, "pool_size": int(pool_size),
        "es_best": es_best, "best_set": [int(i) for i in best_set], "best_by": best_by,
        "lower_bound": float(lower_bound), "bound_gap": proof_gap(es_best, lower_bound), "status": status, "proved": bool(proved), "solver": solver,
        "solver_improved": bool(solver_improved),
        "closable_share": float(closable_share(es_top, es_best)),
        "balancing_recovery": float(balancing_recovery(es_top, es_balance, es_best)),
        "dropped_mass": dropped_mass,
        **penalty,
        **selector_errors,
        "seconds": seconds, "reason": reason,
    }
    rec.update(carried_columns(extra))
    return rec


__all__ = ["ARROW_TYPES", "DROPPED_COLUMNS", "OUTPUT_COLUMNS", "carried_columns", "invalid_record",
           "make_record", "output_schema", "proof_gap", "penalties", "records_to_table"]
