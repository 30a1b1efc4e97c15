"""The selector contract: a score per key, the top s scores kept.

A selector's only job is ``score(row) -> (N,) float64`` (higher = keep). ``select(row, s)`` keeps
the s largest scores, ties to the lower index, and returns them sorted. Attention sinks and recent
windows are not special cases: they pad the scores with ``+inf`` (the kvpress habit), so every
selector can be combined with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from forcedweight.core.operator import rank_order
from forcedweight.core.scores import pad_kept
from forcedweight.rows import Row


@dataclass
class RowView:
    """What a selector may look at: weights, values and (optionally) keys and query.

    Attributes
    ----------
    p : (N,) float64 weights summing to 1.
    V : (N, d) float64 values.
    keys : (N, d_k) float64 or None.
    query : (d_k,) float64 or None.
    row_id : int, used to derive per-row random streams.
    """

    p: np.ndarray
    V: np.ndarray
    keys: np.ndarray | None = None
    query: np.ndarray | None = None
    row_id: int = 0

    @property
    def n_keys(self) -> int:
        return int(self.p.shape[0])


def as_view(row: Any) -> RowView:
    """Accept a ``RowView``, a ``rows.Row`` or a ``(p, V)`` / ``(p, V, keys, query)`` tuple."""
    if isinstance(row, RowView):
        return row
    if isinstance(row, Row):
        return RowView(row.p, row.V, row.array("keys"), row.array("query"), row.row_id)
    if isinstance(row, tuple) and len(row) in (2, 4):
        p = np.asarray(row[0], dtype=np.float64)
        V = np.asarray(row[1], dtype=np.float64)
        if V.ndim == 1:
            V = V[:, None]
        keys = query = None
        if len(row) == 4:
            keys = None if row[2] is None else np.asarray(row[2], dtype=np.float64)
            query = None if row[3] is None else np.asarray(row[3], dtype=np.float64)
        return RowView(p, V, keys, query)
    raise TypeError(f"cannot read a row from {type(row).__name__}")


def top_scores(score: np.ndarray, s: int) -> np.ndarray:
    """Indices of the s largest scores (ties: lower index first), returned sorted, int64 (s,).

    The selector-facing ``core.operator.top_s``: the same tie rule (``rank_order``), plus checks
    that ``1 <= s <= N`` and that no score is NaN (ValueError).
    """
    score = np.asarray(score, dtype=np.float64)
    n = score.shape[0]
    if not 1 <= s <= n:
        raise ValueError(f"budget s={s} outside [1, N={n}]")
    if np.isnan(score).any():
        raise ValueError("selector scores contain NaN")
    return np.sort(rank_order(score)[:s]).astype(np.int64)


class MissingInput(ValueError):
    """The row lacks an input the selector needs (keys, query)."""


class Selector:
    """Base class: subclasses set ``name`` and implement ``score``.

    Parameters
    ----------
    sinks : int
        The first ``sinks`` keys always kept (scores padded with +inf).
    recent : int
        The last ``recent`` keys always kept (scores padded with +inf).
    """

    name = "selector"
    needs: tuple[str, ...] = ()

    def __init__(self, sinks: int = 0, recent: int = 0):
        self.sinks = int(sinks)
        self.recent = int(recent)

    def score(self, row: RowView, s: int | None = None) -> np.ndarray:
        """Per-key scores, shape (N,), float64; higher = keep.

        ``s`` is a hint: only the order of the top s (plus padding) scores must be exact, which
        lets greedy selectors stop early. ``None`` asks for the full order.
        """
        raise NotImplementedError

    def padded_score(self, row: Any, s: int | None = None) -> np.ndarray:
        """``score`` with the sinks and the recent window padded to ``+inf`` (``scores.pad_kept``), (N,).

        Raises ``MissingInput`` when the row lacks an input in ``needs``.
        """
        view = as_view(row)
        missing = [name for name in self.needs if getattr(view, name) is None]
        if missing:
            raise MissingInput(f"{self.name} needs {', '.join(missing)}")
        hint = None if s is None else min(view.n_keys, s + self.sinks + self.recent)
        return pad_kept(self.score(view, hint), self.sinks, self.recent)

    def select(self, row: Any, s: int) -> np.ndarray:
        """The kept set, shape (s,), sorted unique int64 indices."""
        return top_scores(self.padded_score(row, s), s)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sinks={self.sinks}, recent={self.recent})"
