"""Decode-time self-normalised importance-sampling correction (paper 000, §5, Algorithm 1).

At eviction, m draws from the proposal pi kept the unique pre-eviction entries I with counts c_i.
At a later decode step with logits s over the kept entries and over the entries written after the
eviction (the post-eviction interval, kept whole), attention is estimated by

    o = (sum_{i in I} w_i e^{s_i} v_i + sum_{j post} e^{s_j} v_j) / (sum_{i in I} w_i e^{s_i} + sum_{j post} e^{s_j}),
    w_i = (c_i / (m pi_i))^(1/tau),

i.e. the importance-sampling estimate of the pre-eviction numerator and normaliser plus the exact
post-eviction ones, under one normaliser. Because ``w_i e^{s_i} = e^{s_i + b_i}`` with
``b_i = log(c_i / (m pi_i)) / tau``, the whole correction is an additive logit bias on the kept
entries (0 on post-eviction entries): exactly what ``forcedweight.kernels.ragged_decode`` takes.
tau = 1 is the estimator of the paper; tau > 1 pulls the weights towards 1 (less variance, more bias);
tau = inf removes the correction (plain sampled eviction).
"""

from __future__ import annotations

import numpy as np

from forcedweight.errors import InputError


def correction_bias(counts: np.ndarray, pi: np.ndarray, m: int, tau: float = 1.0) -> np.ndarray:
    """Per-entry logit bias ``b_i = log(c_i / (m pi_i)) / tau`` for the kept pre-eviction entries.

    Parameters
    ----------
    counts : ndarray (k,) int, c_i >= 1, summing to at most m.
    pi : ndarray (k,), the proposal's probabilities of the same kept entries (all > 0).
    m : int, the number of draws.
    tau : float > 0; ``inf`` gives zeros (no correction).

    Returns
    -------
    bias : ndarray (k,) float64.
    """
    c = np.asarray(counts, dtype=np.float64)
    p = np.asarray(pi, dtype=np.float64)
    if c.shape != p.shape or c.ndim != 1:
        raise InputError(f"counts and pi must be 1-D of one shape, got {c.shape} and {p.shape}")
    if not (tau > 0):
        raise InputError(f"tau must be > 0 (inf for no correction), got {tau}")
    if int(m) != m or m < 1:
        raise InputError(f"m must be an integer >= 1, got {m}")
    if np.any(~np.isfinite(c)) or np.any(c < 1) or np.any(c != np.round(c)):
        raise InputError("counts must be integers >= 1 (kept entries only)")
    if c.sum() > m:
        raise InputError(f"counts sum to {int(c.sum())}, more than m={m} draws")
    if np.any(~np.isfinite(p)) or np.any(p <= 0):
        bad = int(np.flatnonzero(~(np.isfinite(p) & (p > 0)))[0])
        raise InputError(
            f"kept entry {bad} has proposal probability {p[bad]}: the proposal does not cover it"
        )
    if np.isinf(tau):
        return np.zeros_like(c)
    return (np.log(c) - np.log(float(m)) - np.log(p)) / tau


def _rows(x: np.ndarray | None, name: str) -> np.ndarray | None:
    if x is None:
        return None
    a = np.asarray(x, dtype=np.float64)
    if a.ndim not in (1, 2):
        raise InputError(f"{name}: expected (n,) or (Q, n), got shape {a.shape}")
    if np.any(np.isnan(a)) or np.any(a == np.inf):
        raise InputError(f"{name}: NaN or +inf logits")
    return a


