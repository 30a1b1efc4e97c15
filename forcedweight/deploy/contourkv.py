"""ContourKV (paper 004 §4; docs/contourkv.md): one shared threshold, a recency floor per head, and entries moved
to the (layer, KV head) segments whose dropped mass predicts a residual gain.

The score is the policy's (pluggable: ``kvzip`` the reference, so ContourKV and ``kvzip/global``
differ only in allocation; ``snapkv`` a second). With the total budget B (kept entries over all
layers and KV heads):

1. **Recency floor**: the last ``recent_floor`` entries of every segment are padded to ``+inf``
   (kept inside the budget, on top of the policy's own sinks / recent padding).
2. **Shared threshold** (= the ``global`` allocator, KVzip's): the B largest scores over all layers
   and heads, ties to the lower flattened index; counts ``c_s``, floors ``f_s`` (``+inf`` entries).
3. **Dropped mass** of every segment's kept set, ``D_s`` (:mod:`forcedweight.deploy.dropped_mass`):
   the attention mass of the last ``window`` context queries (mean over the KV group's query heads)
   that the shared-threshold set leaves out.
4. **Move**: with ``m = median(D)``, every *donor* (``D_s < m``) gives up ``floor(beta * (c_s - f_s))``
   entries (its lowest-scored ones); the pool goes to the *receivers* (``D_s > m``) in proportion
   to ``D_s - m`` (largest remainders, ties to the lower segment index), each capped at ``N - c_s``,
   water-filled until the pool is empty or every receiver is full; what no receiver can take goes
   back to the donors in proportion to what they gave. The counts sum to B exactly, and every count
   stays within ``[f_s, N]``.

With a flat dropped-mass signal (every ``D_s`` equal) there is no receiver and ContourKV is exactly
the shared threshold. Parameters: ``beta`` (0.1) and ``recent_floor`` (8); see docs/contourkv.md for
how they were fixed (continuation cross-entropy on a separate seed, never on the evaluation tasks).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from forcedweight.core.operator import rank_order, top_s
from forcedweight.core.scores import pad_kept
from forcedweight.deploy.dropped_mass import WINDOW, segment_dropped_mass, window_rows
from forcedweight.deploy.segment_scores import check_budget, stack_scores
from forcedweight.errors import InputError

BETA = 0.1
RECENT_FLOOR = 8


# The allocator registry (deploy/allocate.py) imports this module, so its two steps below are
# written on the same primitives (core.operator.rank_order / top_s: THE tie rule) rather than
# imported back from it (no import cycle); tests check them against allocate's ``global``/``select``.
# The input checks are shared (deploy.segment_scores).
def shared_threshold(x: np.ndarray, budget: int) -> np.ndarray:
    """(L, H_kv) counts of the ``budget`` largest scores of x (L, H_kv, N) overall (= ``global``)."""
    L, H, N = x.shape
    kept = rank_order(x.reshape(-1))[: check_budget(x, budget)]
    return np.bincount(kept // N, minlength=L * H).astype(np.int64).reshape(L, H)


def select_counts(x: np.ndarray, counts: np.ndarray) -> list[list[np.ndarray]]:
    """Each segment's top-``count`` indices (``top_s``), per layer, per KV head (= allocate.select)."""
    return [[top_s(x[layer, h], int(counts[layer, h])) for h in range(x.shape[1])] for layer in range(x.shape[0])]


