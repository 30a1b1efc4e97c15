"""The report: tables, figures and ``report.md`` from ``certify`` (and ``groups``) output.

metrics (load results, per-row metrics, the dropped-mass AUC) → tables → figures → markdown;
``build_report`` (in ``build``) runs them all.
"""

from forcedweight.report.build import build_report
from forcedweight.report.metrics import load_groups, load_results, row_metrics
from forcedweight.report.tables import compute_tables, group_summary, write_table

__all__ = ["build_report", "compute_tables", "group_summary", "load_groups", "load_results", "row_metrics",
           "write_table"]