def corrected_output(
    logits: np.ndarray,
    values: np.ndarray,
    kept: np.ndarray,
    bias: np.ndarray | None,
    post_logits: np.ndarray | None = None,
    post_values: np.ndarray | None = None,
) -> np.ndarray:
    """Attention over the kept pre-eviction entries (logits + bias) and the post-eviction entries.

    One softmax over ``[logits[kept] + bias, post_logits]`` applied to ``[values[kept]; post_values]``
    (float64). ``bias=None`` is the uncorrected estimator (plain renormalisation over what is kept).

    Parameters
    ----------
    logits : ndarray (n,) or (Q, n), logits of the Q query rows over the n pre-eviction entries.
    values : ndarray (n, d).
    kept : ndarray (k,) int, indices into the n entries.
    bias : ndarray (k,) or None.
    post_logits : ndarray (n_post,) or (Q, n_post) or None; ``-inf`` masks an entry (e.g. causal).
    post_values : ndarray (n_post, d) or None.

    Returns
    -------
    out : ndarray (d,) or (Q, d) float64.
    """
    s = _rows(logits, "logits")
    v = np.asarray(values, dtype=np.float64)
    idx = np.asarray(kept, dtype=np.int64)
    if v.ndim != 2 or v.shape[0] != s.shape[-1]:
        raise InputError(f"values: expected ({s.shape[-1]}, d), got shape {v.shape}")
    n = s.shape[-1]
    if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= n)) or np.unique(idx).size != idx.size:
        raise InputError(f"kept: expected distinct indices in [0, {n}) of shape (k,), got {np.asarray(kept)!r}")
    z = s[..., idx]
    if bias is not None:
        b = np.asarray(bias, dtype=np.float64)
        if b.shape != idx.shape:
            raise InputError(f"bias: expected shape {idx.shape}, got {b.shape}")
        if not np.isfinite(b).all():
            raise InputError("bias: every entry must be finite")
        z = z + b
    vals = v[idx]
    if post_logits is not None:
        ps = _rows(post_logits, "post_logits")
        pv = np.asarray(post_values, dtype=np.float64)
        if pv.ndim != 2 or pv.shape[0] != ps.shape[-1] or pv.shape[1] != v.shape[1]:
            raise InputError(f"post_values: expected ({ps.shape[-1]}, {v.shape[1]}), got {pv.shape}")
        z = np.concatenate(_cat(z, ps), axis=-1)
        vals = np.concatenate([vals, pv], axis=0)
    if z.shape[-1] == 0:
        raise InputError("nothing to attend to: no kept and no post-eviction entries")
    mx = np.max(z, axis=-1, keepdims=True)
    if np.any(np.isneginf(mx)):
        raise InputError("a query row has no visible entry (all logits -inf)")
    w = np.exp(z - mx)
    return (w @ vals) / w.sum(axis=-1, keepdims=True)


def _cat(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Broadcast the leading (query) dimension of two logit blocks so they concatenate on the last."""
    lead = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return [np.broadcast_to(a, lead + a.shape[-1:]), np.broadcast_to(b, lead + b.shape[-1:])]


def two_interval_output(
    logits: np.ndarray,
    values: np.ndarray,
    kept: np.ndarray,
    counts: np.ndarray,
    pi_kept: np.ndarray,
    m: int,
    post_logits: np.ndarray,
    post_values: np.ndarray,
    tau: float = 1.0,
) -> np.ndarray:
    """Paper 000's two-interval estimator written directly, one query row at a time (float64).

    ``Z_pre = sum_I w_i e^{s_i}``, ``o_pre = sum_I w_i e^{s_i} v_i / Z_pre`` (the self-normalised
    importance-sampling estimate of the pre-eviction expectation), ``Z_post``, ``o_post`` exact over
    the post-eviction entries, and ``o = (Z_pre o_pre + Z_post o_post) / (Z_pre + Z_post)``, with
    ``w_i = (c_i / (m pi_i))^(1/tau)``. A reference for :func:`corrected_output` with
    :func:`correction_bias`; shapes as there, logits of one row (n,) and post_logits (n_post,).
    """
    s = np.asarray(logits, dtype=np.float64)
    t = np.asarray(post_logits, dtype=np.float64)
    shift = max(np.max(s[kept]), np.max(t)) if t.size else np.max(s[kept])
    ratio = np.asarray(counts, dtype=np.float64) / (m * np.asarray(pi_kept, dtype=np.float64))
    w = ratio ** (1.0 / tau) if np.isfinite(tau) else np.ones_like(ratio)
    e_pre = w * np.exp(s[kept] - shift)
    z_pre = e_pre.sum()
    o_pre = e_pre @ np.asarray(values, dtype=np.float64)[kept] / z_pre
    e_post = np.exp(t - shift)
    z_post = e_post.sum()
    o_post = e_post @ np.asarray(post_values, dtype=np.float64) / z_post if z_post > 0 else 0.0
    return (z_pre * o_pre + z_post * o_post) / (z_pre + z_post)
