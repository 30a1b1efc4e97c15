"""Independent proofs of balanced-partition answers (no MIP solver involved).

The question behind every hardness instance (docs/instances.md) is the *balanced partition* of integers
``a_1..a_m`` (m even): is there a set ``S`` with ``|S| = m/2`` and ``sum_S a = sum_{S^c} a``?
This module answers it exactly, in integer arithmetic, by meet-in-the-middle over **signed**
sums: a split is a sign vector ``sigma`` (+1 in S, -1 outside) with ``sum sigma = 0``, and
``|2 sum_S a - T| = |sum_i sigma_i a_i|`` (T the total). Each half of the integers contributes
all its signed sums, grouped by how many of its elements go into S; the two halves are matched
by sorting one side and binary-searching the negation of the other.

It deliberately shares no code with ``forcedweight.certify.solvers.mitm`` (which minimises the forced
error over subset sums split by size, for any budget s), so that the generators' answers and
that solver check each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

#: int64 headroom: every signed sum formed here is bounded by sum |a_i| < 2**62.
INT64_SAFE = 2**62
#: Largest m proved here (2**(m/2) signed sums per half must fit in memory).
MAX_M = 48


@dataclass(frozen=True)
class BalancedProof:
    """The exact minimum imbalance over balanced splits of a list of integers.

    Attributes
    ----------
    min_diff : int
        ``min over |S| = m/2 of |2 sum_S a - T|`` (a Python int, exact).
    split : ndarray (m/2,) int64, sorted
        One split attaining ``min_diff`` (contains index 0: S and its complement tie).
    total : int
        ``T = sum a``.
    m : int
    """

    min_diff: int
    split: np.ndarray
    total: int
    m: int

    @property
    def exists(self) -> bool:
        """True iff an equal-sum balanced split exists."""
        return self.min_diff == 0

    @property
    def gap(self) -> float:
        """``min_diff / m``: the exact ES of the ZEROES row with values a_i (uniform masses, s = m/2).

        With ``p_i = 1/m`` and ``s = m/2``, ``E(S) = |sum_S a / s - T / m| = |2 sum_S a - T| / m``.
        """
        return self.min_diff / self.m


def check_integers(integers) -> np.ndarray:
    """The integers as an int64 array of even length m >= 2 with ``sum |a| < 2**62``; ValueError otherwise."""
    raw = np.asarray(integers)
    if raw.ndim != 1:
        raise ValueError(f"integers must be one-dimensional, got shape {raw.shape}")
    if raw.dtype.kind == "f":
        if not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw)):
            raise ValueError("integers contain a non-integer value")
        if np.any(np.abs(raw) >= 2.0**53):
            raise ValueError("integers exceed 2**53 in magnitude (not exact in float64)")
    elif raw.dtype.kind not in "iu":
        raise ValueError(f"integers must be integers, got dtype {raw.dtype}")
    elif raw.dtype.kind == "u" and raw.size and int(raw.max()) >= INT64_SAFE:  # (astype would wrap them)
        raise ValueError("sum of |integers| reaches 2**62: int64 arithmetic would overflow")
    a = raw.astype(np.int64)
    m = a.size
    if m < 2 or m % 2:
        raise ValueError(f"balanced partition needs an even number m >= 2 of integers, got {m}")
    if sum(abs(int(x)) for x in a) >= INT64_SAFE:
        raise ValueError("sum of |integers| reaches 2**62: int64 arithmetic would overflow")
    return a


def _signed_sums(half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ``2**h`` signed sums of a half and the number of +1 signs; index bit j = sign of element j.

    Returns
    -------
    signed : ndarray (2**h,) int64, ``sum_j sigma_j half_j`` with sigma_j = +1 iff bit j of the index
    plus : ndarray (2**h,) int8, popcount of the index
    """
    signed = np.array([-int(half.sum())], dtype=np.int64)
    plus = np.zeros(1, dtype=np.int8)
    for x in half:
        signed = np.concatenate([signed, signed + 2 * x])
        plus = np.concatenate([plus, plus + 1])
    return signed, plus


