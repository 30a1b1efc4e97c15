"""Probabilistic eviction inside generation (paper 000, §5–§7): ``sampled-<proposal>`` and ``topk-<proposal>``.

A sampled policy does not hand scores to an allocator: it chooses its own kept set and bias
(``selects = True``; the harness calls :meth:`SampledPolicy.select` and ``cache.evict(layer, keep, bias)``).
For every (layer, KV head) it builds the proposal pi over the N context entries (the GQA mixture of the
group's query heads, :func:`forcedweight.probabilistic.gqa_mixture`), picks the number of draws m by
the global soft constraint (Algorithm 2 over all KV heads of a layer, ``scope="layer"``, or of the whole
model, ``scope="model"``: :func:`forcedweight.probabilistic.global_sample_count`), draws m entries with
replacement, keeps the unique ones and writes the correction bias ``b_i = log(c_i / (m pi_i)) / tau``
(:func:`forcedweight.probabilistic.correction_bias`) into the ragged cache's per-entry bias; entries
appended after the eviction get bias 0, so decode through ``ragged_decode`` runs the two-interval
self-normalised importance-sampling estimator. ``tau = inf`` is plain sampled eviction (no bias stored).
Per-head kept counts vary; only their mean meets the target.

Proposals (the score rules are :mod:`forcedweight.core.scores`'s, through
:mod:`forcedweight.probabilistic.proposals`):

- ``h2o``: accumulated attention of every context query, normalised, per query head, GQA mixture;
- ``snapkv``: the last ``window`` queries summed, max-pooled (``kernel``), normalised, GQA mixture;
- ``knorm``: softmax of ``-||k_i||`` (post-RoPE keys of the KV head);
- ``streaming``: weight 1 on 4 sinks and the ``round((1 - r) N) - 4`` most recent entries, ``floor`` elsewhere;
- ``uniform``: 1/N;
- ``minh`` (πmin-h): per query head, the H2O proposal mixed with the uniform distribution at the
  smallest weight ``lambda_h`` that gives every entry at least ``min_mass / N``:
  ``pi_h' = (1 - lambda_h) pi_h + lambda_h / N``, ``lambda_h = clip((min_mass/N - min pi_h) /
  (1/N - min pi_h), 0, 1)``; then the GQA mixture. A guaranteed minimum per head bounds every
  importance weight (``c_i / (m pi_i) <= c_i N / (m min_mass)``) and makes each layer's proposal
  flatter, so under one shared m the layers' compression is more even ("more conservative").
- every proposal takes ``temperature`` (``pi ∝ score^(1/T)``) and ``mix`` (uniform mixing weight).

``topk-<proposal>`` scores every entry by the same proposal and goes through the allocators as any
policy (with ``uniform``: the top ``(1 - r) N`` entries of pi per KV head), so the top-k version uses
exactly the numbers the sampled version draws from.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from forcedweight.core.scores import pad_kept
from forcedweight.deploy.policies.base import Policy
from forcedweight.errors import InputError
from forcedweight.probabilistic import (
    correction_bias,
    expected_unique,
    global_sample_count,
    gqa_mixture,
    min_mass_mixture,
    proposal_from_scores,
    sample,
    streaming_proposal,
    uniform_proposal,
)
from forcedweight.probabilistic.proposals import h2o_scores, knorm_scores, snapkv_scores

SAMPLED_PROPOSALS = ("h2o", "snapkv", "knorm", "streaming", "uniform", "minh")
_ROW_CHUNK = 256


def parse_tau(value) -> float:
    """``tau`` from a number or ``"inf"``; must be > 0."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise InputError(f"--tau: {value!r} is not a number (inf = uncorrected)") from None
    if not t > 0:
        raise InputError(f"--tau: must be > 0 (inf = uncorrected), got {value!r}")
    return t


