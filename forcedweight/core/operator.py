"""The forced-weight operator and its errors (docs/concepts.md), pure float64 NumPy.

Notation: weights ``p`` (N,), values ``V`` (N, d), kept set ``S`` (an index array of size s).
With ``a_i = p_i (v_i - mu)`` (the *centred contributions*, rows of ``A``), ``y = sum_{S} a_i``
and ``w = p(S)``, the forced-weight error is ``E(S) = ||y|| / w``: the identity-friendly form
every solver in the package shares. Since ``sum_i a_i = 0``, ``y`` is also ``-sum_{S^c} a_i``,
and the shorter side is summed; ``w`` is always summed directly (non-negative terms), and ``A`` is
centred in two passes so that a large offset shared by the values costs no accuracy.
"""

from __future__ import annotations

import math

import numpy as np


def as_index(S, n: int) -> np.ndarray:
    """Kept set as a sorted unique int64 index array; raises ValueError on out-of-range keys."""
    idx = np.unique(np.asarray(S, dtype=np.int64).ravel())
    if idx.size and (idx[0] < 0 or idx[-1] >= n):
        raise ValueError(f"kept set has an index outside [0, {n})")
    return idx


def _norm(y: np.ndarray) -> float:
    """``||y||_2`` without under/overflow: ``np.linalg.norm`` squares the entries, so vectors with
    entries below ~1e-154 (tiny masses or values) or above ~1e154 are rescaled first, by a power of two
    (``unit_exponent``), so that the norm of ``y * 2**k`` is exactly ``2**k`` times the norm of ``y``
    (dividing by ``max |y|`` rounded, and tiny rows then differed from the same rows at scale one by an ulp)."""
    m = float(np.abs(y).max()) if y.size else 0.0
    if m == 0.0 or not np.isfinite(m) or 1e-150 <= m <= 1e150:
        return float(np.linalg.norm(y))
    k = unit_exponent(y)
    z = np.ldexp(y, -k)
    return float(np.ldexp(np.sqrt(z.dot(z)), k))  # as np.linalg.norm computes it; inf past the float range


def row_norms(Y: np.ndarray) -> np.ndarray:
    """``||Y[i]||_2`` for each row of Y (n, d), shape (n,), each at its own power-of-two scale (as ``_norm``): a
    row of entries ~1e-200 would square to 0. Computed as the einsum of the scaled rows, so the same in any
    batch (the NumPy reference ``certify.enumerate.brute_force_best``)."""
    _, k = np.frexp(np.abs(Y).max(axis=1))
    Z = np.ldexp(Y, -k[:, None])
    return np.ldexp(np.sqrt(np.einsum("ij,ij->i", Z, Z)), k)


