"""Float64 reference for ragged grouped-query decode attention: plain loops over segments.

Two descriptions of the same segments (shared with :mod:`forcedweight.kernels.ragged_decode`):

- **packed**: keys ``k`` [T, D], values ``v`` [T, Dv], ``indptr`` [B*Hkv + 1]; segment ``b*Hkv + h``
  holds batch b's KV head h in rows ``indptr[s] .. indptr[s+1] - 1``;
- **extents**: a buffer ``k`` [C, D], ``v`` [C, Dv] with per-segment ``starts`` [B*Hkv] and ``lengths``
  [B*Hkv]; segment ``s`` is rows ``starts[s] .. starts[s] + lengths[s] - 1`` (rows outside every segment,
  the cache's spare capacity, are never read).

``q`` is [B, Hq, D]; query head ``j`` reads KV head ``j // G`` with ``G = Hq // Hkv`` (the ``repeat_kv``
convention of transformers).

Optional attention features (transformers' eager definitions): ``softcap`` ``c`` maps the scaled logits
``s -> c * tanh(s / c)`` before the bias and the softmax (Gemma 2); ``sinks`` [Hq] adds one logit per
query head to the softmax's denominator with no value (gpt-oss: the sink's share of the softmax is
dropped, so the weights over the entries sum to less than 1).
"""

from __future__ import annotations

import math

import torch


def segment_decode_reference(q, k, v, starts, lengths, bias=None, sm_scale=None, softcap=None, sinks=None):
    """Decode attention in float64 over segments given by ``starts`` / ``lengths``, one at a time.

    Parameters
    ----------
    q : Tensor [B, Hq, D]
    k : Tensor [C, D]; v : Tensor [C, Dv]
    starts, lengths : Tensor [B*Hkv] integer (segment ``s`` = rows ``starts[s] : starts[s] + lengths[s]``).
    bias : optional Tensor [C], added to the scaled logits (natural-log units).
    sm_scale : float, defaults to ``1/sqrt(D)``.
    softcap : optional float ``c > 0``: logits ``s -> c * tanh(s / c)`` (after scaling, before the bias).
    sinks : optional Tensor [Hq]: head ``j``'s sink logit joins the softmax denominator (no value).

    Returns
    -------
    out : Tensor [B, Hq, Dv] float64 (zeros for an empty segment)
    lse : Tensor [B, Hq] float64, natural-log log-sum-exp of the (capped) biased scaled logits and the
        sink (``-inf`` when empty and no sink; the sink logit when empty with one)
    """
    B, Hq, D = q.shape
    S = starts.numel()
    Hkv = S // B
    G = Hq // Hkv
    Dv = v.shape[1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    qd, kd, vd = q.double().cpu(), k.double().cpu(), v.double().cpu()
    bd = None if bias is None else bias.double().cpu()
    sd = None if sinks is None else sinks.double().cpu().reshape(-1)
    st = [int(x) for x in starts.cpu()]
    ln = [int(x) for x in lengths.cpu()]
    out = torch.zeros(B, Hq, Dv, dtype=torch.float64)
    lse = torch.full((B, Hq), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(Hkv):
            s0, n = st[b * Hkv + h], ln[b * Hkv + h]
            ks, vs = kd[s0:s0 + n], vd[s0:s0 + n]
            for g in range(G):
                j = h * G + g
                logits = (ks @ qd[b, j]) * scale
                if softcap is not None:
                    logits = float(softcap) * torch.tanh(logits / float(softcap))
                if bd is not None:
                    logits = logits + bd[s0:s0 + n]
                if sd is not None:  # the sink: one more logit, no value
                    logits = torch.cat([logits, sd[j:j + 1]])
                if logits.numel() == 0:
                    continue
                m = logits.max()
                if m == -math.inf:
                    continue
                w = torch.exp(logits - m)
                total = w.sum()
                out[b, j] = (w[:n] / total) @ vs
                lse[b, j] = m + torch.log(total)
    return out, lse


def ragged_decode_reference(q, k, v, indptr, bias=None, sm_scale=None, softcap=None, sinks=None):
    """As :func:`segment_decode_reference` over packed segments: ``indptr`` [B*Hkv + 1] integer,
    non-decreasing, ``indptr[0] == 0``, ``indptr[-1] == T``; ``k`` [T, D], ``v`` [T, Dv], ``bias`` [T]."""
    ptr = indptr.cpu().to(torch.int64)
    return segment_decode_reference(q, k, v, ptr[:-1], ptr[1:] - ptr[:-1], bias, sm_scale, softcap, sinks)
