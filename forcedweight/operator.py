"""The forced-weight operator and its errors (SPEC §3), pure float64 NumPy.

Notation: weights ``p`` (N,), values ``V`` (N, d), kept set ``S`` (an index array of size s).
With ``a_i = p_i (v_i - mu)`` (the *centred contributions*, rows of ``A``), ``y = sum_{S} a_i``
and ``w = p(S)``, the forced-weight error is ``E(S) = ||y|| / w``: the identity-friendly form
every solver in the package shares. Since ``sum_i a_i = 0``, ``y`` is also ``-sum_{S^c} a_i``,
and the shorter side is summed for accuracy.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls


def as_index(S, n: int) -> np.ndarray:
    """Kept set as a sorted unique int64 index array; raises ValueError on out-of-range keys."""
    idx = np.unique(np.asarray(S, dtype=np.int64).ravel())
    if idx.size and (idx[0] < 0 or idx[-1] >= n):
        raise ValueError(f"kept set has an index outside [0, {n})")
    return idx


def dense_output(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``mu = sum_i p_i v_i``, shape (d,)."""
    return p @ V


def centred_contributions(p: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``A`` with rows ``a_i = p_i (v_i - mu)``, shape (N, d); its rows sum to zero."""
    mu = dense_output(p, V)
    return p[:, None] * (V - mu[None, :])


def kept_mass(p: np.ndarray, S) -> float:
    """``p(S)``; summed over the shorter side (``1 - p(S^c)`` when S is the larger part)."""
    idx = as_index(S, p.shape[0])
    if 2 * idx.size <= p.shape[0]:
        return float(p[idx].sum())
    mask = np.ones(p.shape[0], dtype=bool)
    mask[idx] = False
    return float(1.0 - p[mask].sum())


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
    if 2 * idx.size <= n:
        y = A[idx].sum(axis=0)
        w = p[idx].sum()
    else:
        mask = np.ones(n, dtype=bool)
        mask[idx] = False
        y = -A[mask].sum(axis=0)
        w = 1.0 - p[mask].sum()
    if w <= 0:
        return float("inf")
    return float(np.linalg.norm(y) / w)


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
    mu = dense_output(p, V)
    rest = 1.0 - p
    with np.errstate(divide="ignore", invalid="ignore"):
        m_minus = (mu[None, :] - p[:, None] * V) / rest[:, None]
        e = p * np.linalg.norm(m_minus - V, axis=1)
    e[rest <= 0] = np.inf
    return e


def top_mass_set(p: np.ndarray, s: int) -> np.ndarray:
    """The s largest weights, ties broken by lower index; returned sorted."""
    order = np.lexsort((np.arange(p.shape[0]), -p))
    return np.sort(order[:s])


def _simplex_lsq(X: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin_{w >= 0, sum w = 1} ||X w - b||``, X (d, k).

    Active-set solution: NNLS on the system augmented with a heavily weighted row for
    ``sum w = 1`` gives the support; the equality-constrained least squares on that support
    is then solved exactly through its KKT system, and the support is refined until the
    multipliers certify optimality.
    """
    d, k = X.shape
    if k == 1:
        return np.ones(1)
    scale = max(1.0, float(np.abs(X).max()), float(np.abs(b).max()))
    lam = 1e4 * scale
    Xa = np.vstack([X, lam * np.ones((1, k))])
    ba = np.concatenate([b, [lam]])
    w, _ = nnls(Xa, ba, maxiter=50 * k)
    support = w > 1e-14
    if not support.any():
        support[np.argmin(np.linalg.norm(X - b[:, None], axis=0))] = True
    for _ in range(4 * k):
        F = np.flatnonzero(support)
        G = X[:, F].T @ X[:, F]
        kkt = np.zeros((F.size + 1, F.size + 1))
        kkt[:-1, :-1] = G
        kkt[:-1, -1] = 1.0
        kkt[-1, :-1] = 1.0
        rhs = np.concatenate([X[:, F].T @ b, [1.0]])
        sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
        wf, nu = sol[:-1], sol[-1]
        if np.any(wf < -1e-15):
            # step back to feasibility: drop the most negative coordinate
            support[F[np.argmin(wf)]] = False
            continue
        w = np.zeros(k)
        w[F] = np.maximum(wf, 0.0)
        w /= w.sum()
        # KKT: gradient g = X^T (X w - b); optimal iff g_i + nu >= 0 off the support
        g = X.T @ (X @ w - b)
        viol = g + nu
        viol[F] = 0.0
        j = int(np.argmin(viol))
        if viol[j] >= -1e-12 * max(1.0, float(np.abs(g).max())):
            return w
        support[j] = True
    return w


def free_weight_error(p: np.ndarray, V: np.ndarray, S) -> float:
    """``EF(S) = min_{w in simplex(S)} ||sum_{i in S} w_i v_i - mu||`` (weights re-solved)."""
    idx = as_index(S, p.shape[0])
    mu = dense_output(p, V)
    X = V[idx].T
    w = _simplex_lsq(X, mu)
    return float(np.linalg.norm(X @ w - mu))


def penalty(p: np.ndarray, V: np.ndarray, S) -> float:
    """Forced-weight penalty ``pi(S) = E(S) / EF(S)`` (>= 1; ``nan`` when both are 0, ``inf`` when EF = 0 < E)."""
    e = forced_error(p, V, S)
    ef = free_weight_error(p, V, S)
    if ef <= 1e-300:
        return float("nan") if e <= 1e-300 else float("inf")
    return e / ef