#: the last prefill's accumulated attention per layer, shared by every H2O-based policy of one example
_ACC: dict = {"prefill": None, "layers": {}}


def _accumulated(prefill, layer: int) -> np.ndarray:
    """H2O's column sums of every context query's attention, (H_q, N), computed once per prefill and layer."""
    if _ACC["prefill"] is not prefill:
        _ACC["prefill"], _ACC["layers"] = prefill, {}
    if layer not in _ACC["layers"]:
        n = prefill.n_tokens
        acc = np.zeros((prefill.n_heads, n))
        for r0 in range(0, n, _ROW_CHUNK):  # column sums are additive over row chunks
            acc += h2o_scores(prefill.attention(layer, slice(r0, min(n, r0 + _ROW_CHUNK))))
        _ACC["layers"][layer] = acc
    return _ACC["layers"][layer]


class _ProposalMixin:
    """Per layer (H_kv, N) proposals of a Prefill for one proposal rule."""

    proposal: ClassVar[str] = "uniform"

    def _init_proposal(self, temperature=1.0, mix=0.0, window=64, kernel=5, floor=0.01, min_mass=0.25):
        if not (np.isfinite(float(temperature)) and float(temperature) > 0):
            raise InputError(f"policy {self.name}: temperature must be finite and > 0, got {temperature!r}")
        if not 0.0 <= float(mix) <= 1.0:
            raise InputError(f"policy {self.name}: mix must lie in [0, 1], got {mix!r}")
        if int(window) < 1 or int(kernel) < 1:
            raise InputError(f"policy {self.name}: window and kernel must be >= 1, got {window}, {kernel}")
        if not (np.isfinite(float(floor)) and float(floor) >= 0):
            raise InputError(f"policy {self.name}: floor must be finite and >= 0, got {floor!r}")
        if not 0.0 <= float(min_mass) <= 1.0:
            raise InputError(f"policy {self.name}: min_mass must lie in [0, 1], got {min_mass!r}")
        self.temperature, self.mix = float(temperature), float(mix)
        self.window, self.kernel, self.floor, self.min_mass = int(window), int(kernel), float(floor), float(min_mass)
        self._memo: tuple | None = None  # (prefill, ratio key, proposals)

    def _head(self, scores: np.ndarray, kind: str) -> np.ndarray:
        return proposal_from_scores(scores, kind, self.temperature, self.mix)

    def proposals(self, prefill, compression_ratio: float | None = None) -> list[np.ndarray]:
        """Per layer (H_kv, N) float64 proposals (rows sum to 1), memoised for the last prefill."""
        key = compression_ratio if self.proposal == "streaming" else None
        if self._memo is not None and self._memo[0] is prefill and self._memo[1] == key:
            return self._memo[2]
        n, g = prefill.n_tokens, prefill.group_size
        out = []
        for layer in range(prefill.n_layers):
            if self.proposal in ("h2o", "minh"):
                acc = _accumulated(prefill, layer)
                heads = [self._head(a, "normalise") for a in acc]
                if self.proposal == "minh":
                    heads = [min_mass_mixture(p, self.min_mass) for p in heads]
            elif self.proposal == "snapkv":
                w = min(self.window, n)
                attn = prefill.attention(layer, slice(n - w, None))  # (H_q, w, N)
                heads = [self._head(snapkv_scores(a, w, self.kernel), "normalise") for a in attn]
            elif self.proposal == "knorm":
                keys = prefill.keys(layer).double().cpu().numpy()  # (H_kv, N, d)
                heads = [self._head(knorm_scores(keys[h // g]), "softmax") for h in range(prefill.n_heads)]
            elif self.proposal == "streaming":
                r = 0.0 if compression_ratio is None else float(compression_ratio)
                recent = max(0, int(round((1.0 - r) * n)) - 4)
                base = streaming_proposal(n, sinks=4, recent=recent, floor=self.floor)
                heads = [self._head(base, "normalise")] * prefill.n_heads
            elif self.proposal == "uniform":
                heads = [uniform_proposal(n)] * prefill.n_heads
            else:
                raise InputError(f"unknown proposal {self.proposal!r} (choose from {', '.join(SAMPLED_PROPOSALS)})")
            heads = np.stack(heads)
            out.append(np.stack([gqa_mixture(heads[j * g:(j + 1) * g]) for j in range(prefill.n_kv_heads)]))
        self._memo = (prefill, key, out)
        return out


class SampledPolicy(_ProposalMixin, Policy):
    """Sampled eviction with the decode-time correction (module docstring).

    Parameters
    ----------
    tau : float > 0 or ``"inf"``: the correction's temperature (inf = uncorrected).
    scope : ``"layer"`` (one m per layer, default) or ``"model"`` (one m for every layer).
    temperature, mix, window, kernel, floor, min_mass : the proposal's options.
    """

    name: ClassVar[str] = "sampled-uniform"
    selects: ClassVar[bool] = True
    depends_on_ratio: ClassVar[bool] = True

    def __init__(self, tau=1.0, scope: str = "layer", temperature=1.0, mix=0.0, window: int = 64, kernel: int = 5,
                 floor: float = 0.01, min_mass: float = 0.25, **kw):
        super().__init__(**kw)
        if scope not in ("layer", "model"):
            raise InputError(f"policy {self.name}: scope must be 'layer' or 'model', got {scope!r}")
        self.tau, self.scope = parse_tau(tau), scope
        self._init_proposal(temperature, mix, window, kernel, floor, min_mass)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        """The proposals (a sampled policy evicts through :meth:`select`; this is for inspection)."""
        return self.proposals(prefill, compression_ratio)

    def check_ratio(self, n: int, compression_ratio: float) -> float | None:
        """The target of unique draws outside the sinks / recent window for ``n`` entries at ratio r,
        ``(1 - r) n - n_forced``; None when nothing is evicted (r = 0, or the target covers every other
        entry). InputError when r is outside [0, 1) or the target is below half an entry (the sinks and
        recent window hold about all that ratio keeps). ``evaluate`` calls it before any work."""
        r = float(compression_ratio)
        if not 0.0 <= r < 1.0:
            raise InputError(f"policy {self.name}: compression ratio {r} outside [0, 1)")
        n_forced = int(np.isinf(pad_kept(np.zeros(n), self.sinks, self.recent)).sum())
        j_star = (1.0 - r) * n - n_forced
        if r == 0.0 or n_forced == n or j_star >= n - n_forced:
            return None
        if j_star < 0.5:
            raise InputError(f"policy {self.name}: compression ratio {r} keeps {(1 - r) * n:.1f} of {n} entries, "
                             f"less than half an entry beyond the sinks + recent window ({n_forced})")
        return j_star

    def select(self, prefill, compression_ratio: float, seed: int | None = None):
        """Draw the kept set and the bias of every (layer, KV head).

        Parameters
        ----------
        prefill : Prefill
        compression_ratio : float in [0, 1), the target mean evicted fraction.
        seed : int (default: the policy's seed); draw (layer, head) uses
            ``default_rng([seed, round(1e6 * r), layer, head])``.

        Returns
        -------
        keep : list over layers of lists over KV heads of sorted int64 index arrays (k_lh,).
        bias : None when ``tau = inf``, else the same layout of float32 arrays (k_lh,).
        info : dict with ``m`` (per layer ints), ``counts`` (same layout as keep, int64 draws per kept
            entry; 0 for the sinks / recent window, kept exactly), ``pi`` (per layer (H_kv, N)
            proposals over all N entries; the draw uses them restricted to the entries outside the
            sinks / recent window, renormalised) and ``expected_ratio`` (per layer, of all N).
        """
        r = float(compression_ratio)
        n, L, H = prefill.n_tokens, prefill.n_layers, prefill.n_kv_heads
        j_star = self.check_ratio(n, r)
        seed = self.seed if seed is None else int(seed)
        pis = self.proposals(prefill, r)
        # sinks / recent window: kept exactly (bias 0, like the post-eviction interval); the rest is
        # drawn from pi restricted to it, with the target of unique draws reduced by the forced ones
        forced = np.isinf(pad_kept(np.zeros(n), self.sinks, self.recent))
        rest = np.flatnonzero(~forced)
        n_forced = n - rest.size
        if j_star is None:  # nothing to evict: the exact cache
            keep = [[np.arange(n, dtype=np.int64) for _ in range(H)] for _ in range(L)]
            return keep, None, {"m": [0] * L, "counts": None, "pi": pis, "expected_ratio": [0.0] * L}
        r_rest = 1.0 - j_star / rest.size
        sub = [[pi[rest] / pi[rest].sum() for pi in layer] for layer in pis]
        if self.scope == "model":
            ms = [global_sample_count([p for layer in sub for p in layer], r_rest)] * L
        else:
            ms = [global_sample_count(layer, r_rest) for layer in sub]
        keep, bias, counts, expected = [], [], [], []
        ridx = int(round(1e6 * r))
        forced_idx = np.flatnonzero(forced)
        for layer in range(L):
            k_l, b_l, c_l = [], [], []
            for h in range(H):
                pi = sub[layer][h]
                kept, cnt = sample(pi, ms[layer], np.random.default_rng([seed, ridx, layer, h]))
                b = correction_bias(cnt, pi[kept], ms[layer], self.tau)
                order = np.argsort(np.concatenate([forced_idx, rest[kept]]), kind="stable")
                k_l.append(np.concatenate([forced_idx, rest[kept]])[order].astype(np.int64))
                c_l.append(np.concatenate([np.zeros(n_forced, np.int64), cnt])[order])
                b_l.append(np.concatenate([np.zeros(n_forced), b])[order].astype(np.float32))
            keep.append(k_l)
            bias.append(b_l)
            counts.append(c_l)
            expected.append(float(np.mean([1.0 - (n_forced + expected_unique(p, ms[layer])) / n
                                           for p in sub[layer]])))
        info = {"m": ms, "counts": counts, "pi": pis, "expected_ratio": expected}
        return keep, (None if np.isinf(self.tau) else bias), info


class TopKProposalPolicy(_ProposalMixin, Policy):
    """The top-k version of a proposal: score = pi (through any allocator; ``uniform`` = top (1 - r) N)."""

    name: ClassVar[str] = "topk-uniform"
    depends_on_ratio: ClassVar[bool] = True  # streaming's recent window follows the ratio

    def __init__(self, temperature=1.0, mix=0.0, window: int = 64, kernel: int = 5, floor: float = 0.01,
                 min_mass: float = 0.25, **kw):
        super().__init__(**kw)
        self._init_proposal(temperature, mix, window, kernel, floor, min_mass)

    def score(self, prefill, compression_ratio=None) -> list[np.ndarray]:
        return self.proposals(prefill, compression_ratio)


def _classes() -> dict[str, type[Policy]]:
    out: dict[str, type[Policy]] = {}
    for prop in SAMPLED_PROPOSALS:
        for base, prefix in ((SampledPolicy, "sampled"), (TopKProposalPolicy, "topk")):
            name = f"{prefix}-{prop}"
            out[name] = type(f"{prefix.capitalize()}{prop.capitalize()}Policy", (base,),
                             {"name": name, "proposal": prop, "__module__": __name__,
                              "__doc__": f"{base.__doc__.splitlines()[0]} Proposal: {prop}."})
    return out


#: ``sampled-<proposal>`` and ``topk-<proposal>`` for every proposal of :data:`SAMPLED_PROPOSALS`
SAMPLED_POLICIES: dict[str, type[Policy]] = _classes()