def as_row(p, V, s: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(p, V)`` as float64 arrays of shapes (N,) and (N, d); checks ``1 <= s <= N`` when s is given.

    The common argument handling of the solvers (raises ValueError on a bad budget).
    """
    p = np.asarray(p, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64).reshape(p.shape[0], -1)
    if s is not None and not 1 <= s <= p.shape[0]:
        raise ValueError(f"s = {s} outside [1, {p.shape[0]}]")
    return p, V


def dense_output(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``mu = sum_i p_i v_i``, shape (d,)."""
    return p @ V


def centred_values(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``v_i - mu`` for every key, shape (N, d), accurate relative to the values' spread around mu."""
    # two-pass centring: with a large offset shared by the values, V - mu1 is exact (Sterbenz)
    # and the small correction is accurate, so the rows stay accurate relative to the spread
    D = V - dense_output(p, V)[None, :]
    return D - (p @ D)[None, :]


def centred_contributions(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``A`` with rows ``a_i = p_i (v_i - mu)``, shape (N, d); its rows sum to zero."""
    return p[:, None] * centred_values(p, V)


def kept_mass(p: np.ndarray, S) -> float:
    """``p(S)``, summed directly (non-negative terms: accurate to a relative ``|S| eps``, unlike
    ``1 - p(S^c)``, which loses every digit of a small kept mass)."""
    idx = as_index(S, p.shape[0])
    return float(p[idx].sum())


def dropped_mass(p: np.ndarray, S) -> float:
    """``D(S) = 1 - p(S)``."""
    idx = as_index(S, p.shape[0])
    mask = np.ones(p.shape[0], dtype=bool)
    mask[idx] = False
    return float(p[mask].sum())


def forced_output(p: np.ndarray, V: np.ndarray, S) -> np.ndarray:
    """``m_S = sum_{i in S} p_i v_i / p(S)``, shape (d,)."""
    idx = as_index(S, p.shape[0])
    ps = p[idx]
    return ps @ V[idx] / ps.sum()


def forced_error(p: np.ndarray, V: np.ndarray, S, A: np.ndarray | None = None) -> float:
    """``E(S) = ||m_S - mu||_2``, computed as ``||y|| / p(S)`` with ``y = sum_{S} a_i``.

    Parameters
    ----------
    p : (N,) float64 weights summing to 1.
    V : (N, d) float64 values.
    S : kept indices (any order, unique).
    A : optional precomputed ``centred_contributions(p, V)``.
    """
    n = p.shape[0]
    idx = as_index(S, n)
    if idx.size == 0:
        raise ValueError("kept set is empty")
    if idx.size == n:
        return 0.0
    if A is None:
        A = centred_contributions(p, V)
    w = p[idx].sum()  # direct: 1 - p(S^c) would cancel when the kept mass is small
    if 2 * idx.size <= n:
        y = A[idx].sum(axis=0)
    else:
        mask = np.ones(n, dtype=bool)
        mask[idx] = False
        y = -A[mask].sum(axis=0)
    if w <= 0:
        return float("inf")
    return float(_norm(y) / w)


def unit_exponent(X: np.ndarray) -> int:
    """``k`` with ``max |X| * 2**-k`` in [0.5, 1) (0 for an empty, all-zero or non-finite X). ``np.ldexp(X, -k)``
    scales exactly in float64, and so does every sum, product and square root after it: a search on the
    scaled values is the same search, without squares of 1e-170 underflowing (E is homogeneous in V)."""
    m = float(np.abs(X).max()) if np.size(X) else 0.0
    return math.frexp(m)[1] if m > 0 and math.isfinite(m) else 0


def forced_error_rounding(V: np.ndarray, s: int) -> float:
    """First-order bound on the float64 rounding of ``forced_error`` for values V ((N,) or (N, d)) and s keys.

    ``mu`` is off by at most ``N eps max ||v_i||``, the centred terms, their sum and its norm by about
    ``(2 s + d + 3) eps max ||v_i||`` in total; doubled for safety:
    ``2 (N + 2 s + d + 3) eps max_i ||v_i||`` (``2 (N + 2 s + 4) eps max |v_i|`` in 1-D).
    A set whose computed E is at or below it may be an exact 0.
    """
    V = np.asarray(V, dtype=np.float64)
    V2 = V.reshape(V.shape[0], -1)
    m = float(np.abs(V2).max()) if V2.size else 0.0
    if m == 0.0 or not np.isfinite(m):
        return 0.0 if m == 0.0 else float("inf")
    Z = V2 / m  # (the squares of values near 1e-170 or 1e170 would under/overflow)
    big = m * (float(np.sqrt((Z * Z).sum(axis=1)).max()) if V2.shape[1] > 1 else 1.0)
    # relative to the values: an absolute floor of eps (max(1, big) before) took every E of values below
    # ~1e-12 for an exact 0, and SCIP proved a wrong set optimal there
    return 2.0 * (V2.shape[0] + 2 * s + V2.shape[1] + 3) * np.finfo(np.float64).eps * big


def forced_error_identity(p: np.ndarray, V: np.ndarray, S) -> float:
    """``E(S)`` by the law of total expectation: ``D(S) * ||m_S - m_{S^c}||`` (0 when S = all)."""
    n = p.shape[0]
    idx = as_index(S, n)
    if idx.size == n:
        return 0.0
    comp = np.setdiff1d(np.arange(n), idx)
    pc = p[comp]
    if pc.sum() == 0:
        return 0.0
    m_c = pc @ V[comp] / pc.sum()
    return float(dropped_mass(p, idx) * np.linalg.norm(forced_output(p, V, idx) - m_c))


def single_key_errors(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``e_j = p_j * ||m_{-j} - v_j||``: the error of dropping key j alone, shape (N,).

    Equal to ``E([N] minus {j})`` by the identity; ``m_{-j} = (mu - p_j v_j) / (1 - p_j)``.
    A key holding all the mass (``p_j = 1``) gets ``inf``.
    """
    # m_{-j} - v_j = (mu - v_j) / (1 - p_j), so e_j = ||a_j|| / (1 - p_j) with a_j = p_j (v_j - mu)
    A = centred_contributions(p, V)
    rest = 1.0 - p
    if p.size:
        # 1 - p_j cancels for a key holding nearly all the mass: sum the others directly
        j = int(np.argmax(p))
        rest[j] = float(np.delete(p, j).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.abs(A).max(axis=1) if A.shape[1] else np.zeros(A.shape[0])
        z = A / np.where(m > 0, m, 1.0)[:, None]  # row-scaled: no under/overflow in the squares
        e = m * np.sqrt(np.einsum("ij,ij->i", z, z)) / rest
    e[rest <= 0] = np.inf
    return e


def rank_order(score: np.ndarray) -> np.ndarray:
    """Indices of a (N,) score from largest to smallest, ties to the lower index: THE tie rule.

    Every "keep the top s" in the package (top-mass, selectors, pools, the restarts' mass windows,
    deploy policies) ranks with this order, so equal scores always resolve the same way (the branch
    and bound's key order, ``search_row.search_order``, ranks by norm and breaks its ties by mass, then index).
    """
    score = np.asarray(score, dtype=np.float64)
    return np.lexsort((np.arange(score.shape[0]), -score))


def top_s(score: np.ndarray, s: int) -> np.ndarray:
    """The s largest scores, ties to the lower index (``rank_order``); returned sorted, int64 (s,)."""
    return np.sort(rank_order(score)[:s]).astype(np.int64)


def top_mass_set(p: np.ndarray, s: int) -> np.ndarray:
    """The s largest weights, ties broken by lower index; returned sorted."""
    return top_s(p, s)


def _simplex_lsq(X: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin_{w >= 0, sum w = 1} ||X w - b||``, X (d, k), b (d,); returns w (k,).

    On the simplex ``X w - b = Y w`` with ``Y = X - b 1^T``, so this is the point of the convex hull
    of Y's columns nearest the origin: Wolfe's (1976) minimum-norm-point algorithm, on Y scaled to a
    unit largest entry (the tolerances are relative, so the answer does not depend on the scale of
    V or on an offset shared by the values and mu). Each major step adds the column most opposed
    to the current point; minor steps solve the affine least squares on the corral and step back to
    the simplex when a weight would turn negative.
    """
    d, k = X.shape
    if k == 1:
        return np.ones(1)
    Y = X - b[:, None]
    scale = float(np.abs(Y).max())
    if not scale > 0:  # every column equals b
        return np.full(k, 1.0 / k)
    Y = Y / scale
    sq = np.einsum("ij,ij->j", Y, Y)  # squared column norms, (k,)
    sq_max = float(sq.max())
    S = [int(np.argmin(sq))]
    lam = np.ones(1)
    for _ in range(50 * k + 50):
        x = Y[:, S] @ lam  # the current point of the hull
        x2 = float(x @ x)
        gx = Y.T @ x  # <x, y_j> for every column j
        j = int(np.argmin(gx))
        # Wolfe's test min_j <x, y_j> >= ||x||^2 (then ||x*|| >= (||x||^2 - gap) / ||x||), with a
        # gap of a relative 1e-10 or the round-off of <x, y_j>; or x at the origin up to round-off
        # (||x|| <= 1e-13 max ||y_j||: without this stop, the approach to an interior origin crawls)
        gap = max(1e-10 * x2, 1e-13 * np.sqrt(x2 * sq_max))
        if gx[j] >= x2 - gap or j in S or x2 <= 1e-26 * sq_max:
            break
        S.append(j)
        lam = np.append(lam, 0.0)
        while True:  # minor cycle: affine minimiser on the corral S, stepping back into the simplex
            m = len(S)
            kkt = np.zeros((m + 1, m + 1))
            YS = Y[:, S]
            kkt[:m, :m] = YS.T @ YS
            kkt[:m, m] = 1.0
            kkt[m, :m] = 1.0
            rhs = np.zeros(m + 1)
            rhs[m] = 1.0
            alpha = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:m]
            alpha /= alpha.sum()
            if np.all(alpha > 1e-14):
                lam = alpha
                break
            neg = alpha <= 1e-14
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = np.where(neg, lam / (lam - alpha), np.inf)
            theta = float(min(1.0, max(0.0, ratios.min())))
            lam = (1.0 - theta) * lam + theta * alpha
            drop = lam <= 1e-14
            if neg[np.argmin(ratios)]:
                drop[int(np.argmin(ratios))] = True
            S = [i for i, dr in zip(S, drop) if not dr]
            lam = np.maximum(lam[~drop], 0.0)
            lam /= lam.sum()
            if len(S) == 1:
                lam = np.ones(1)
                break
    w = np.zeros(k)
    w[S] = lam
    return w


def free_weight_error(p: np.ndarray, V: np.ndarray, S) -> float:
    """``EF(S) = min_{w in simplex(S)} ||sum_{i in S} w_i v_i - mu||`` (weights re-solved), computed on
    ``centred_values`` like E, so an offset shared by the values leaves no round-off of its size."""
    idx = as_index(S, p.shape[0])
    C = centred_values(p, V)[idx].T  # (d, |S|)
    w = _simplex_lsq(C, np.zeros(C.shape[0]))
    return float(np.linalg.norm(C @ w))


#: relative round-off level of E and EF (Wolfe's min-norm point is good to ~1e-13 of the scale)
PI_FLOOR = 1e-13


def penalty_scale(p: np.ndarray, V: np.ndarray) -> float:
    """The round-off scale of E and EF: the largest ``||v_i - mu1||`` with ``mu1 = fl(p @ V)`` (one
    pass). It is the values' spread around mu, an offset shared by every value cancelling; where the
    values coincide it is mu's own rounding, which the centring leaves in both E and EF."""
    D = V - dense_output(p, V)[None, :]
    return float(np.sqrt(np.einsum("ij,ij->i", D, D).max()))


def penalty_ratio(e: float, ef: float, scale: float) -> float:
    """``pi = E / EF``; an EF at round-off level (``<= PI_FLOOR * scale``, ``penalty_scale``) counts
    as 0: ``inf`` when E is above that level, ``nan`` when both are.

    The floor is the accuracy of the quantities themselves: E and EF come from centred values and
    Wolfe's min-norm point gives EF to ~1e-13 of the scale (a few hundred ulps), so peaked rows whose
    E and EF are ~1e-11 of the scale keep a meaningful π (a floor of 1e-10 dropped them as NaN)."""
    floor = PI_FLOOR * max(scale, 1e-300)
    if ef <= floor:
        return float("nan") if e <= floor else float("inf")
    return e / ef


def penalty(p: np.ndarray, V: np.ndarray, S) -> float:
    """Forced-weight penalty ``pi(S) = E(S) / EF(S)`` (>= 1; ``nan`` when both are 0, ``inf`` when
    EF = 0 < E, 0 meaning at most the round-off floor of ``penalty_ratio``)."""
    return penalty_ratio(forced_error(p, V, S), free_weight_error(p, V, S), penalty_scale(p, V))
