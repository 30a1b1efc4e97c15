"""PyTorch path for ragged grouped-query decode attention (the CPU backend), vectorised over segments.

Exact strategies:

- **padded**: segments viewed (all lengths equal: no copy) or gathered into [S, Lmax, D]; logits for
  the G query heads of each group as one batched matmul, masked softmax, batched matmul with values;
- **bucketed** (default when lengths differ): up to ``SEGMENT_LOOP_MAX`` segments, each one alone
  (zero-copy views); beyond, segments grouped by ``ceil(log2(length))``, the padded strategy per group,
  so padding never more than doubles the entries touched;
- **scatter**: no padding at all: each packed entry gets its segment id (``repeat_interleave``),
  logits are gathered dot products, and the per-segment softmax is a scatter (``scatter_reduce`` amax,
  then ``index_add_`` of the exponentials and of the weighted values). Slower; kept as a cross-check.

Accumulation in float32 (float64 inputs stay float64).
"""

from __future__ import annotations

import math

import torch

METHODS = ("auto", "padded", "bucketed", "scatter")
SEGMENT_LOOP_MAX = 16  # up to this many segments, "bucketed" takes each segment alone (views, no copy)


def ragged_decode_torch(q, k, v, indptr, bias=None, sm_scale=None, method="auto", chunk=1 << 16):
    """Ragged decode attention on the PyTorch path.

    Parameters
    ----------
    q : Tensor [B, Hq, D]; k : Tensor [T, D]; v : Tensor [T, Dv];
    indptr : Tensor [B*Hkv + 1] integer; bias : optional Tensor [T] float32;
    sm_scale : float, defaults to ``1/sqrt(D)``;
    method : "auto" (padded when all lengths are equal, else bucketed), "padded", "bucketed", "scatter";
    chunk : entries per pass of the scatter method (bounds its [chunk, G, D] temporaries).

    Returns
    -------
    out : Tensor [B, Hq, Dv] in q's dtype (zeros for an empty segment)
    lse : Tensor [B, Hq] float32 natural log (``-inf`` for an empty segment)
    """
    B, Hq, D = q.shape
    S = indptr.numel() - 1
    G = Hq // (S // B)
    T, Dv = v.shape
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    ptr = indptr.to(device=q.device, dtype=torch.int64)
    lengths = ptr[1:] - ptr[:-1]
    lmax = int(lengths.max()) if S else 0
    if method == "auto":
        method = "padded" if bool((lengths == lmax).all()) else "bucketed"
    if T == 0:
        out = torch.zeros(B, Hq, Dv, dtype=q.dtype, device=q.device)
        return out, torch.full((B, Hq), -math.inf, device=q.device)
    qs = q.reshape(S, G, D).to(acc)
    if method == "padded":
        num, denom, m = _padded(qs, k, v, ptr[:-1], lengths, bias, scale, acc)
    elif method == "bucketed":
        num = torch.zeros(S, G, Dv, dtype=acc, device=q.device)
        denom = torch.zeros(S, G, dtype=acc, device=q.device)
        m = torch.zeros(S, G, dtype=acc, device=q.device)
        if S <= SEGMENT_LOOP_MAX:  # few segments: one zero-copy view per segment beats gathering
            bucket = torch.arange(S, device=q.device)
        else:  # many: group by ceil(log2(length)), gather and pad per group
            bucket = torch.ceil(torch.log2(lengths.clamp_min(1).to(torch.float64))).long()
        bucket[lengths == 0] = -1  # empty segments: nothing to compute
        for j in torch.unique(bucket).tolist():
            if j < 0:
                continue
            sel = torch.nonzero(bucket == j).squeeze(1)
            num[sel], denom[sel], m[sel] = _padded(qs[sel], k, v, ptr[sel], lengths[sel], bias, scale, acc)
    elif method == "scatter":
        num, denom, m = _scatter(qs, k, v, ptr, lengths, bias, scale, acc, chunk)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    live = denom > 0
    safe = torch.where(live, denom, 1)
    out = torch.where(live.unsqueeze(2), num / safe.unsqueeze(2), 0)
    lse = torch.where(live, m + torch.log(safe), -math.inf)
    return out.reshape(B, Hq, Dv).to(q.dtype), lse.reshape(B, Hq).float()


def _padded(qs, k, v, starts, lengths, bias, scale, acc):
    """Segments starting at ``starts`` [S'] with ``lengths`` [S'], queries ``qs`` [S', G, D].

    Returns unnormalised output [S', G, Dv], softmax denominators [S', G] and maxima [S', G] (finite).
    """
    S = qs.shape[0]
    T = k.shape[0]
    lmax = int(lengths.max())
    # one contiguous run of equal segments (an unevicted cache, a single segment): plain views, no copy
    s0 = int(starts[0])
    run = starts - s0 == lmax * torch.arange(S, device=k.device)
    uniform = bool((lengths == lmax).all()) and bool(run.all())
    if uniform:
        kp, vp = k[s0:s0 + S * lmax].view(S, lmax, -1), v[s0:s0 + S * lmax].view(S, lmax, -1)
        src, valid = None, None
    else:
        pos = torch.arange(lmax, device=k.device)
        valid = pos[None, :] < lengths[:, None]  # [S, Lmax]
        src = (starts[:, None] + pos[None, :]).clamp_max(T - 1)
        flat = src.reshape(-1)
        kp = k.index_select(0, flat).view(S, lmax, -1)  # index_select: several times faster than k[src]
        vp = v.index_select(0, flat).view(S, lmax, -1)
    logits = torch.bmm(qs, kp.to(acc).transpose(1, 2))  # [S, G, Lmax]
    logits.mul_(scale)
    if bias is not None:
        b = bias[s0:s0 + S * lmax].to(acc).view(S, lmax) if uniform else bias.to(acc).index_select(0, flat).view(S, lmax)
        logits.add_(b.unsqueeze(1))
    if valid is not None:
        logits.masked_fill_(~valid.unsqueeze(1), -math.inf)
    m = logits.amax(-1)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(logits - m.unsqueeze(2))
    return torch.bmm(w, vp.to(acc)), w.sum(-1), m


def _scatter(qs, k, v, ptr, lengths, bias, scale, acc, chunk):
    """As :func:`_padded`, by scatter over segment ids (no padding)."""
    S, G, D = qs.shape
    T, Dv = v.shape
    dev = qs.device
    seg = torch.repeat_interleave(torch.arange(S, device=dev), lengths, output_size=T)  # [T]
    logits = torch.empty(T, G, dtype=acc, device=dev)
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        logits[c0:c1] = torch.einsum("tgd,td->tg", qs[seg[c0:c1]], k[c0:c1].to(acc))
    logits.mul_(scale)
    if bias is not None:
        logits.add_(bias.to(device=dev, dtype=acc).unsqueeze(1))
    m = torch.full((S, G), -math.inf, dtype=acc, device=dev)
    m.scatter_reduce_(0, seg.unsqueeze(1).expand(T, G), logits, reduce="amax", include_self=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(logits - m[seg])  # [T, G]
    denom = torch.zeros(S, G, dtype=acc, device=dev).index_add_(0, seg, w)
    num = torch.zeros(S, G, Dv, dtype=acc, device=dev)
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        num.index_add_(0, seg[c0:c1], torch.bmm(w[c0:c1].unsqueeze(2), v[c0:c1].to(acc).unsqueeze(1)))
    return num, denom, m
