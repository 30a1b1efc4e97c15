"""``RaggedKVCache``: a transformers ``Cache`` holding, per layer, the kept K/V of every (batch, KV head)
segment packed back to back, each with its own length.

Per layer: keys ``k`` [T, D], values ``v`` [T, Dv], ``indptr`` [B*Hkv + 1] int64 (segment ``b*Hkv + h``
is ``k[indptr[s]:indptr[s+1]]``, entries in token order) and an optional float32 ``bias`` [T] per entry
(0 for appended entries). ``update`` appends the new tokens to every segment by rebuilding the packed
tensors (exact storage, no spare capacity); ``evict`` compacts segments to kept index sets into new
tensors so the old storage is released. ``get_seq_length`` counts tokens processed, not entries held,
so positions (RoPE) stay right after eviction.

``update`` returns a :class:`RaggedKV` view (as both "keys" and "values"): the attention function
registered in :mod:`forcedweight.deploy.attention` consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from forcedweight.errors import InputError


@dataclass
class RaggedKV:
    """What one layer's ``update`` hands to the attention function.

    Attributes
    ----------
    k, v : Tensor [T, D], [T, Dv] packed segments after the append (new tokens included).
    indptr : Tensor [B*Hkv + 1] int64.
    bias : Tensor [T] float32 or None.
    new_len : int, tokens appended by this update (the query length L).
    batch, kv_heads : int.
    max_len : int, the longest segment (known on the host: launching the kernel needs no device sync).
    """

    k: torch.Tensor
    v: torch.Tensor
    indptr: torch.Tensor
    bias: torch.Tensor | None
    new_len: int
    batch: int
    kv_heads: int
    max_len: int


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


class RaggedLayer(CacheLayerMixin):
    """One layer of :class:`RaggedKVCache` (see the module docstring for the layout)."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, **kwargs):
        super().__init__()
        self.k = self.v = self.indptr = self.bias = self.host_lengths = None
        self.batch = self.kv_heads = 0
        self.seen = 0

    # --- transformers CacheLayerMixin API -------------------------------------------------------
    def lazy_initialization(self, key_states, value_states) -> None:
        B, Hkv, _, D = key_states.shape
        self.device = key_states.device
        self.batch, self.kv_heads = B, Hkv
        self.k = key_states.new_empty(0, D)
        self.v = value_states.new_empty(0, value_states.shape[-1])
        self.indptr = torch.zeros(B * Hkv + 1, dtype=torch.int64, device=self.device)
        self.host_lengths = torch.zeros(B * Hkv, dtype=torch.int64)  # a CPU copy of the segment lengths
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
        S = B * Hkv
        lengths = self.indptr[1:] - self.indptr[:-1]
        host_new = self.host_lengths + L
        T_new = int(host_new.sum())  # host arithmetic: no device sync on CUDA
        new_indptr = torch.zeros_like(self.indptr)
        new_indptr[1:] = torch.cumsum(lengths + L, 0)
        seg = torch.repeat_interleave(torch.arange(S, device=self.device), lengths, output_size=self.k.shape[0])
        old_dest = torch.arange(self.k.shape[0], device=self.device) + seg * L
        new_dest = (new_indptr[1:, None] - L + torch.arange(L, device=self.device)).reshape(-1)
        k = self.k.new_empty(T_new, D)
        v = self.v.new_empty(T_new, value_states.shape[-1])
        k[old_dest] = self.k
        v[old_dest] = self.v
        k[new_dest] = key_states.reshape(S * L, D).to(k.dtype)
        v[new_dest] = value_states.reshape(S * L, -1).to(v.dtype)
        if self.bias is not None:
            bias = torch.zeros(T_new, dtype=torch.float32, device=self.device)
            bias[old_dest] = self.bias
            self.bias = bias
        self.k, self.v, self.indptr, self.host_lengths = k, v, new_indptr, host_new
        self.seen += L
        view = RaggedKV(self.k, self.v, self.indptr, self.bias, L, B, Hkv, int(host_new.max()))
        return view, view

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.k = self.v = self.indptr = self.bias = self.host_lengths = None
        self.seen = 0
        self.is_initialized = False

    def offload(self):
        raise NotImplementedError("RaggedKVCache does not offload")

    def prefetch(self):
        raise NotImplementedError("RaggedKVCache does not offload")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("RaggedKVCache does not support beam search")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("RaggedKVCache cannot be cropped")

    # --- ragged API ------------------------------------------------------------------------------
    @property
    def lengths(self) -> torch.Tensor:
        """Entries held per segment, [B*Hkv] int64 (a CPU tensor)."""
        return self.host_lengths.clone()

    def segment(self, b: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [n, D] and values [n, Dv] held for batch ``b``, KV head ``h``."""
        s = b * self.kv_heads + h
        s0, s1 = int(self.indptr[s]), int(self.indptr[s + 1])
        return self.k[s0:s1], self.v[s0:s1]

    def evict(self, keep, bias=None) -> None:
        """Compact every segment to its kept entries, into new tensors (the old storage is freed).

        Parameters
        ----------
        keep : list of B*Hkv index tensors (positions within each segment, segment ``b*Hkv + h``), or a
            tensor [B, Hkv, s] of per-segment indices. Indices are sorted and must be distinct.
        bias : optional float32 bias per kept entry, in the same layout as ``keep`` (list of tensors or
            [B, Hkv, s]); replaces the layer's bias. Without it an existing bias follows its entries.
        """
        S = self.batch * self.kv_heads
        keep_list = _as_list(keep, self.batch, self.kv_heads, "keep")
        bias_list = None if bias is None else _as_list(bias, self.batch, self.kv_heads, "bias")
        lengths = self.lengths.tolist()
        gathered, kept_bias = [], []
        for s in range(S):
            idx = torch.as_tensor(keep_list[s], device=self.device).to(torch.int64).reshape(-1)
            order = torch.argsort(idx)
            idx = idx[order]
            if idx.numel() and (int(idx[0]) < 0 or int(idx[-1]) >= lengths[s]):
                raise InputError(f"evict: segment {s} holds {lengths[s]} entries, keep has index out of range")
            if idx.numel() > 1 and bool((idx[1:] == idx[:-1]).any()):
                raise InputError(f"evict: segment {s}: repeated index in keep")
            gathered.append(idx + self.indptr[s])
            if bias_list is not None:
                b = torch.as_tensor(bias_list[s], device=self.device).float().reshape(-1)
                if b.numel() != idx.numel():
                    raise InputError(f"evict: segment {s}: bias has {b.numel()} entries, keep has {idx.numel()}")
                kept_bias.append(b[order])
        flat = torch.cat(gathered) if gathered else torch.zeros(0, dtype=torch.int64, device=self.device)
        self.host_lengths = torch.tensor([g.numel() for g in gathered], dtype=torch.int64)
        new_indptr = torch.zeros_like(self.indptr)
        new_indptr[1:] = torch.cumsum(self.host_lengths.to(self.device), 0)
        # index_select allocates new, exactly sized tensors; dropping the old references frees them
        self.k = self.k.index_select(0, flat).contiguous()
        self.v = self.v.index_select(0, flat).contiguous()
        if bias_list is not None:
            self.bias = torch.cat(kept_bias).contiguous()
        elif self.bias is not None:
            self.bias = self.bias.index_select(0, flat).contiguous()
        self.indptr = new_indptr

    def physical_bytes(self) -> int:
        return physical_bytes([self.k, self.v, self.indptr, self.bias])

    def nominal_bytes(self) -> int:
        if self.k is None:
            return 0
        return self.k.shape[0] * (self.k.shape[1] * self.k.element_size() + self.v.shape[1] * self.v.element_size())


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
    """

    def __init__(self):
        super().__init__(layer_class_to_replicate=RaggedLayer)

    @classmethod
    def from_dense(cls, dense_cache) -> "RaggedKVCache":
        """A copy of a transformers ``DynamicCache`` (every layer's [B, Hkv, N, D] keys/values)."""
        cache = cls()
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
        """Bytes of all storages held (K, V, indptr, bias), each distinct storage counted once."""
        tensors = []
        for layer in self.layers:
            tensors += [layer.k, layer.v, layer.indptr, layer.bias]
        return physical_bytes(tensors)

    def nominal_bytes(self) -> int:
        """Bytes the kept entries need: entries × (D + Dv) × element size, summed over layers."""
        return sum(layer.nominal_bytes() for layer in self.layers)

    def entries(self) -> int:
        """Kept entries over all layers and segments."""
        return sum(0 if layer.k is None else layer.k.shape[0] for layer in self.layers)