def prove_balanced(integers) -> BalancedProof:
    """Exact minimum of ``|2 sum_S a - T|`` over ``|S| = m/2``, by signed-sum meet-in-the-middle.

    Parameters
    ----------
    integers : sequence of int, length m (even, m <= 48)

    Returns
    -------
    BalancedProof
        ``min_diff == 0`` proves a yes-instance (``split`` is a witness); otherwise it proves that no
        equal split exists and states the exact gap.
    """
    a = check_integers(integers)
    m = a.size
    if m > MAX_M:
        raise ValueError(f"m = {m} is too large for the meet-in-the-middle proof (at most {MAX_M})")
    half = m // 2
    # Fix a_0 in S (S and its complement have the same imbalance): the left half is a[1:h].
    h = half
    left, right = a[1:h], a[h:]
    gl, cl = _signed_sums(left)
    gr, cr = _signed_sums(right)
    gl = gl + a[0]  # a_0 always carries sign +1
    l_order = np.argsort(cl, kind="stable")
    l_bounds = np.concatenate([[0], np.cumsum(np.bincount(cl, minlength=left.size + 1))])
    r_order = np.argsort(cr, kind="stable")
    r_bounds = np.concatenate([[0], np.cumsum(np.bincount(cr, minlength=right.size + 1))])
    best = None  # (diff, left_mask, right_mask)
    for k in range(0, left.size + 1):  # k elements of S among left (besides a_0)
        kk = half - 1 - k
        if kk < 0 or kk > right.size:
            continue
        il = l_order[l_bounds[k]: l_bounds[k + 1]]
        ir = r_order[r_bounds[kk]: r_bounds[kk + 1]]
        xr = gr[ir]
        order = np.argsort(xr, kind="stable")
        xs = xr[order]
        xl = gl[il]
        pos = np.searchsorted(xs, -xl)
        lo = np.clip(pos - 1, 0, xs.size - 1)
        hi = np.clip(pos, 0, xs.size - 1)
        dlo = np.abs(xl + xs[lo])
        dhi = np.abs(xl + xs[hi])
        take_hi = dhi < dlo
        d = np.where(take_hi, dhi, dlo)
        j = int(np.argmin(d))
        if best is None or int(d[j]) < best[0]:
            jr = int(hi[j]) if take_hi[j] else int(lo[j])
            best = (int(d[j]), int(il[j]), int(ir[order[jr]]))
            if best[0] == 0:
                break
    diff, lmask, rmask = best
    split = [0]
    split += [1 + j for j in range(left.size) if lmask >> j & 1]
    split += [h + j for j in range(right.size) if rmask >> j & 1]
    return BalancedProof(diff, np.array(sorted(split), dtype=np.int64), int(sum(int(x) for x in a)), m)


def brute_force_balanced(integers) -> int:
    """``min |2 sum_S a - T|`` over every balanced split, by plain enumeration (small m only)."""
    a = [int(x) for x in check_integers(integers)]
    m = len(a)
    if m > 20:
        raise ValueError("brute force is for m <= 20")
    total = sum(a)
    return min(abs(2 * sum(a[i] for i in S) - total) for S in combinations(range(m), m // 2))


def verify_witness(integers, witness) -> bool:
    """True iff ``witness`` is a balanced split (m/2 distinct indices) with equal sums (exact ints)."""
    a = [int(x) for x in check_integers(integers)]
    if any(int(i) != i for i in witness):  # (int() would truncate 0.9 to 0)
        return False
    w = sorted(int(i) for i in witness)
    if len(w) != len(a) // 2 or len(set(w)) != len(w) or w[0] < 0 or w[-1] >= len(a):
        return False
    return 2 * sum(a[i] for i in w) == sum(a)
