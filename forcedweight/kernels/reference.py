"""Float64 reference for ragged grouped-query decode attention: plain loops over segments.

Layout (shared with :mod:`forcedweight.kernels.ragged_decode`): ``q`` [B, Hq, D]; packed keys ``k`` [T, D]
and values ``v`` [T, Dv]; ``indptr`` [B*Hkv + 1], segment ``b*Hkv + h`` holds batch b's KV head h in
``k[indptr[s]:indptr[s+1]]``. Query head ``j`` reads KV head ``j // G`` with ``G = Hq // Hkv`` (the
``repeat_kv`` convention of transformers).
"""

from __future__ import annotations

import math

import torch


def ragged_decode_reference(q, k, v, indptr, bias=None, sm_scale=None):
    """Ragged decode attention in float64, one segment at a time.

    Parameters
    ----------
    q : Tensor [B, Hq, D]
    k : Tensor [T, D]
    v : Tensor [T, Dv]
    indptr : Tensor [B*Hkv + 1] integer, non-decreasing, ``indptr[0] == 0``, ``indptr[-1] == T``.
    bias : optional Tensor [T], added to the scaled logits (natural-log units).
    sm_scale : float, defaults to ``1/sqrt(D)``.

    Returns
    -------
    out : Tensor [B, Hq, Dv] float64 (zeros for an empty segment)
    lse : Tensor [B, Hq] float64, natural-log log-sum-exp of the biased scaled logits (``-inf`` when empty)
    """
    B, Hq, D = q.shape
    S = indptr.numel() - 1
    Hkv = S // B
    G = Hq // Hkv
    Dv = v.shape[1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    qd, kd, vd = q.double().cpu(), k.double().cpu(), v.double().cpu()
    bd = None if bias is None else bias.double().cpu()
    ptr = [int(x) for x in indptr.cpu()]
    out = torch.zeros(B, Hq, Dv, dtype=torch.float64)
    lse = torch.full((B, Hq), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(Hkv):
            s0, s1 = ptr[b * Hkv + h], ptr[b * Hkv + h + 1]
            if s1 == s0:
                continue
            ks, vs = kd[s0:s1], vd[s0:s1]
            for g in range(G):
                j = h * G + g
                logits = (ks @ qd[b, j]) * scale
                if bd is not None:
                    logits = logits + bd[s0:s1]
                m = logits.max()
                if m == -math.inf:
                    continue
                w = torch.exp(logits - m)
                total = w.sum()
                out[b, j] = (w / total) @ vs
                lse[b, j] = m + torch.log(total)
    return out, lse
