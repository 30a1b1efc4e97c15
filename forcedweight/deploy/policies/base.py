"""The policy contract: score every cached entry of every (layer, KV head) of a Prefill.

A policy's only job is ``score(prefill) -> per layer (H_kv, N) float64`` (the kvpress shape; higher =
keep). Attention sinks and a recent window are options handled by padding the scores with ``+inf``
(``forcedweight.core.scores.pad_kept``), so they are kept *inside* the budget, not on top of it; the
allocators (``forcedweight.deploy.allocate``) read the ``+inf`` entries of a segment as its floor.
The score rules themselves live in ``forcedweight.core.scores`` (defined once for the row selectors,
the probabilistic proposals and the policies).

``query_agnostic`` says whether the policy's definition sees the context only (kvpress's
``query_aware: false``); every policy scores whatever Prefill it is given, so the query-aware audit
prefills context + question and hands that Prefill over.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from forcedweight.core.scores import pad_kept
from forcedweight.errors import InputError


class Policy:
    """Base class: subclasses set ``name`` (and ``query_agnostic``) and implement ``score``.

    Parameters
    ----------
    sinks : int, the first ``sinks`` entries of every segment always kept (+inf padding).
    recent : int, the last ``recent`` entries always kept (+inf padding).
    seed : int, for policies with randomness (random, compactor's sketch).
    **options : the subclass's own options; an unknown one raises InputError naming the policy.
    """

    name: ClassVar[str] = "policy"
    query_agnostic: ClassVar[bool] = True
    #: True when the scores depend on the compression ratio (compactor's blending); such a policy
    #: takes ``score(prefill, compression_ratio=r)``.
    depends_on_ratio: ClassVar[bool] = False

    def __init__(self, sinks: int = 0, recent: int = 0, seed: int = 0, **options):
        if options:
            raise InputError(f"policy {self.name}: unknown option(s) {', '.join(sorted(options))}")
        for opt, val in (("sinks", sinks), ("recent", recent)):
            if int(val) != val or int(val) < 0:
                raise InputError(f"policy {self.name}: {opt} must be a non-negative integer, got {val!r}")
        self.sinks = int(sinks)
        self.recent = int(recent)
        self.seed = int(seed)
        #: what the last ``score`` call cost beyond the shared prefill (e.g. KVzip's extra forward
        #: passes): a dict such as ``{"seconds": ..., "forward_tokens": ...}``; empty when nothing.
        self.last_cost: dict = {}

    def score(self, prefill, compression_ratio: float | None = None) -> list[np.ndarray]:
        """Per layer (H_kv, N) float64 scores, higher = keep (no sinks / recent padding)."""
        raise NotImplementedError

    def padded_scores(self, prefill, compression_ratio: float | None = None) -> list[np.ndarray]:
        """``score`` with the sinks and the recent window padded to ``+inf`` (``scores.pad_kept``)."""
        kw = {"compression_ratio": compression_ratio} if self.depends_on_ratio else {}
        out = self.score(prefill, **kw)
        return [pad_kept(s, self.sinks, self.recent) for s in out]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sinks={self.sinks}, recent={self.recent})"

