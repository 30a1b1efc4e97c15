"""Leverage selection: the largest statistical leverage scores of V (docs/concepts.md).

Leverage of key i = the i-th diagonal entry of the hat matrix ``H = X (X^T X)^+ X^T`` of the
column-centred values ``X = V - mean(V)``; through a thin SVD ``X = U S W^T``,
``h_i = sum_r U_ir^2`` over the singular values above ``max(N, d) * eps * s_max`` (rank cut).
"""

from __future__ import annotations

import numpy as np

from forcedweight.selectors.base import RowView, Selector


def leverage_scores(V: np.ndarray) -> np.ndarray:
    """``diag(H)`` of the centred V, shape (N,), float64, each in [0, 1]."""
    X = np.asarray(V, dtype=np.float64)
    X = X - X.mean(axis=0)
    if not np.any(X):
        return np.zeros(X.shape[0])
    U, sv, _ = np.linalg.svd(X, full_matrices=False)
    rank = int(np.sum(sv > max(X.shape) * np.finfo(np.float64).eps * sv[0]))
    return np.einsum("ir,ir->i", U[:, :rank], U[:, :rank])


class Leverage(Selector):
    """Score = leverage of the value vector (``on="keys"`` uses K instead of V when present)."""

    name = "leverage"

    def __init__(self, on: str = "values", sinks: int = 0, recent: int = 0):
        super().__init__(sinks, recent)
        if on not in ("values", "keys"):
            raise ValueError("on must be 'values' or 'keys'")
        self.on = on
        self.needs = ("keys",) if on == "keys" else ()

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        return leverage_scores(row.keys if self.on == "keys" else row.V)
