"""``RaggedKVCache``: a transformers ``Cache`` holding, per layer, the kept K/V of every (batch, KV head)
segment with its own length, in one buffer per layer with spare capacity per segment.

Layout per layer (``S = B*Hkv`` segments): buffers ``k`` [C, D], ``v`` [C, Dv] and an optional float32
``bias`` [C] (0 for appended entries); segment ``s = b*Hkv + h`` occupies rows ``starts[s] ..
starts[s] + caps[s] - 1``, of which the first ``lengths[s]`` hold its entries in token order and the rest
is spare capacity (never read). Why extents with a shared spare rather than pages: docs/ragged.md.

- ``update`` (append L tokens to every segment) writes the new rows in place: O(new tokens). When a
  segment's spare runs out, the layer is laid out again with ``spare = max(min_spare, ceil(growth *
  mean length))`` rows per segment. Every segment grows by the same L per step, so all of them run out
  together; one relayout copies the entries held once, every ``spare / L`` steps: amortised
  ``1 / growth`` row copies per appended row, and the slack stays about ``growth`` of the held bytes.
- ``evict`` gathers each segment's kept entries into new, compact buffers (the old storage is released)
  with ``floor(growth * mean kept)`` spare rows per segment.
- An unevicted layer, or one evicted to the same budget everywhere, has equal lengths and capacities:
  its segments are one strided ``[S, cap, D]`` view (the decode path needs no per-segment work).

- A **sliding-window layer** (window ``W``: Mistral, Gemma 2/3, Phi-3, Qwen2 with
  ``use_sliding_window``, gpt-oss; given by ``RaggedKVCache(windows=...)``, by a dense sliding layer in
  :meth:`RaggedKVCache.from_dense`, or by the layer's first attention call) also stores each entry's
  position, int32, in a host (CPU) buffer ``pos`` [C] beside ``k``/``v`` (counted in ``physical_bytes``;
  evicted entries keep their original positions). Before an update appends tokens at positions
  ``seen ..``, every entry at a position ``<= seen - W`` is dropped: no query from then on can see it
  (transformers' window: a query at ``p`` sees keys at ``> p - W``). Entries are in position order in
  their segment, so the dropped ones are a prefix: the segment's start advances (no copy) and the rows
  become dead space, released at the next relayout (which copies only the entries held). A decode step
  (one token at ``p``) therefore attends at most ``W`` entries, all inside its window; a multi-token
  update's queries are masked by position (:mod:`forcedweight.deploy.attention`).

``get_seq_length`` counts tokens processed, not entries held, so positions (RoPE) stay right after
eviction. ``update`` returns a :class:`RaggedKV` view (as both "keys" and "values") that the attention
function of :mod:`forcedweight.deploy.attention` consumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from transformers.cache_utils import Cache

from forcedweight.compat import CacheLayerBase
from forcedweight.errors import InputError

GROWTH = 1 / 64  # spare capacity per segment, as a fraction of the mean segment length
MIN_SPARE = 8  # spare rows per segment at least, when a segment runs out (relayouts at most every 8 steps)


@dataclass
class RaggedKV:
    """What one layer's ``update`` hands to the attention function.

    Attributes
    ----------
    k, v : Tensor [C, D], [C, Dv], the layer's buffers after the append (spare rows included).
    starts, lengths : Tensor [B*Hkv] int64 on the cache's device (lengths after the append).
    host_starts, host_lengths : the same as Python lists (no device read needed to launch or slice).
    bias : Tensor [C] float32 or None.
    new_len : int, tokens appended by this update (the query length L).
    batch, kv_heads : int.
    max_len : int, the longest segment.
    new_k, new_v : Tensor [B, Hkv, L, D] / [B, Hkv, L, Dv], the appended states (a prefill over an empty
        past attends them directly).
    seen : int, tokens processed by the layer including this update (what a sliding window compares to).
    pos : Tensor [C] int32 on the CPU (each row's position), or None (a layer without a window).
    window : int or None, the layer's sliding window.
    layer : the :class:`RaggedLayer` (the attention function tells it its window on the first call).
    """

    k: torch.Tensor
    v: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    host_starts: list
    host_lengths: list
    bias: torch.Tensor | None
    new_len: int
    batch: int
    kv_heads: int
    max_len: int
    new_k: torch.Tensor
    new_v: torch.Tensor
    seen: int = 0  # tokens the layer has processed, this update's included (positions 0 .. seen - 1)
    pos: torch.Tensor | None = None
    window: int | None = None
    layer: object = None

    @property
    def shape(self) -> tuple:
        """(B, Hkv, longest segment, D): the dense [B, Hkv, N, D] shape the view stands for (kvpress's
        attention patch, which wraps every registered attention function, reads ``key.shape``)."""
        return (self.batch, self.kv_heads, self.max_len, self.k.shape[1])


def physical_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors`` (None skipped), each distinct storage counted once."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        key = (st.data_ptr(), st.device.type, st.device.index)
        if key in seen:
            continue
        seen.add(key)
        total += st.nbytes()
    return total


def _uniform_stride(starts, lengths, caps):
    """``(offset, W)`` when all segments have equal length and capacity ``c <= W`` and
    ``starts[s] = offset + s*W`` (a trimmed window advances every start alike), else None."""
    c, n = caps[0], lengths[0]
    if any(x != c for x in caps) or any(x != n for x in lengths):
        return None
    w = starts[1] - starts[0] if len(starts) > 1 else c
    if w < c or any(s != starts[0] + i * w for i, s in enumerate(starts)):
        return None
    return starts[0], w


def _rows(t, offset: int, stride: int, S: int, n: int):
    """Rows ``offset + s*stride + i`` (s < S, i < n) of ``t`` [C] or [C, D] as an [S, n(, D)] view."""
    size = (S, n) + tuple(t.shape[1:])
    strides = (stride * t.stride(0),) + tuple(t.stride())
    return t.as_strided(size, strides, t.storage_offset() + offset * t.stride(0))


class RaggedLayer(CacheLayerBase):  # CacheLayerMixin with the 4.57..newest glue (forcedweight.compat)
    """One layer of :class:`RaggedKVCache` (see the module docstring for the layout).

    Parameters
    ----------
    growth : spare rows per segment as a fraction of the mean segment length (slack ≈ growth).
    min_spare : spare rows per segment at least when a relayout is forced by an append.
    window : the layer's sliding window ``W`` (None: full attention); see the module docstring.
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, growth: float = GROWTH, min_spare: int = MIN_SPARE, window: int | None = None, **kwargs):
        super().__init__()
        if not growth >= 0 or min_spare < 1:
            raise InputError(f"RaggedKVCache: growth must be >= 0 and min_spare >= 1, got {growth}, {min_spare}")
        _check_window(window)
        self.growth, self.min_spare = float(growth), int(min_spare)
        self.window = None if window is None else int(window)
        self.relayouts = 0
        self._clear()

    def _clear(self):
        self.k = self.v = self.bias = None
        self.pos = None  # int32 [C] on the CPU: each row's position (sliding-window layers only)
        self.evicted = False
        self.starts_t = self.lengths_t = None  # device copies (what the Triton kernel reads)
        self.starts, self.lengths_h, self.caps = [], [], []
        self.stride = None  # common row stride of a uniform layout, else None
        self.offset = 0  # first row of a uniform layout
        self.k4 = self.v4 = None  # uniform layout: the buffers as [B, Hkv, cap, D] views
        self.room = self.max_len = 0  # min over segments of capacity - length; the longest segment
        self.batch = self.kv_heads = 0
        self.seen = 0

    # --- transformers CacheLayerMixin API -------------------------------------------------------
    def lazy_initialization(self, key_states, value_states) -> None:
        B, Hkv, _, D = key_states.shape
        S = B * Hkv
        self.device = key_states.device
        self.batch, self.kv_heads = B, Hkv
        self.k = key_states.new_empty(0, D)
        self.v = value_states.new_empty(0, value_states.shape[-1])
        if self.window is not None:
            self.pos = torch.empty(0, dtype=torch.int32)
        self.starts, self.lengths_h, self.caps = [0] * S, [0] * S, [0] * S
        self._sync_metadata()
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Append ``key_states`` [B, Hkv, L, D] / ``value_states`` [B, Hkv, L, Dv] to every segment.

        Returns ``(view, view)`` with ``view`` a :class:`RaggedKV` of the layer after the append.
        """
        if key_states.dim() != 4 or value_states.dim() != 4 or key_states.shape[:3] != value_states.shape[:3]:
            raise InputError(f"RaggedKVCache: update needs key and value states [B, Hkv, L, D] / [B, Hkv, L, Dv] "
                             f"alike, got {tuple(key_states.shape)} and {tuple(value_states.shape)}")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        B, Hkv, L, D = key_states.shape
        if (B, Hkv) != (self.batch, self.kv_heads):
            raise InputError(
                f"RaggedKVCache: update with batch/heads {(B, Hkv)}, cache holds {(self.batch, self.kv_heads)}"
            )
        if (D, value_states.shape[-1]) != (self.k.shape[1], self.v.shape[1]):
            raise InputError(f"RaggedKVCache: update with head dims {(D, value_states.shape[-1])}, cache holds "
                             f"{(self.k.shape[1], self.v.shape[1])}")
        if self.pos is not None:
            self.trim(self.seen)  # the first new query (at position seen) sees positions > seen - W only
        if L > self.room:
            S = B * Hkv
            spare = max(self.min_spare, math.ceil(self.growth * (sum(self.lengths_h) / S + L)))
            self._relayout([n + L + spare for n in self.lengths_h])
        if self.k4 is not None:  # uniform: one strided write into the [B, Hkv, cap, D] view
            n = self.lengths_h[0]
            self.k4.narrow(2, n, L).copy_(key_states)
            self.v4.narrow(2, n, L).copy_(value_states)
        else:
            S, Dv = B * Hkv, value_states.shape[-1]
            rows = ((self.starts_t + self.lengths_t)[:, None] + torch.arange(L, device=self.device)).reshape(-1)
            self.k.index_copy_(0, rows, key_states.reshape(S * L, D).to(self.k.dtype))
            self.v.index_copy_(0, rows, value_states.reshape(S * L, Dv).to(self.v.dtype))
        # spare rows of the bias buffer are zero since allocation: appended entries have bias 0
        if self.pos is not None:
            rows = (torch.tensor(self.starts) + torch.tensor(self.lengths_h))[:, None] + torch.arange(L)
            new_pos = torch.arange(self.seen, self.seen + L, dtype=torch.int32).expand(rows.shape[0], L)
            self.pos.index_copy_(0, rows.reshape(-1), new_pos.reshape(-1))
        self.lengths_h = [n + L for n in self.lengths_h]
        self.lengths_t.add_(L)
        self.room -= L
        self.max_len += L
        self.seen += L
        view = self.view(key_states, value_states)
        return view, view

    def view(self, key_states, value_states) -> RaggedKV:
        """The :class:`RaggedKV` of the layer as it is now, after an update appending ``key_states``."""
        return RaggedKV(self.k, self.v, self.starts_t, self.lengths_t, self.starts, self.lengths_h, self.bias,
                        key_states.shape[2], self.batch, self.kv_heads, self.max_len, key_states, value_states,
                        self.seen, self.pos, self.window, self)

    # --- sliding window ---------------------------------------------------------------------------
    def set_window(self, window: int) -> bool:
        """Declare the layer's sliding window (from its attention call); True if it was not known before.

        A layer that was never evicted holds, per segment, the last ``n`` positions it processed, so its
        positions are materialised now. One evicted before its window was known cannot be: refused.
        """
        _check_window(window)
        if self.window == window and (self.pos is not None or not self.is_initialized):
            return False
        if self.window is not None and self.window != window:
            raise InputError(f"RaggedKVCache: layer was given sliding window {self.window}, its attention uses {window}")
        if self.evicted:
            raise InputError(
                f"RaggedKVCache: a layer with a sliding window of {window} tokens was evicted before its window "
                "was known (entry positions lost): build the cache with RaggedKVCache(windows=...) "
                "(Prefill.ragged_cache does)"
            )
        self.window = int(window)
        if self.is_initialized:
            self.pos = torch.zeros(self.k.shape[0], dtype=torch.int32)
            self._implicit_positions()
        return True

    def _implicit_positions(self) -> None:
        """Positions of a never-evicted layer: segment s holds positions ``seen - n_s .. seen - 1``."""
        for s0, n in zip(self.starts, self.lengths_h):
            self.pos[s0:s0 + n] = torch.arange(self.seen - n, self.seen, dtype=torch.int32)

    def trim(self, first_query: int) -> int:
        """Drop the entries no query at position >= ``first_query`` can see (positions <= first_query - W):
        a prefix of each segment, so starts advance and nothing is copied. Returns the entries dropped."""
        if self.pos is None or not self.is_initialized:
            return 0
        thr = int(first_query) - self.window
        drops = []
        for s0, n in zip(self.starts, self.lengths_h):
            if n == 0 or int(self.pos[s0]) > thr:
                drops.append(0)
            else:
                drops.append(int(torch.searchsorted(self.pos[s0:s0 + n], thr, right=True)))
        if not any(drops):
            return 0
        self.starts = [s0 + d for s0, d in zip(self.starts, drops)]
        self.lengths_h = [n - d for n, d in zip(self.lengths_h, drops)]
        self.caps = [c - d for c, d in zip(self.caps, drops)]
        self._sync_metadata()
        return sum(drops)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._clear()
        self.is_initialized = False

    def offload(self):
        raise NotImplementedError("RaggedKVCache does not offload")

    def prefetch(self):
        raise NotImplementedError("RaggedKVCache does not offload")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("RaggedKVCache does not support beam search")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("RaggedKVCache cannot be cropped")

    # --- storage ----------------------------------------------------------------------------------
    def _sync_metadata(self):
        """Refresh everything derived from the host lists after a layout change."""
        self.starts_t = torch.tensor(self.starts, dtype=torch.int64, device=self.device)
        self.lengths_t = torch.tensor(self.lengths_h, dtype=torch.int64, device=self.device)
        uniform = _uniform_stride(self.starts, self.lengths_h, self.caps)
        self.offset, self.stride = uniform if uniform is not None else (0, None)
        self.room = min(c - n for c, n in zip(self.caps, self.lengths_h))
        self.max_len = max(self.lengths_h)
        if self.stride is not None:  # [B, Hkv, cap, D] views of the buffers (row stride W, first row offset)
            B, Hkv, S, cap = self.batch, self.kv_heads, self.batch * self.kv_heads, self.caps[0]
            self.k4 = _rows(self.k, self.offset, self.stride, S, cap).view(B, Hkv, cap, self.k.shape[1])
            self.v4 = _rows(self.v, self.offset, self.stride, S, cap).view(B, Hkv, cap, self.v.shape[1])
        else:
            self.k4 = self.v4 = None

    def _allocate(self, caps):
        """New buffers for capacities ``caps`` (bias zero-filled; positions, when the layer has a window,
        on the CPU); returns (k, v, bias, starts) and sets ``self._new_pos``."""
        starts, c = [], 0
        for cap in caps:
            starts.append(c)
            c += cap
        k = self.k.new_empty(c, self.k.shape[1])
        v = self.v.new_empty(c, self.v.shape[1])
        bias = None if self.bias is None else torch.zeros(c, dtype=torch.float32, device=self.device)
        self._new_pos = None if self.pos is None else torch.zeros(c, dtype=torch.int32)
        return k, v, bias, starts

    def _relayout(self, caps) -> None:
        """Move every segment's entries into new buffers with capacities ``caps`` (O(entries held))."""
        k, v, bias, starts = self._allocate(caps)
        pos = self._new_pos
        S, lengths = len(caps), self.lengths_h
        w_new = caps[0] if all(c == caps[0] for c in caps) else None
        pairs = [(k, self.k), (v, self.v)] + ([(bias, self.bias)] if bias is not None else []) \
            + ([(pos, self.pos)] if pos is not None else [])
        if self.stride is not None and w_new is not None:  # uniform to uniform: one strided copy each
            n = lengths[0]
            for new, old in (pairs if n > 0 else []):
                _rows(new, 0, w_new, S, n).copy_(_rows(old, self.offset, self.stride, S, n))
        else:
            for s0_new, s0, n in zip(starts, self.starts, lengths):
                for new, old in pairs:
                    new[s0_new:s0_new + n] = old[s0:s0 + n]
        self.k, self.v, self.bias, self.pos, self.starts, self.caps = k, v, bias, pos, starts, list(caps)
        self._sync_metadata()
        self.relayouts += 1

    # --- ragged API ------------------------------------------------------------------------------
    @property
    def lengths(self) -> torch.Tensor:
        """Entries held per segment, [B*Hkv] int64 (a CPU tensor)."""
        return torch.tensor(self.lengths_h, dtype=torch.int64)

    def segment(self, b: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [n, D] and values [n, Dv] held for batch ``b``, KV head ``h`` (views)."""
        s = b * self.kv_heads + h
        s0, n = self.starts[s], self.lengths_h[s]
        return self.k[s0:s0 + n], self.v[s0:s0 + n]

    def segment_positions(self, b: int, h: int) -> torch.Tensor | None:
        """The int32 positions [n] of batch ``b``, KV head ``h``'s entries (a view), or None (no window)."""
        if self.pos is None:
            return None
        s = b * self.kv_heads + h
        s0, n = self.starts[s], self.lengths_h[s]
        return self.pos[s0:s0 + n]

    def segment_bias(self, b: int, h: int) -> torch.Tensor | None:
        """The float32 bias [n] of batch ``b``, KV head ``h`` (a view), or None when the layer has none."""
        if self.bias is None:
            return None
        s = b * self.kv_heads + h
        s0, n = self.starts[s], self.lengths_h[s]
        return self.bias[s0:s0 + n]

    def evict(self, keep, bias=None) -> None:
        """Compact every segment to its kept entries, into new buffers (the old storage is freed).

        Parameters
        ----------
        keep : list of B*Hkv index tensors (positions within each segment, segment ``b*Hkv + h``), or a
            tensor [B, Hkv, s] of per-segment indices. Indices must be distinct; they are sorted.
        bias : optional float32 bias per kept entry, in the same layout as ``keep`` (list of tensors or
            [B, Hkv, s]); replaces the layer's bias. Without it an existing bias follows its entries.
        """
        S = self.batch * self.kv_heads
        keep_list = _as_list(keep, self.batch, self.kv_heads, "keep")
        bias_list = None if bias is None else _as_list(bias, self.batch, self.kv_heads, "bias")
        src, kept_bias, counts = [], [], []
        for s in range(S):
            idx = torch.as_tensor(keep_list[s])
            if idx.numel() and (idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool):
                raise InputError(f"evict: segment {s}: keep must hold integer indices, got {idx.dtype}")
            idx = idx.to(device=self.device, dtype=torch.int64).reshape(-1)
            idx, order = torch.sort(idx)
            n = self.lengths_h[s]
            if idx.numel() and (int(idx[0]) < 0 or int(idx[-1]) >= n):
                raise InputError(f"evict: segment {s} holds {n} entries, keep has index out of range")
            if idx.numel() > 1 and bool((idx[1:] == idx[:-1]).any()):
                raise InputError(f"evict: segment {s}: repeated index in keep")
            src.append(idx + self.starts[s])
            counts.append(idx.numel())
            if bias_list is not None:
                b = torch.as_tensor(bias_list[s]).to(device=self.device, dtype=torch.float32).reshape(-1)
                if b.numel() != idx.numel():
                    raise InputError(f"evict: segment {s}: bias has {b.numel()} entries, keep has {idx.numel()}")
                if bool(torch.isnan(b).any() or torch.isposinf(b).any()):
                    raise InputError(f"evict: segment {s}: bias holds NaN or +inf")
                kept_bias.append(b[order])
        spare = math.floor(self.growth * sum(counts) / max(S, 1))
        if bias_list is not None and self.bias is None:
            self.bias = torch.zeros(0, dtype=torch.float32, device=self.device)  # so _allocate makes one
        k, v, new_bias, starts = self._allocate([n + spare for n in counts])
        new_pos = self._new_pos
        dst = torch.cat([torch.arange(s0, s0 + n, device=self.device) for s0, n in zip(starts, counts)])
        flat = torch.cat(src)
        k.index_copy_(0, dst, self.k.index_select(0, flat))
        v.index_copy_(0, dst, self.v.index_select(0, flat))
        if new_pos is not None:  # evicted entries keep their original positions
            new_pos.index_copy_(0, dst.cpu(), self.pos.index_select(0, flat.cpu()))
        if bias_list is not None:
            new_bias.index_copy_(0, dst, torch.cat(kept_bias))
        elif new_bias is not None:
            new_bias.index_copy_(0, dst, self.bias.index_select(0, flat))
        # dropping the references to the old buffers frees them
        self.k, self.v, self.bias, self.pos, self.starts = k, v, new_bias, new_pos, starts
        self.evicted = True
        self.lengths_h, self.caps = counts, [n + spare for n in counts]
        self._sync_metadata()

    def entries(self) -> int:
        return sum(self.lengths_h)

    def entry_bytes(self) -> int:
        """Bytes of one entry's K and V (the nominal size of an entry)."""
        if self.k is None:
            return 0
        return self.k.shape[1] * self.k.element_size() + self.v.shape[1] * self.v.element_size()

    def tensors(self) -> list:
        """Every tensor the layer holds (buffers, positions of a windowed layer, device metadata)."""
        return [self.k, self.v, self.bias, self.pos, self.starts_t, self.lengths_t]

    def physical_bytes(self) -> int:
        return physical_bytes(self.tensors())

    def nominal_bytes(self) -> int:
        return self.entries() * self.entry_bytes()

    def slack_bytes(self) -> int:
        """Bytes of the allocated rows no entry occupies (spare capacity and the dead rows a window trim
        left: K, V, bias and position rows)."""
        if self.k is None:
            return 0
        row = self.entry_bytes() + (4 if self.bias is not None else 0) + (4 if self.pos is not None else 0)
        return (self.k.shape[0] - self.entries()) * row


def _check_window(window) -> None:
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise InputError(f"RaggedKVCache: a sliding window must be a positive integer or None, got {window!r}")


def _as_list(x, batch: int, kv_heads: int, name: str) -> list:
    S = batch * kv_heads
    if isinstance(x, torch.Tensor):
        if x.dim() != 3 or tuple(x.shape[:2]) != (batch, kv_heads):
            raise InputError(
                f"evict: {name} tensor must be [B, Hkv, s] = [{batch}, {kv_heads}, s], got {tuple(x.shape)}"
            )
        return list(x.reshape(S, -1))
    x = list(x)
    if len(x) != S:
        raise InputError(f"evict: {name} must hold B*Hkv = {S} index sets, got {len(x)}")
    return x


class RaggedKVCache(Cache):
    """A ragged per-head KV cache (see the module docstring). Layers are created lazily, one per
    attention layer the model updates.

    Use with a model whose attention implementation is ``"forcedweight_ragged"``
    (:func:`forcedweight.deploy.attention.use_ragged_attention`), e.g.
    ``model.generate(ids, cache=RaggedKVCache(), ...)``.

    Parameters
    ----------
    growth : spare capacity per segment as a fraction of the mean segment length (default 1/64).
    min_spare : spare rows per segment at least when an append forces a relayout (default 8).
    windows : optional sliding window per layer (a list, None entries for full layers, or a dict
        layer -> window). A layer without one learns its window from its first attention call, which
        works unless it was evicted before that call (then refused: its entries' positions are lost).
    """

    def __init__(self, growth: float = GROWTH, min_spare: int = MIN_SPARE, windows=None):
        RaggedLayer(growth, min_spare)  # validates the options now, not at the first update
        if windows is None:
            windows = {}
        elif not isinstance(windows, dict):
            windows = dict(enumerate(windows))
        for w in windows.values():
            _check_window(w)
        self.windows = {int(i): w for i, w in windows.items() if w is not None}
        make = partial(RaggedLayer, growth=growth, min_spare=min_spare)
        # transformers appends layers in order, so the next layer's index is len(self.layers)
        super().__init__(layer_class_to_replicate=lambda: make(window=self.windows.get(len(self.layers))))

    @classmethod
    def from_dense(cls, dense_cache, **options) -> "RaggedKVCache":
        """A copy of a transformers ``DynamicCache`` (every layer's [B, Hkv, n, D] keys/values).

        A dense sliding-window layer (transformers' ``DynamicSlidingWindowLayer`` holds only the last
        ``W - 1`` of the tokens it processed) gives its window and its token count: the copy's entries
        sit at the positions they hold there.
        """
        given = options.pop("windows", None)
        windows = {} if given is None else dict(given) if isinstance(given, dict) else dict(enumerate(given))
        for i, layer in enumerate(dense_cache.layers):
            w = getattr(layer, "sliding_window", None)
            if windows.get(i) is None and isinstance(w, int) and not isinstance(w, bool):
                windows[i] = w
        cache = cls(windows=windows, **options)
        for i, layer in enumerate(dense_cache.layers):
            held = int(layer.keys.shape[2])
            seen = int(layer.get_seq_length())
            while len(cache.layers) <= i:
                cache.layers.append(cache.layer_class_to_replicate())
            cache.layers[i].seen = max(seen - held, 0)  # the held keys are the last `held` positions
            cache.update(layer.keys, layer.values, i)
        return cache

    def evict(self, layer: int, keep, bias=None) -> None:
        """Compact layer ``layer``'s segments to ``keep`` (see :meth:`RaggedLayer.evict`)."""
        if not 0 <= layer < len(self.layers) or not self.layers[layer].is_initialized:
            raise InputError(f"evict: layer {layer} is not in the cache ({len(self.layers)} layers)")
        self.layers[layer].evict(keep, bias)

    def lengths(self, layer: int) -> torch.Tensor:
        """Entries held per (batch, KV head) segment of ``layer``, [B*Hkv] int64."""
        return self.layers[layer].lengths

    def physical_bytes(self) -> int:
        """Bytes of all storages held (K/V buffers with their spare rows, bias, segment metadata),
        each distinct storage counted once."""
        return physical_bytes([t for layer in self.layers for t in layer.tensors()])

    def nominal_bytes(self) -> int:
        """Bytes the kept entries need: entries × (D + Dv) × element size, summed over layers."""
        return sum(layer.nominal_bytes() for layer in self.layers)

    def slack_bytes(self) -> int:
        """Bytes of allocated but unoccupied rows (spare capacity), summed over layers."""
        return sum(layer.slack_bytes() for layer in self.layers)

    def entries(self) -> int:
        """Kept entries over all layers and segments."""
        return sum(layer.entries() for layer in self.layers)

    def relayouts(self) -> int:
        """Relayouts forced by appends so far (each copies a layer's entries once), summed over layers."""
        return sum(layer.relayouts for layer in self.layers)
