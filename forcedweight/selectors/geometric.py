"""Geometric selection: keys chosen by the geometry of V alone, then forced weights (docs/concepts.md).

Choice: greedy farthest-point traversal on the value vectors (Euclidean), started from the value
farthest from the (unweighted) mean of V. Farthest-point sampling is the standard cheap cover of a
point cloud; its first picks are hull extremes, which is what the paper's bound on EF(d + 1) points
at, and unlike an exact hull it is defined for every s and every d. The masses play no part
(ties: lower index). The error is the forced-weight error of the chosen set.
"""

from __future__ import annotations

import numpy as np

from forcedweight.selectors.base import RowView, Selector


def farthest_point_order(V: np.ndarray, k: int | None = None) -> np.ndarray:
    """The first k keys of the farthest-point traversal of the rows of V, shape (k,), int64.

    Start: the row farthest from the mean of V; then repeatedly the row whose distance to the
    chosen rows is largest (ties: lower index). O(k N d).
    """
    V = np.asarray(V, dtype=np.float64)
    n = V.shape[0]
    k = n if k is None else min(int(k), n)
    order = np.empty(k, dtype=np.int64)
    dist = np.linalg.norm(V - V.mean(axis=0), axis=1)
    chosen = np.zeros(n, dtype=bool)
    for t in range(k):
        cand = np.where(chosen, -1.0, dist)
        j = int(np.argmax(cand))
        order[t] = j
        chosen[j] = True
        d_new = np.linalg.norm(V - V[j], axis=1)
        dist = d_new if t == 0 else np.minimum(dist, d_new)
    return order


class Geometric(Selector):
    """Score = minus the rank in the farthest-point traversal (untraversed keys: -inf)."""

    name = "geometric"

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        order = farthest_point_order(row.V, s)
        sc = np.full(row.n_keys, -np.inf)
        sc[order] = -np.arange(order.size, dtype=np.float64)
        return sc
