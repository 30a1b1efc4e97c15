"""How many draws, and the draws themselves (paper 000, Algorithm 2 and App. F).

Drawing m entries with replacement from a proposal pi keeps ``J(m)`` unique entries, with
``E[J(m)] = sum_i 1 - (1 - pi_i)^m``. For a compression ratio r (the evicted fraction), the target
is ``j* = (1 - r) n`` unique entries; Algorithm 2 picks the m whose expected unique count is closest
to it. ``E[J(m+1)] - E[J(m)] = sum_i pi_i (1 - pi_i)^m <= 1``, so the closest m is within 1/2 of the
target whenever the target is reachable at all (j* >= 1/2 and j* below the support size, or
approached within 1/2 by it).
"""

from __future__ import annotations

import numpy as np

from forcedweight.probabilistic.proposals import validate_proposal
from forcedweight.errors import InputError

DEFAULT_MAX_SAMPLES = 1 << 40


def expected_unique(pi: np.ndarray, m: int | np.ndarray) -> np.ndarray | float:
    """``E[J(m)] = sum_i 1 - (1 - pi_i)^m``, computed as ``-sum expm1(m log1p(-pi_i))``.

    Parameters
    ----------
    pi : ndarray (n,)
    m : int or ndarray of ints (any shape), m >= 0.

    Returns
    -------
    float or ndarray of m's shape.
    """
    p = np.asarray(pi, dtype=np.float64)
    mm = np.asarray(m, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        l1p = np.log1p(-p)  # -inf where pi_i = 1
        terms = -np.expm1(np.multiply.outer(mm, l1p))
    terms = np.where(np.multiply.outer(mm, np.ones_like(p)) == 0, 0.0, terms)  # m = 0: nothing drawn
    out = terms.sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def _search(f, target: float, limit: float, max_samples: int, what: str) -> int:
    """Exponential then binary search for the smallest-error m >= 1 of an increasing f."""
    if f(1) >= target:
        return 1
    hi = 1
    while f(hi) < target:
        if hi >= max_samples:
            reach = f(max_samples)
            raise InputError(
                f"{what}: target {target:.6g} not reached within max_samples={max_samples} "
                f"(expected {reach:.6g} at that m, limit {limit:.6g}); the proposal is too peaked — "
                "mix it with uniform or raise the temperature"
            )
        hi = min(2 * hi, max_samples)
    lo = max(1, hi // 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) >= target:
            hi = mid
        else:
            lo = mid
    # smallest error between lo (below) and hi (at or above); ties to the smaller m
    return lo if target - f(lo) <= f(hi) - target else hi


def _search_first(f, target: float, limit: float, max_samples: int, what: str) -> int:
    """The smallest m >= 1 with f(m) >= target (f increasing)."""
    m = _search(f, target, limit, max_samples, what)
    return m if f(m) >= target else m + 1


def sample_count(pi: np.ndarray, target_unique: float, max_samples: int = DEFAULT_MAX_SAMPLES) -> int:
    """Algorithm 2: the m >= 1 that minimises ``|E[J(m)] - j*|`` (ties: the smaller m).

    O(n log m) by exponential then binary search (E[J(m)] increases in m).

    Parameters
    ----------
    pi : ndarray (n,), a proposal.
    target_unique : float, j* in (0, n].
    max_samples : int, the largest m considered.

    Returns
    -------
    m : int. ``|E[J(m)] - j*| <= 0.5`` whenever j* >= 0.5. When j* is at or above the number of
        entries with pi_i > 0 (E[J(m)] only approaches it from below, so no m minimises the error),
        the smallest m with ``E[J(m)] >= j* - 0.5``.

    Raises
    ------
    InputError
        Target outside (0, n]; fewer entries with positive probability than needed
        (``j* - 0.5`` at or above the support size); target not reached within ``max_samples``.
    """
    p = validate_proposal(pi)
    n = p.size
    j = float(target_unique)
    if not (np.isfinite(j) and 0 < j <= n):
        raise InputError(f"target of {target_unique} unique entries is outside (0, n={n}]")
    support = int(np.count_nonzero(p > 0))
    # E[J(m)] -> support as m grows; the target must be approached within 1/2 (strictly reachable)
    if j - 0.5 >= support:
        raise InputError(
            f"target of {j:.6g} unique entries cannot be reached: only {support} of {n} entries "
            "have positive probability"
        )
    pp = p[p > 0]
    f = lambda mm: expected_unique(pp, mm)  # noqa: E731
    if j < support:
        return int(_search(f, j, support, max_samples, "sample_count"))
    # j >= support: E[J(m)] only approaches j from below; take the first m within 1/2 of it
    return int(_search_first(f, j - 0.5, support, max_samples, "sample_count"))


def global_sample_count(
    pis: list[np.ndarray], target_ratio: float, max_samples: int = DEFAULT_MAX_SAMPLES
) -> int:
    """The global soft constraint: one m shared by every head so that the average expected
    compression ``mean_h (1 - E[J_h(m)] / n_h)`` is closest to ``target_ratio``.

    Parameters
    ----------
    pis : list of H proposals, each ndarray (n_h,).
    target_ratio : float in [0, 1), the evicted fraction r*.

    Returns
    -------
    m : int >= 1.
    """
    if not pis:
        raise InputError("global_sample_count: no proposals given")
    r = float(target_ratio)
    if not (np.isfinite(r) and 0 <= r < 1):
        raise InputError(f"target ratio {target_ratio} is outside [0, 1)")
    ps = [validate_proposal(p, name=f"proposal {h}") for h, p in enumerate(pis)]
    ps = [p[p > 0] for p in ps]
    ns = np.array([np.asarray(p).size for p in pis], dtype=np.float64)
    sup = np.array([p.size for p in ps], dtype=np.float64)
    limit = float(np.mean(sup / ns))
    keep = 1.0 - r  # target mean kept fraction

    def f(m: int) -> float:
        return float(np.mean(np.array([expected_unique(p, m) for p in ps]) / ns))

    if keep >= limit:
        raise InputError(
            f"target ratio {r:.6g} cannot be reached: the proposals keep at most {limit:.6g} of the entries on average"
        )
    return int(_search(f, keep, limit, max_samples, "global_sample_count"))


def sample(pi: np.ndarray, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw m entries with replacement from pi; return the unique kept entries and their counts.

    Parameters
    ----------
    pi : ndarray (n,)
    m : int >= 1
    rng : numpy Generator

    Returns
    -------
    kept : ndarray (k,) int64, sorted unique indices.
    counts : ndarray (k,) int64, c_i >= 1, summing to m.
    """
    p = validate_proposal(pi)
    if int(m) != m or m < 1:
        raise InputError(f"number of samples m must be an integer >= 1, got {m}")
    c = rng.multinomial(int(m), p)
    kept = np.flatnonzero(c).astype(np.int64)
    return kept, c[kept].astype(np.int64)
