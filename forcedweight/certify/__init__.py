"""Certification (SPEC §5): the best kept subsets of a row, and what a solver proves about them.

options (``CertifyOptions``) → pool (candidate pool, ES_pool) → row (``certify_row``: selectors,
pool, solver, status; ``OUTPUT_COLUMNS``) → run (``certify_file``: shards, workers, Dask, resume).
``groups`` is frozen-head group voting under GQA; ``solvers/`` the exact solvers.
"""

from forcedweight.certify.row import OUTPUT_COLUMNS, CertifyOptions, certify_row, invalid_record, pool_for, run_solver
from forcedweight.certify.run import certify_file, run_certify

__all__ = ["OUTPUT_COLUMNS", "CertifyOptions", "certify_file", "certify_row", "invalid_record", "pool_for",
           "run_certify", "run_solver"]
