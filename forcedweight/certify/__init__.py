"""Certification (docs/enumerate.md): the best kept subsets of a row, and what a solver proves about them.

options (``CertifyOptions``, the ``SOLVERS`` registry) → pool (the candidate pool, ``ES_pool``)
→ row (``certify_row`` in named steps) → record (the output schema, ``OUTPUT_COLUMNS``) → run
(``certify_file``: shards, workers, Dask, resume). ``enumerate`` is the exact pool enumeration,
``groups`` frozen-head group voting under GQA, ``solvers/`` the exact solvers.
"""

from forcedweight.certify.options import SOLVERS, CertifyOptions, run_solver
from forcedweight.certify.pool import candidate_pool, pool_best, pool_for
from forcedweight.certify.record import OUTPUT_COLUMNS, invalid_record, output_schema
from forcedweight.certify.row import certify_row
from forcedweight.certify.run import certify_file, run_certify

__all__ = ["OUTPUT_COLUMNS", "SOLVERS", "CertifyOptions", "candidate_pool", "certify_file", "certify_row",
           "invalid_record", "output_schema", "pool_best", "pool_for", "run_certify", "run_solver"]
