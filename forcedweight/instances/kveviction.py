"""PARTITION -> KVEVICTION (paper 000, §3): eviction instances whose answers are proved.

KVEVICTION asks: given keys K (n x d), a query q, values v, a compression ratio r and a tolerance
epsilon, is there a kept index set I with ``|I| = (1 - r) n`` such that the attention output over
the kept entries is within epsilon of the full one,
``| softmax(q K_I^T / sqrt d) v_I - softmax(q K^T / sqrt d) v | <= epsilon``?

The reduction from (balanced) PARTITION of integers ``a_1..a_n`` (n even) takes d = 1, every key
and the query equal to 1 (so every logit is ``q k / sqrt d = 1`` and attention is uniform), values
``v_i = a_i``, r = 1/2 (keep n/2 entries) and epsilon = 0. Uniform attention over I is the plain
mean, so the error of I is ``|sum_I a / (n/2) - T / n| = |2 sum_I a - T| / n``: the instance is a
yes-instance iff an equal-sum balanced split exists, and otherwise the smallest achievable error
is the stated ``gap = min |2 sum_I a - T| / n > epsilon``.

With uniform masses this error is exactly the forced-weight error E(I) of docs/concepts.md, so the rows
are ordinary attention rows (weights 1/n) that ``certify`` decides with ``s = n/2``; they carry
``keys``, ``query`` and ``logits`` for query-aware consumers, and ``r`` and ``epsilon`` columns.
The integers, kinds, proofs and seeding are those of :mod:`forcedweight.instances.partition`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pyarrow as pa

from forcedweight.io import output_lock
from forcedweight.instances.partition import (
    KINDS,
    PARTITION_FIELDS,
    _manifest,
    check_request,
    generate,
    instance_targets,
    partition_row,
    rows_table,
    write_instances,
)

#: Compression ratio (fraction evicted) and tolerance of the reduction.
RATIO = 0.5
EPSILON = 0.0

KVEVICTION_FIELDS = PARTITION_FIELDS + [
    pa.field("keys", pa.list_(pa.float64())),
    pa.field("query", pa.list_(pa.float64())),
    pa.field("logits", pa.list_(pa.float64())),
    pa.field("r", pa.float64()),
    pa.field("epsilon", pa.float64()),
]


def kveviction_row(inst: dict) -> dict:
    """The KVEVICTION row of an instance: d = 1, all-ones keys and query, logits all 1, r, epsilon.

    ``weights`` are the softmax of the logits (exactly uniform, 1/n); ``s = (1 - r) n = n/2``.
    """
    row = partition_row(inst)
    n = len(row["integers"])
    d = 1
    row["keys"] = [1.0] * (n * d)
    row["query"] = [1.0] * d
    row["logits"] = [1.0] * n  # q . k / sqrt(d)
    row["r"] = RATIO
    row["epsilon"] = EPSILON
    return row


def write_kveviction(out_dir: str | Path, m: int, count: int, seed: int, bits: int | None = None,
                     kinds: Iterable[str] | str = KINDS, progress: bool = False, even_total: bool = True) -> Path:
    """Generate and write ``out_dir/kveviction-m{m}.parquet`` plus a JSON manifest beside it
    (``even_total``: see ``partition.make_instance``)."""
    bits, kinds, seed = check_request(m, count, seed, bits, kinds, even_total)
    parquet, _ = instance_targets(out_dir, f"kveviction-m{m}")  # before any work
    with output_lock(parquet, "instances"):
        rows = [kveviction_row(inst) for inst in generate(m, count, seed, bits, kinds, progress, even_total)]
        manifest = _manifest("partition-to-kveviction (paper 000)", m, count, seed, bits, kinds, rows)
        manifest.update(even_total=bool(even_total), d=1, r=RATIO, epsilon=EPSILON,
                        question="exists I, |I| = (1 - r) n, with |attn(q, K_I, v_I) - attn(q, K, v)| <= epsilon")
        return write_instances(rows_table(rows, KVEVICTION_FIELDS), out_dir, f"kveviction-m{m}", manifest)
