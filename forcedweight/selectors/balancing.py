"""Balancing: best-improvement 1-swaps from top-mass until none improves (docs/concepts.md).

The search itself is ``forcedweight.core.swaps.swap_search`` (the one 1-swap search, also used to
polish the exact solvers' incumbents); balancing starts it from the top-mass set.
"""

from __future__ import annotations

import numpy as np

from forcedweight.core import operator as op
from forcedweight.core.swaps import swap_search
from forcedweight.selectors.base import RowView, Selector


def balancing(p: np.ndarray, V: np.ndarray, s: int, candidates=None, max_swaps: int | None = None):
    """Best-improvement 1-swaps from the top-mass set.

    Parameters
    ----------
    p : (N,) float64 weights summing to 1.
    V : (N, d) float64 values.
    s : budget, 1 <= s <= N.
    candidates : optional index array: keys allowed to swap in (e.g. the candidate pool);
        ``None`` = all N keys.
    max_swaps : optional cap (default 10 N); E strictly decreases so the loop ends anyway.

    Returns
    -------
    kept : (s,) sorted int64 indices.
    swaps : int, the number of swaps applied.
    """
    p = np.asarray(p, dtype=np.float64)
    return swap_search(p, V, op.top_mass_set(p, s), candidates=candidates, max_swaps=max_swaps)


class Balancing(Selector):
    """Selector wrapper: score 1 on the balanced set, 0 elsewhere (the set depends on s).

    Parameters
    ----------
    candidates : "all" (every key may swap in) or an index array.
    """

    name = "balancing"

    def __init__(self, candidates="all", sinks: int = 0, recent: int = 0):
        super().__init__(sinks, recent)
        self.candidates = None if isinstance(candidates, str) and candidates == "all" else candidates

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        if s is None:
            raise ValueError("balancing needs the budget s")
        kept, _ = balancing(row.p, row.V, s, self.candidates)
        sc = np.zeros(row.n_keys)
        sc[kept] = 1.0
        return sc
