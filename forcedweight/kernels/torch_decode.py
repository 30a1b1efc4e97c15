"""PyTorch path for ragged grouped-query decode attention (the CPU backend), over segment extents.

Segment ``s`` is rows ``starts[s] .. starts[s] + lengths[s] - 1`` of a buffer ``k`` [C, D] / ``v``
[C, Dv] (the ragged cache's layout: rows between segments are spare capacity and never read; packed
``indptr`` segments are the special case ``starts = indptr[:-1]``). Strategies, all exact:

- **auto**: (``return_lse=False`` and no bias: torch SDPA over the same views, one fused call per
  layout or per segment) when every segment has the same length and the starts are an arithmetic progression (an
  unevicted cache, or one evicted to a uniform budget), K/V are one strided ``[S, n, D]`` view of the
  buffer (no copy) and the G query heads of every group go through two batched matmuls; otherwise one
  zero-copy view per segment. Nothing proportional to the entries held is copied (float32 inputs);
- **padded**: segments gathered into a padded ``[S, Lmax, D]`` block and masked (a cross-check);
- **scatter**: no padding: each entry gets its segment id, logits are gathered dot products and the
  per-segment softmax is a scatter (``scatter_reduce`` amax, ``index_add_``) (a cross-check).

Accumulation in float32 (float64 inputs stay float64; float16/bfloat16 segments are widened to float32).

``softcap`` (Gemma 2: scaled logits ``s -> c * tanh(s / c)``, before the bias) and ``sinks`` (gpt-oss: one
logit per query head in the softmax denominator, no value) go through the explicit softmax (never the
fused SDPA call).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

METHODS = ("auto", "padded", "scatter")


def segment_decode_torch(q, k, v, starts, lengths, bias=None, sm_scale=None, method="auto", chunk=1 << 16,
                         host=None, return_lse=True, softcap=None, sinks=None):
    """Ragged decode attention over segment extents on the PyTorch path.

    Parameters
    ----------
    q : Tensor [B, Hq, D]; k : Tensor [C, D]; v : Tensor [C, Dv];
    starts, lengths : Tensor [B*Hkv] integer (inputs assumed validated: extents inside ``[0, C)``);
    bias : optional Tensor [C] float32, added to the scaled logits;
    sm_scale : float, defaults to ``1/sqrt(D)``;
    method : "auto", "padded" or "scatter" (see the module docstring);
    chunk : entries per pass of the scatter method (bounds its [chunk, G, D] temporaries);
    host : optional ``(starts, lengths)`` as Python lists (saves reading the tensors; the cache has them).
    return_lse : False: the caller needs only ``out`` (the attention function); then, without bias, the
        same views go through torch SDPA (one fused call instead of about ten small ops; as fast or faster
        at every length measured) and ``lse`` is returned as None.
    softcap : None or float ``c > 0`` (logits ``s -> c * tanh(s / c)``); sinks : None or Tensor [Hq].

    Returns
    -------
    out : Tensor [B, Hq, Dv] in q's dtype (zeros for an empty segment)
    lse : Tensor [B, Hq] float32 natural log (``-inf`` for an empty segment), or None (``return_lse=False``)
    """
    B, Hq, D = q.shape
    S = starts.numel()
    G = Hq // (S // B)
    Dv = v.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    st, ln = host if host is not None else (starts.tolist(), lengths.tolist())
    plain = softcap is None and sinks is None
    fused = not return_lse and bias is None and method == "auto" and q.dtype == k.dtype and plain
    if fused:
        return _sdpa(q.reshape(S, G, D), k, v, st, ln, scale).reshape(B, Hq, Dv), None
    qs = q.reshape(S, G, D).to(acc) * scale
    feats = (None if softcap is None else float(softcap),
             None if sinks is None else sinks.to(device=q.device, dtype=acc).reshape(S // B, G).repeat(B, 1))
    if method == "auto":
        stride = _progression(st, ln)
        if stride is not None:
            out, lse = _uniform(qs, k, v, bias, st[0], stride, ln[0], acc, feats)
        else:
            out, lse = _per_segment(qs, k, v, bias, st, ln, acc, feats)
    elif method == "padded":
        out, lse = _padded(qs, k, v, bias, st, ln, acc, feats)
    elif method == "scatter":
        out, lse = _scatter(qs, k, v, bias, st, ln, acc, chunk, feats)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if feats[1] is not None:  # an empty segment's softmax is the sink alone: lse = the sink logit
        empty = torch.tensor([n == 0 for n in ln], device=q.device)
        lse = torch.where(empty[:, None], feats[1], lse)
    return out.reshape(B, Hq, Dv).to(q.dtype), lse.reshape(B, Hq).float()


def ragged_decode_torch(q, k, v, indptr, bias=None, sm_scale=None, method="auto", chunk=1 << 16, softcap=None,
                        sinks=None):
    """:func:`segment_decode_torch` over packed segments ``indptr`` [B*Hkv + 1] (k [T, D], bias [T])."""
    ptr = indptr.to(device=q.device, dtype=torch.int64)
    return segment_decode_torch(q, k, v, ptr[:-1], ptr[1:] - ptr[:-1], bias, sm_scale, method, chunk,
                                softcap=softcap, sinks=sinks)


def _progression(st, ln):
    """The stride W when all lengths are equal and ``st[s] = st[0] + s*W`` (W >= 0), else None."""
    n = ln[0]
    if any(x != n for x in ln):
        return None
    if len(st) == 1:
        return 0
    w = st[1] - st[0]
    if w < 0 or any(st[i] != st[0] + i * w for i in range(2, len(st))):
        return None
    return w


def _strided(t, start, stride, S, n):
    """Rows ``start + s*stride + i`` (s < S, i < n) of ``t`` [C, ...] as a [S, n, ...] view (no copy)."""
    size = (S, n) + tuple(t.shape[1:])
    strides = (stride * t.stride(0),) + tuple(t.stride())
    return t.as_strided(size, strides, t.storage_offset() + start * t.stride(0))


def _attend(qs, kk, vv, bb, acc, masked, feats=(None, None)):
    """Softmax attention of ``qs`` [S', G, D] (already scaled) over ``kk`` [S', n, D], ``vv`` [S', n, Dv],
    bias ``bb`` [S', n] or None; ``masked``: logits may be -inf (bias, padding); ``feats`` = (softcap or
    None, sinks [S', G] or None). Returns out [S', G, Dv] and lse [S', G]."""
    softcap, sinks = feats
    logits = torch.bmm(qs, kk.to(acc).transpose(1, 2))  # [S', G, n]; .to is a no-op for float32
    if softcap is not None:
        logits = torch.tanh(logits.div_(softcap)).mul_(softcap)
    if bb is not None:
        logits.add_(bb.to(acc).unsqueeze(1))
    m = logits.amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.unsqueeze(-1))
    if masked:
        m = m.masked_fill(torch.isneginf(m), 0)
    logits.sub_(m).exp_()
    denom = logits.sum(-1, keepdim=True)
    if sinks is not None:  # the sink joins the denominator, with no value
        denom = denom + torch.exp(sinks.unsqueeze(-1) - m)
    out = torch.bmm(logits, vv.to(acc))
    if not masked:  # every logit finite: denom >= 1
        return out.div_(denom), (m + torch.log(denom)).squeeze(-1)
    live = denom > 0
    safe = torch.where(live, denom, 1)
    out = torch.where(live, out / safe, 0)
    lse = torch.where(live, m + torch.log(safe), -math.inf).squeeze(-1)
    return out, lse


def _sdpa(qs, k, v, st, ln, scale):
    """Output only, by torch SDPA over strided / per-segment views: qs [S, G, D] → [S, G, Dv]."""
    S, G, _ = qs.shape
    stride = _progression(st, ln)
    if stride is not None:
        if ln[0] == 0:
            return qs.new_zeros(S, G, v.shape[1])
        kk, vv = _strided(k, st[0], stride, S, ln[0]), _strided(v, st[0], stride, S, ln[0])
        return F.scaled_dot_product_attention(qs.unsqueeze(1), kk.unsqueeze(1), vv.unsqueeze(1), scale=scale)[:, 0]
    out = qs.new_zeros(S, G, v.shape[1])
    for s, (s0, n) in enumerate(zip(st, ln)):
        if n:
            out[s] = F.scaled_dot_product_attention(qs[s], k[s0:s0 + n], v[s0:s0 + n], scale=scale)
    return out


def _empty(S, G, Dv, acc, device):
    return torch.zeros(S, G, Dv, dtype=acc, device=device), torch.full((S, G), -math.inf, dtype=acc, device=device)


def _uniform(qs, k, v, bias, start, stride, n, acc, feats=(None, None)):
    S, G, _ = qs.shape
    if n == 0:
        return _empty(S, G, v.shape[1], acc, qs.device)
    kk, vv = _strided(k, start, stride, S, n), _strided(v, start, stride, S, n)
    bb = None if bias is None else _strided(bias, start, stride, S, n)
    return _attend(qs, kk, vv, bb, acc, masked=bias is not None, feats=feats)


def _per_segment(qs, k, v, bias, st, ln, acc, feats=(None, None)):
    S, G, _ = qs.shape
    out, lse = _empty(S, G, v.shape[1], acc, qs.device)
    for s, (s0, n) in enumerate(zip(st, ln)):
        if n == 0:
            continue
        bb = None if bias is None else bias[s0:s0 + n].unsqueeze(0)
        sk = None if feats[1] is None else feats[1][s:s + 1]
        o, l_ = _attend(qs[s:s + 1], k[s0:s0 + n].unsqueeze(0), v[s0:s0 + n].unsqueeze(0), bb, acc,
                        masked=bias is not None, feats=(feats[0], sk))
        out[s], lse[s] = o[0], l_[0]
    return out, lse


def _padded(qs, k, v, bias, st, ln, acc, feats=(None, None)):
    S, G, _ = qs.shape
    lmax = max(ln) if ln else 0
    if lmax == 0:
        return _empty(S, G, v.shape[1], acc, qs.device)
    dev = qs.device
    starts = torch.tensor(st, dtype=torch.int64, device=dev)
    lengths = torch.tensor(ln, dtype=torch.int64, device=dev)
    pos = torch.arange(lmax, device=dev)
    valid = pos[None, :] < lengths[:, None]  # [S, Lmax]
    flat = torch.where(valid, starts[:, None] + pos[None, :], 0).reshape(-1)
    # the padding gathers row 0, which may be spare capacity (uninitialised: NaN): zeroed, so rows
    # outside every segment never reach the softmax
    kk = k.index_select(0, flat).view(S, lmax, -1).masked_fill(~valid[..., None], 0)
    vv = v.index_select(0, flat).view(S, lmax, -1).masked_fill(~valid[..., None], 0)
    pad = torch.zeros(S, lmax, dtype=acc, device=dev).masked_fill_(~valid, -math.inf)
    bb = pad if bias is None else torch.where(valid, bias.to(acc).index_select(0, flat).view(S, lmax), pad)
    return _attend(qs, kk, vv, bb, acc, masked=True, feats=feats)


def _scatter(qs, k, v, bias, st, ln, acc, chunk, feats=(None, None)):
    S, G, D = qs.shape
    Dv = v.shape[1]
    dev = qs.device
    T = sum(ln)
    if T == 0:
        return _empty(S, G, Dv, acc, dev)
    lengths = torch.tensor(ln, dtype=torch.int64, device=dev)
    seg = torch.repeat_interleave(torch.arange(S, device=dev), lengths, output_size=T)  # [T]
    first = torch.cumsum(lengths, 0) - lengths  # packed offset of each segment
    rows = torch.tensor(st, dtype=torch.int64, device=dev)[seg] + torch.arange(T, device=dev) - first[seg]
    logits = torch.empty(T, G, dtype=acc, device=dev)
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        logits[c0:c1] = torch.einsum("tgd,td->tg", qs[seg[c0:c1]], k.index_select(0, rows[c0:c1]).to(acc))
    softcap, sinks = feats
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if bias is not None:
        logits.add_(bias.to(acc).index_select(0, rows).unsqueeze(1))
    m = torch.full((S, G), -math.inf, dtype=acc, device=dev) if sinks is None else sinks.clone()
    m.scatter_reduce_(0, seg.unsqueeze(1).expand(T, G), logits, reduce="amax", include_self=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(logits - m[seg])  # [T, G]
    denom = torch.zeros(S, G, dtype=acc, device=dev) if sinks is None else torch.exp(sinks - m)
    denom = denom.index_add_(0, seg, w)
    num = torch.zeros(S, G, Dv, dtype=acc, device=dev)
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        vc = v.index_select(0, rows[c0:c1]).to(acc)
        num.index_add_(0, seg[c0:c1], torch.bmm(w[c0:c1].unsqueeze(2), vc.unsqueeze(1)))
    live = denom > 0
    safe = torch.where(live, denom, 1)
    out = torch.where(live.unsqueeze(2), num / safe.unsqueeze(2), 0)
    lse = torch.where(live, m + torch.log(safe), -math.inf)
    return out, lse
