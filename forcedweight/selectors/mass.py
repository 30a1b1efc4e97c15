"""Top-mass: keep the s largest attention weights (docs/concepts.md); TOVA is the same rule on one row."""

from __future__ import annotations

import numpy as np

from forcedweight.core.scores import last_query_attention
from forcedweight.selectors.base import RowView, Selector


class TopMass(Selector):
    """Score = the weight ``p_i``; ties go to the lower index (as ``operator.top_mass_set``)."""

    name = "top-mass"

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        return row.p.copy()


class TOVA(TopMass):
    """TOVA keeps the keys the *current* query attends to most: on a single row (the last query row
    is the row itself), top-mass; scored by ``scores.last_query_attention``."""

    name = "tova"

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        return last_query_attention(row.p[None, :])