def largest_remainder(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Integer shares of ``total`` proportional to ``weights`` (>= 0), each <= ``caps``; water-filled
    until ``total`` is placed or every positive-weight slot is full. Ties to the lower index."""
    out = np.zeros(weights.shape[0], dtype=np.int64)
    left = int(total)
    active = (weights > 0) & (caps > 0)
    while left > 0 and active.any():
        w = np.where(active, weights, 0.0)
        ideal = left * w / w.sum()
        share = np.minimum(np.floor(ideal).astype(np.int64), caps - out)
        rest = left - int(share.sum())
        frac = np.where(active & (out + share < caps), ideal - np.floor(ideal), -1.0)
        order = np.lexsort((np.arange(frac.shape[0]), -frac))
        for i in order[:rest]:
            if frac[i] < 0:
                break
            share[i] += 1
        out += share
        left -= int(share.sum())
        active &= out < caps
        if share.sum() == 0:
            break
    return out


def reallocate(counts: np.ndarray, floor: np.ndarray, n: int, dropped: np.ndarray, beta: float) -> np.ndarray:
    """Step 4 of the module docstring: move entries from low- to high-dropped-mass segments.

    Parameters
    ----------
    counts, floor : (L, H_kv) int64, the shared-threshold counts and the segments' floors.
    n : entries per segment (the cap).
    dropped : (L, H_kv) float64 dropped mass of each segment's kept set.
    beta : share in [0, 1] of a donor's entries above its floor that it gives up.

    Returns
    -------
    (L, H_kv) int64 counts with the same sum, each in [floor, n].
    """
    c = np.asarray(counts, dtype=np.int64).ravel().copy()
    f = np.asarray(floor, dtype=np.int64).ravel()
    d = np.asarray(dropped, dtype=np.float64).ravel()
    med = float(np.median(d))
    donors, receivers = d < med, d > med
    if not receivers.any() or beta <= 0:
        return c.reshape(np.shape(counts))
    give = np.where(donors, np.floor(beta * (c - f)).astype(np.int64), 0)
    got = largest_remainder(int(give.sum()), np.where(receivers, d - med, 0.0), n - c)
    back = largest_remainder(int(give.sum() - got.sum()), give.astype(np.float64), give)
    out = c - give + back + got
    return out.reshape(np.shape(counts))


def score_dropped_mass(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(L, H_kv) share of each segment's positive finite score mass outside its top-``count`` set
    (the fallback signal when no attention rows are given; kvzip / snapkv scores are attention
    weights, so this is their own dropped mass). A segment without positive mass drops 0."""
    L, H, N = x.shape
    p = np.where(np.isfinite(x), np.maximum(x, 0.0), 0.0)
    total = p.sum(-1)
    kept = np.array([[p[layer, h, top_s(x[layer, h], int(counts[layer, h]))].sum() for h in range(H)]
                     for layer in range(L)])
    return np.where(total > 0, 1.0 - kept / np.where(total > 0, total, 1.0), 0.0)


class ContourKVAllocator:
    """Shared threshold + recency floor + dropped-mass reallocation (module docstring).

    ``needs_prefill``: the evaluate harness calls :meth:`keep` with the Prefill (the window rows).
    """

    name: ClassVar[str] = "contourkv"
    needs_prefill: ClassVar[bool] = True

    def __init__(self, beta: float = BETA, recent_floor: int = RECENT_FLOOR, window: int = WINDOW, **options):
        if options:
            raise InputError(f"allocator contourkv: unknown option(s) {', '.join(sorted(options))}")
        if not 0.0 <= float(beta) <= 1.0:
            raise InputError(f"allocator contourkv: beta must be in [0, 1], got {beta!r}")
        if int(recent_floor) != recent_floor or int(recent_floor) < 0 or int(window) < 1:
            raise InputError("allocator contourkv: recent_floor >= 0 and window >= 1 needed (integers)")
        self.beta, self.recent_floor, self.window = float(beta), int(recent_floor), int(window)
        self.last_dropped: np.ndarray | None = None

    def floored(self, scores: list[np.ndarray], budget: int | None = None) -> np.ndarray:
        """(L, H_kv, N) scores with the recency floor padded to ``+inf`` (step 1). With ``budget``, the
        floor is the largest ``r <= recent_floor`` whose ``+inf`` entries fit in it (a budget too small
        for the full floor keeps a shorter one; below the policy's own floors nothing fits)."""
        x = stack_scores(scores, "allocator contourkv")
        budget = np.inf if budget is None else check_budget(x, budget)
        for r in range(self.recent_floor, 0, -1):
            y = pad_kept(x, 0, r)
            if np.isposinf(y).sum() <= budget:
                return y
        return x

    def allocate(self, scores, budget, prefill=None, rows: list[np.ndarray] | None = None) -> np.ndarray:
        """(L, H_kv) int64 counts. The dropped mass is read from ``rows`` (per layer (H_q, R, N)
        attention) or the ``prefill``'s last ``window`` queries; with neither (the bare
        ``Allocator.allocate(scores, budget)`` contract), from the scores themselves: each segment's
        share of its positive finite score mass left out (``score_dropped_mass``)."""
        x = self.floored(scores, budget)
        counts = shared_threshold(x, budget)
        keep = select_counts(x, counts)
        if rows is None and prefill is not None:
            rows = window_rows(prefill, self.window)
        dropped = segment_dropped_mass(rows, keep) if rows is not None else score_dropped_mass(x, counts)
        self.last_dropped = dropped
        floor = np.isposinf(x).sum(axis=-1).astype(np.int64)
        out = reallocate(counts, floor, x.shape[-1], dropped, self.beta)
        assert out.sum() == counts.sum() and (out >= floor).all() and (out <= x.shape[-1]).all()
        return out

    def keep(self, scores, budget, prefill=None, rows=None) -> list[list[np.ndarray]]:
        """Kept indices per layer and KV head (the recency floor included): ``select`` on the floored
        scores with :meth:`allocate`'s counts."""
        return select_counts(self.floored(scores, budget), self.allocate(scores, budget, prefill=prefill, rows=rows))


__all__ = ["BETA", "RECENT_FLOOR", "ContourKVAllocator", "largest_remainder", "reallocate", "score_dropped_mass", "select_counts", "shared_threshold"]
