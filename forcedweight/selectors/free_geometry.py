"""Free-weight geometry selection: the kept set chosen to make EF small, then forced weights (docs/concepts.md).

``geometric`` covers the value cloud (farthest points) and ignores where the output ``mu = p V``
lies; this rule picks the keys whose convex hull comes closest to ``mu``, i.e. it greedily
minimises the free-weight error ``EF(S) = min_{w in simplex(S)} ||V_S^T w - mu||`` (the quantity
the paper's geometric bound is about), and the set is then evaluated, like every selector, with
forced weights (``E``).

Rule (fully corrective Frank–Wolfe restricted to s vertices):

1. ``S = {argmin_j ||v_j - mu||}`` (ties: lower index).
2. While ``|S| < s``: ``x`` = the point of hull(V_S) nearest ``mu`` (Wolfe's minimum-norm point,
   ``operator._simplex_lsq``); add the Frank–Wolfe vertex ``argmin_{j not in S} <v_j - mu, x - mu>``
   (the key most opposed to the remaining residual; ties: lower index).
3. Once ``x = mu`` up to round-off (EF = 0: ``||x - mu|| <= 1e-13 max_j ||v_j - mu||``) no direction
   is left; the remaining places go to the largest masses (ties: lower index).

Cost: s minimum-norm-point solves on at most s columns plus s products ``(N, d) @ (d,)``.
"""

from __future__ import annotations

import numpy as np

from forcedweight.core.operator import _simplex_lsq, dense_output
from forcedweight.selectors.base import RowView, Selector


def free_geometry_order(p: np.ndarray, V: np.ndarray, k: int | None = None) -> np.ndarray:
    """The first k keys picked by the free-weight geometry rule (module doc), shape (k,), int64.

    p (N,) weights summing to 1, V (N, d) values.
    """
    p = np.asarray(p, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    n = V.shape[0]
    k = n if k is None else min(int(k), n)
    mu = dense_output(p, V)
    Y = V - mu  # (N, d)
    scale = float(np.linalg.norm(Y, axis=1).max()) if n else 0.0
    order: list[int] = [int(np.argmin(np.linalg.norm(Y, axis=1)))] if k else []
    chosen = np.zeros(n, dtype=bool)
    chosen[order] = True
    while len(order) < k:
        w = _simplex_lsq(V[order].T, mu)
        r = Y[order].T @ w  # x - mu, (d,)
        if not float(np.linalg.norm(r)) > 1e-13 * scale:
            break  # mu reached: no direction left
        g = np.where(chosen, np.inf, Y @ r)
        j = int(np.argmin(g))
        order.append(j)
        chosen[j] = True
    if len(order) < k:  # fill by mass (stable: ties to the lower index)
        rest = [int(i) for i in np.argsort(-p, kind="stable") if not chosen[i]]
        order += rest[: k - len(order)]
    return np.asarray(order, dtype=np.int64)


class FreeGeometry(Selector):
    """Score = minus the rank in ``free_geometry_order`` (unpicked keys: -inf)."""

    name = "free_geometry"

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        order = free_geometry_order(row.p, row.V, s)
        sc = np.full(row.n_keys, -np.inf)
        sc[order] = -np.arange(order.size, dtype=np.float64)
        return sc
