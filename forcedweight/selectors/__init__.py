"""Selectors (docs/concepts.md): each returns a kept set of size s for a row.

Every selector is a small class with a ``name`` and ``select(row, s) -> (s,) int64`` (sorted)
built on ``score(row) -> (N,) float64`` (higher = keep; ties to the lower index). Rows may be a
``rows.Row``, a ``RowView`` or a ``(p, V)`` tuple.
"""

from forcedweight.selectors.balancing import Balancing, balancing
from forcedweight.selectors.baselines import KNorm, Quest, Random, StreamingLLM, quest_page_bounds
from forcedweight.selectors.base import MissingInput, RowView, Selector, as_view, top_scores
from forcedweight.selectors.free_geometry import FreeGeometry, free_geometry_order
from forcedweight.selectors.geometric import Geometric, farthest_point_order
from forcedweight.selectors.leverage import Leverage, leverage_scores
from forcedweight.selectors.mass import TOVA, TopMass

__all__ = [
    "Balancing", "FreeGeometry", "Geometric", "KNorm", "Leverage", "MissingInput", "Quest", "Random", "RowView",
    "Selector", "StreamingLLM", "TOVA", "TopMass", "as_view", "balancing", "farthest_point_order", "free_geometry_order",
    "leverage_scores", "quest_page_bounds", "top_scores",
]
