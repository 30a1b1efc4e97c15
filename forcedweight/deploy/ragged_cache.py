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
    """The common capacity W when all segments have equal length and capacity and ``starts[s] = s*W``."""
    w, n = caps[0], lengths[0]
    if all(c == w for c in caps) and all(x == n for x in lengths) and all(s == i * w for i, s in enumerate(starts)):
        return w
    return None


class RaggedLayer(CacheLayerBase):  # CacheLayerMixin with the 4.57..newest glue (forcedweight.compat)
    """One layer of :class:`RaggedKVCache` (see the module docstring for the layout).

    Parameters
    ----------
    growth : spare rows per segment as a fraction of the mean segment length (slack ≈ growth).
    min_spare : spare rows per segment at least when a relayout is forced by an append.
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, growth: float = GROWTH, min_spare: int = MIN_SPARE, **kwargs):
        super().__init__()
        if not growth >= 0 or min_spare < 1:
            raise InputError(f"RaggedKVCache: growth must be >= 0 and min_spare >= 1, got {growth}, {min_spare}")
        self.growth, self.min_spare = float(growth), int(min_spare)
        self.relayouts = 0
        self._clear()

    def _clear(self):
        self.k = self.v = self.bias = None
        self.starts_t = self.lengths_t = None  # device copies (what the Triton kernel reads)
        self.starts, self.lengths_h, self.caps = [], [], []
        self.stride = None  # common capacity of a uniform layout, else None
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
        self.starts, self.lengths_h, self.caps = [0] * S, [0] * S, [0] * S
        self._sync_metadata()
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Append ``key_states`` [B, Hkv, L, D] / ``value_states`` [B, Hkv, L, Dv] to every segment.

        Returns ``(view, view)`` with ``view`` a :class:`RaggedKV` of the layer after the append.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        B, Hkv, L, D = key_states.shape
        if (B, Hkv) != (self.batch, self.kv_heads):
            raise ValueError(
                f"RaggedKVCache: update with batch/heads {(B, Hkv)}, cache holds {(self.batch, self.kv_heads)}"
            )
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
        self.lengths_h = [n + L for n in self.lengths_h]
        self.lengths_t.add_(L)
        self.room -= L
        self.max_len += L
        self.seen += L
        view = RaggedKV(self.k, self.v, self.starts_t, self.lengths_t, self.starts, self.lengths_h, self.bias, L,
                        B, Hkv, self.max_len, key_states, value_states, self.seen)
        return view, view

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
        self.stride = _uniform_stride(self.starts, self.lengths_h, self.caps)
        self.room = min(c - n for c, n in zip(self.caps, self.lengths_h))
        self.max_len = max(self.lengths_h)
        if self.stride is not None:
            B, Hkv, w = self.batch, self.kv_heads, self.stride
            self.k4 = self.k[:B * Hkv * w].view(B, Hkv, w, self.k.shape[1])
            self.v4 = self.v[:B * Hkv * w].view(B, Hkv, w, self.v.shape[1])
        else:
            self.k4 = self.v4 = None

    def _allocate(self, caps):
        """New buffers for capacities ``caps`` (bias zero-filled); returns (k, v, bias, starts)."""
        starts, c = [], 0
        for cap in caps:
            starts.append(c)
            c += cap
        k = self.k.new_empty(c, self.k.shape[1])
        v = self.v.new_empty(c, self.v.shape[1])
        bias = None if self.bias is None else torch.zeros(c, dtype=torch.float32, device=self.device)
        return k, v, bias, starts

    def _relayout(self, caps) -> None:
        """Move every segment's entries into new buffers with capacities ``caps`` (O(entries held))."""
        k, v, bias, starts = self._allocate(caps)
        S, lengths = len(caps), self.lengths_h
        w_new = caps[0] if all(c == caps[0] for c in caps) else None
        if self.stride is not None and w_new is not None:  # uniform to uniform: one strided copy each
            n, w = lengths[0], self.stride
            pairs = [(k, self.k), (v, self.v)] + ([(bias, self.bias)] if bias is not None else [])
            pairs = pairs if n > 0 else []
            for new, old in pairs:
                shape = (S, -1) if new.dim() == 1 else (S, -1, new.shape[1])
                new[:S * w_new].view(*shape)[:, :n].copy_(old[:S * w].view(*shape)[:, :n])
        else:
            for s0_new, s0, n in zip(starts, self.starts, lengths):
                k[s0_new:s0_new + n] = self.k[s0:s0 + n]
                v[s0_new:s0_new + n] = self.v[s0:s0 + n]
                if bias is not None:
                    bias[s0_new:s0_new + n] = self.bias[s0:s0 + n]
        self.k, self.v, self.bias, self.starts, self.caps = k, v, bias, starts, list(caps)
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
            idx = torch.as_tensor(keep_list[s]).to(device=self.device, dtype=torch.int64).reshape(-1)
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
                kept_bias.append(b[order])
        spare = math.floor(self.growth * sum(counts) / max(S, 1))
        if bias_list is not None and self.bias is None:
            self.bias = torch.zeros(0, dtype=torch.float32, device=self.device)  # so _allocate makes one
        k, v, new_bias, starts = self._allocate([n + spare for n in counts])
        dst = torch.cat([torch.arange(s0, s0 + n, device=self.device) for s0, n in zip(starts, counts)])
        flat = torch.cat(src)
        k.index_copy_(0, dst, self.k.index_select(0, flat))
        v.index_copy_(0, dst, self.v.index_select(0, flat))
        if bias_list is not None:
            new_bias.index_copy_(0, dst, torch.cat(kept_bias))
        elif new_bias is not None:
            new_bias.index_copy_(0, dst, self.bias.index_select(0, flat))
        # dropping the references to the old buffers frees them
        self.k, self.v, self.bias, self.starts = k, v, new_bias, starts
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
        """Every tensor the layer holds (buffers and device metadata)."""
        return [self.k, self.v, self.bias, self.starts_t, self.lengths_t]

    def physical_bytes(self) -> int:
        return physical_bytes(self.tensors())

    def nominal_bytes(self) -> int:
        return self.entries() * self.entry_bytes()

    def slack_bytes(self) -> int:
        """Bytes of the allocated rows no entry occupies (spare capacity: K, V and bias rows)."""
        if self.k is None:
            return 0
        row = self.entry_bytes() + (4 if self.bias is not None else 0)
        return (self.k.shape[0] - self.entries()) * row


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
    """

    def __init__(self, growth: float = GROWTH, min_spare: int = MIN_SPARE):
        RaggedLayer(growth, min_spare)  # validates the options now, not at the first update
        super().__init__(layer_class_to_replicate=partial(RaggedLayer, growth=growth, min_spare=min_spare))

    @classmethod
    def from_dense(cls, dense_cache, **options) -> "RaggedKVCache":
        """A copy of a transformers ``DynamicCache`` (every layer's [B, Hkv, N, D] keys/values)."""
        cache = cls(**options)
        for i, layer in enumerate(dense_cache.layers):
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
