"""Proposal distributions pi over cache entries, built from eviction scores (paper 000, App. D).

Every proposal is a float64 probability vector of shape (n,) over the n pre-eviction entries.
Score-based methods become proposals without changing their top-k modes (the scores themselves are
``forcedweight.core.scores``'s rules, the same numbers as the row selectors and the deploy policies):

- H2O: normalised accumulated attention over the query rows seen so far;
- SnapKV: normalised observation-window scores (last ``window`` rows summed, max-pooled);
- K-norm: softmax of ``-||k_i||``;
- StreamingLLM: mass on the sinks and the recent entries, a (possibly zero) floor elsewhere;
- uniform.

Temperature and uniform mixing act on any of them (:func:`proposal_from_scores`); under grouped-query
attention the query heads of a KV group share one cache, so they share one proposal, the average of
the heads' proposals (:func:`gqa_mixture`).
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_softmax

from forcedweight.core import scores as rules
from forcedweight.errors import InputError

PROPOSALS = ("h2o", "snapkv", "knorm", "streaming", "uniform")


def _finite(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(x.ravel()))
    if bad.size:
        raise InputError(f"{name}: non-finite score at flat index {int(bad[0])} ({x.ravel()[bad[0]]})")
    return x


def proposal_from_scores(
    scores: np.ndarray,
    kind: str = "normalise",
    temperature: float = 1.0,
    mix: float = 0.0,
) -> np.ndarray:
    """Turn scores into a proposal: ``pi = (1 - mix) * softmax(log_score / T) + mix / n``.

    Parameters
    ----------
    scores : ndarray (n,)
        ``kind="normalise"``: non-negative scores, ``pi ∝ score ** (1/T)`` (T = 1: plain
        normalisation; zero scores get zero probability unless mixed).
        ``kind="softmax"``: real scores (logits), ``pi = softmax(score / T)``.
    temperature : float, 0 < T < inf. T > 1 flattens, T < 1 sharpens.
    mix : float in [0, 1], weight of the uniform distribution.

    Returns
    -------
    pi : ndarray (n,) float64, sums to 1.
    """
    s = _finite("scores", scores)
    if s.ndim != 1 or s.size == 0:
        raise InputError(f"scores: expected a non-empty 1-D array, got shape {s.shape}")
    if not (np.isfinite(temperature) and temperature > 0):
        raise InputError(f"temperature must be finite and > 0, got {temperature}")
    if not 0.0 <= mix <= 1.0:
        raise InputError(f"mix must lie in [0, 1], got {mix}")
    if kind == "normalise":
        if np.any(s < 0):
            raise InputError(f"scores: negative score {s.min():.3g} for a normalised proposal")
        if not s.sum() > 0:
            raise InputError("scores: all zero, no proposal can be normalised from them")
        with np.errstate(divide="ignore"):
            logs = np.log(s)
    elif kind == "softmax":
        logs = s
    else:
        raise InputError(f"kind must be 'normalise' or 'softmax', got {kind!r}")
    pi = np.exp(log_softmax(logs / temperature))
    if mix > 0:
        pi = (1.0 - mix) * pi + mix / s.size
    return pi / pi.sum()


def h2o_scores(attn: np.ndarray) -> np.ndarray:
    """Accumulated attention: column sums of the rows seen so far.

    Parameters
    ----------
    attn : ndarray (R, n) — attention of the R query rows up to the eviction step over the n
        entries (zeros for entries a row cannot see).
    """
    return rules.accumulated_attention(_finite("attention", attn))


def snapkv_scores(attn: np.ndarray, window: int = 8, kernel: int = 5) -> np.ndarray:
    """Observation-window scores: the last ``window`` rows summed, max-pooled (size ``kernel``, same padding).

    Parameters
    ----------
    attn : ndarray (R, n)
    """
    a = _finite("attention", attn)
    if window < 1 or kernel < 1:
        raise InputError(f"snapkv window and kernel must be >= 1, got {window}, {kernel}")
    return rules.observation_window(a, window, kernel, pooling="max", reduce="sum")


def knorm_scores(keys: np.ndarray) -> np.ndarray:
    """``-||k_i||`` for keys (n, d); use with ``kind="softmax"``."""
    return rules.knorm(_finite("keys", keys))


def streaming_proposal(n: int, sinks: int = 4, recent: int = 0, floor: float = 0.01) -> np.ndarray:
    """StreamingLLM as a proposal: weight 1 on the first ``sinks`` and last ``recent`` entries,
    ``floor`` on every other entry, normalised.

    ``floor = 0`` gives exact zeros: those entries can then never be kept, and a correction cannot
    reach them (the estimator is biased for them whatever m is); Algorithm 2 then refuses targets
    above the support size.
    """
    if n < 1:
        raise InputError(f"streaming proposal needs n >= 1, got {n}")
    if sinks < 0 or recent < 0:
        raise InputError(f"sinks and recent must be >= 0, got {sinks}, {recent}")
    if not (np.isfinite(floor) and floor >= 0):
        raise InputError(f"floor must be finite and >= 0, got {floor}")
    kept = np.isinf(rules.pad_kept(np.zeros(n), sinks, recent))  # sinks + recent window, as the selectors
    w = np.where(kept, 1.0, float(floor))
    if not w.sum() > 0:
        raise InputError("streaming proposal has no mass (no sinks, no recent entries, zero floor)")
    return w / w.sum()


def uniform_proposal(n: int) -> np.ndarray:
    """The uniform proposal over n entries."""
    if n < 1:
        raise InputError(f"uniform proposal needs n >= 1, got {n}")
    return np.full(n, 1.0 / n)


def gqa_mixture(pis: np.ndarray) -> np.ndarray:
    """The shared proposal of a KV group: the average of its G query heads' proposals.

    Parameters
    ----------
    pis : ndarray (G, n)

    Returns
    -------
    ndarray (n,)
    """
    p = np.atleast_2d(np.asarray(pis, dtype=np.float64))
    for g in range(p.shape[0]):
        validate_proposal(p[g], name=f"proposal of head {g}")
    pi = p.mean(axis=0)
    return pi / pi.sum()


def min_mass_mixture(pi: np.ndarray, min_mass: float) -> np.ndarray:
    """πmin-h's per-head step (``sampled-minh`` in forcedweight.deploy.policies.sampled): the least uniform mixing giving every entry at least ``min_mass / n``.

    Parameters
    ----------
    pi : ndarray (n,), a proposal.
    min_mass : float in [0, 1].

    Returns
    -------
    ndarray (n,) float64, ``(1 - lam) pi + lam / n`` with the smallest ``lam`` in [0, 1] for which
    ``min_i >= min_mass / n``.
    """
    p = np.asarray(pi, dtype=np.float64)
    if not 0.0 <= min_mass <= 1.0:
        raise InputError(f"min_mass must lie in [0, 1], got {min_mass}")
    n = p.size
    lo = float(p.min())
    floor = min_mass / n
    if lo >= floor:
        return p / p.sum()
    lam = min(1.0, (floor - lo) / (1.0 / n - lo))
    out = (1.0 - lam) * p + lam / n
    return out / out.sum()


def validate_proposal(pi: np.ndarray, must_keep: np.ndarray | None = None, name: str = "proposal") -> np.ndarray:
    """Check a proposal and return it as float64, renormalised.

    Raises InputError for non-finite or negative entries, a sum far from 1 (more than 1e-6,
    i.e. not a distribution rather than rounding), or zero probability on an entry of ``must_keep``
    (an entry the proposal must be able to keep: it would never be sampled, and a correction could
    not account for it).
    """
    p = np.asarray(pi, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise InputError(f"{name}: expected a non-empty 1-D array, got shape {p.shape}")
    bad = np.flatnonzero(~np.isfinite(p))
    if bad.size:
        raise InputError(f"{name}: non-finite probability at index {int(bad[0])}")
    if np.any(p < 0):
        raise InputError(f"{name}: negative probability at index {int(np.flatnonzero(p < 0)[0])}")
    total = p.sum()
    if abs(total - 1.0) > 1e-6:
        raise InputError(f"{name}: probabilities sum to {total:.9g}, not 1")
    if must_keep is not None:
        idx = np.asarray(must_keep, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= p.size):
            raise InputError(f"{name}: must-keep index out of range [0, {p.size})")
        zero = idx[p[idx] <= 0]
        if zero.size:
            raise InputError(
                f"{name}: does not cover entry {int(zero[0])} that must be kept "
                f"(zero probability on {zero.size} required entr{'y' if zero.size == 1 else 'ies'})"
            )
    return p / total


def make_proposal(
    name: str,
    attn: np.ndarray,
    keys: np.ndarray | None = None,
    temperature: float = 1.0,
    mix: float = 0.0,
    window: int = 8,
    kernel: int = 5,
    sinks: int = 4,
    recent: int = 0,
    floor: float = 0.01,
) -> np.ndarray:
    """One head's proposal over the n entries at eviction time, by method name.

    Parameters
    ----------
    name : one of ``PROPOSALS``.
    attn : ndarray (R, n), the attention rows seen up to the eviction step (rows R-1 is the current one).
    keys : ndarray (n, d), needed for ``knorm``.

    Returns
    -------
    pi : ndarray (n,)
    """
    n = attn.shape[1]
    if name == "h2o":
        return proposal_from_scores(h2o_scores(attn), "normalise", temperature, mix)
    if name == "snapkv":
        return proposal_from_scores(snapkv_scores(attn, window, kernel), "normalise", temperature, mix)
    if name == "knorm":
        if keys is None:
            raise InputError("proposal knorm needs keys (dump with --with-keys)")
        return proposal_from_scores(knorm_scores(keys), "softmax", temperature, mix)
    if name == "streaming":
        return proposal_from_scores(streaming_proposal(n, sinks, recent, floor), "normalise", temperature, mix)
    if name == "uniform":
        return uniform_proposal(n)
    raise InputError(f"unknown proposal {name!r} (choose from {', '.join(PROPOSALS)})")
