"""Deployed eviction baselines scored on one row (docs/concepts.md).

- ``Random``: uniform scores from ``default_rng([seed, row_id])`` (deterministic per seed and row).
- ``StreamingLLM``: 4 attention sinks + the most recent keys (key index = position, as in a dump).
- ``KNorm``: score ``-||k_i||`` (keys with small norm kept); needs ``keys``.
- ``Quest``: pages of 16 consecutive keys; each page's upper bound on ``q.k`` from its per-channel
  min/max, ``sum_c max(q_c min_c, q_c max_c)``; pages kept by bound, then tokens inside a page by
  their own ``q.k`` (so a budget that is not a multiple of 16 ends on the best tokens of the last
  page); needs ``keys`` and ``query``.
- TOVA is top-mass on a single row (``forcedweight.selectors.mass.TOVA``).

H2O (accumulated attention over past queries) and SnapKV (an observation window of the last
queries, pooled) are defined over *several* query rows of a head, not one row: they are not
selectors of this interface and are scored where several rows of one head are available.
"""

from __future__ import annotations

import numpy as np

from forcedweight.core import scores
from forcedweight.core.operator import rank_order
from forcedweight.rows import keys_query_problem
from forcedweight.selectors.base import MissingInput, RowView, Selector


class Random(Selector):
    """Uniformly random kept set, reproducible from ``seed`` and the row id."""

    name = "random"

    def __init__(self, seed: int = 0, sinks: int = 0, recent: int = 0):
        super().__init__(sinks, recent)
        self.seed = int(seed)

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        return scores.uniform_random(row.n_keys, self.seed, row.row_id)


class StreamingLLM(Selector):
    """Keep the first ``sinks`` keys and the most recent ones: score = position."""

    name = "streaming"

    def __init__(self, sinks: int = 4, recent: int = 0):
        super().__init__(sinks, recent)

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        return scores.position(row.n_keys)


class KNorm(Selector):
    """Keep the keys of smallest L2 norm: score = ``-||k_i||``."""

    name = "knorm"
    needs = ("keys",)

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        return scores.knorm(row.keys)


def quest_page_bounds(keys: np.ndarray, query: np.ndarray, page_size: int = 16) -> np.ndarray:
    """Quest's per-page upper bound on ``q.k``, shape (ceil(N / page_size),)."""
    n = keys.shape[0]
    n_pages = -(-n // page_size)
    bounds = np.empty(n_pages)
    for g in range(n_pages):
        page = keys[g * page_size : (g + 1) * page_size]
        bounds[g] = np.maximum(query * page.min(axis=0), query * page.max(axis=0)).sum()
    return bounds


class Quest(Selector):
    """Query-aware page selection (page size 16), then the best tokens of the last page."""

    name = "quest"
    needs = ("keys", "query")

    def __init__(self, page_size: int = 16, sinks: int = 0, recent: int = 0):
        super().__init__(sinks, recent)
        self.page_size = int(page_size)

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        keys, query = row.keys, np.ravel(row.query)
        problem = keys_query_problem(keys.shape[0], keys.size, query.shape[0])
        if problem:
            raise MissingInput(f"quest: {problem}")
        n, ps = keys.shape[0], self.page_size
        bounds = quest_page_bounds(keys, query, ps)
        page_rank = np.empty(bounds.size, dtype=np.int64)
        page_rank[rank_order(bounds)] = np.arange(bounds.size)
        qk = keys @ query
        page = np.arange(n) // ps
        # rank of each token inside its page by q.k (ties: lower index)
        within = np.empty(n, dtype=np.int64)
        order = np.lexsort((np.arange(n), -qk, page))
        starts = np.searchsorted(page[order], page[order], side="left")
        within[order] = np.arange(n) - starts
        return -(page_rank[page] * ps + within).astype(np.float64)
