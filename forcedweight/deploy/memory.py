"""``forcedweight memory``: one random per-head selection stored two ways, measured in physical bytes.

The quick, model-only form of the memory audit; ``forcedweight audit --part memory``
(:mod:`forcedweight.deploy.audit.memory`) measures the same storages for real policies, allocators
and compression ratios on task examples. Both build the mask with ``audit.memory.keep_mask``.

- **masked**: the full K/V tensors plus a bool mask [B, Hkv, N] per layer marking the kept entries
  (what mask-based eviction pipelines hold: the evicted entries never leave memory);
- **ragged**: :class:`~forcedweight.deploy.ragged_cache.RaggedKVCache` after ``evict`` (only the kept
  entries, packed, plus an int64 ``indptr`` per layer).

Bytes are the sizes of the storages actually held (``untyped_storage().nbytes()``), not shapes.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from forcedweight.compat import cache_kwargs
from forcedweight.deploy.audit.memory import dense_tensors, keep_mask
from forcedweight.deploy.ragged_cache import RaggedKVCache, physical_bytes
from forcedweight.errors import InputError
from forcedweight.models import load_model, tiny_llama


def recency_random_selection(n: int, s: int, segments: int, seed: int) -> list[np.ndarray]:
    """Per segment: the last ``s // 4`` positions (recency floor) plus a seeded random draw of the rest.

    Returns ``segments`` sorted int64 arrays of ``min(s, n)`` distinct positions in ``[0, n)``.
    The audit's byte counts depend only on how many entries are kept, not on which.
    """
    rng = np.random.default_rng(seed)
    s = min(s, n)
    floor = s // 4
    out = []
    for _ in range(segments):
        recent = np.arange(n - floor, n)
        rest = rng.choice(n - floor, size=s - floor, replace=False)
        out.append(np.sort(np.concatenate([rest, recent])).astype(np.int64))
    return out


TINY_WINDOW = 32768  # the tiny model's window: its positions grow with --tokens up to this (a prefill of more
# tokens on the CPU takes minutes, and ~1e11 tokens asked for terabytes before any check)


def _load(model, seed: int, tokens: int):
    if not isinstance(model, str):
        return model, getattr(model, "name_or_path", type(model).__name__)
    if model == "tiny":
        if tokens > TINY_WINDOW:
            raise InputError(f"--tokens: {tokens} exceeds the tiny model's window of {TINY_WINDOW}")
        return tiny_llama(seed, max_positions=max(512, tokens)), "tiny"
    loaded = load_model(model)
    return loaded.model, loaded.name


def budget_from(tokens: int, budget: int | None = None, compression_ratio: float | None = None) -> int:
    """Kept entries per KV head from exactly one of ``budget`` (entries kept) or ``compression_ratio``
    (the evicted fraction, kvpress's meaning): ``s = max(1, round((1 - compression_ratio) * tokens))``.

    Raises InputError (naming the option) unless exactly one is given, ``0 <= compression_ratio < 1``
    and ``1 <= s <= tokens``.
    """
    if (budget is None) == (compression_ratio is None):
        raise InputError("give exactly one of --budget or --compression-ratio")
    if compression_ratio is not None:
        if not 0 <= compression_ratio < 1:
            raise InputError(f"--compression-ratio: the evicted fraction must be in [0, 1), got {compression_ratio}")
        budget = max(1, round((1 - compression_ratio) * tokens))
    if budget < 1:
        raise InputError(f"--budget: must be at least 1, got {budget}")
    if budget > tokens:
        raise InputError(f"--budget: {budget} exceeds --tokens {tokens} (nothing left to evict)")
    return int(budget)


def audit_memory(model="tiny", tokens: int = 512, budget: int | None = None,
                 compression_ratio: float | None = None, seed: int = 0, batch: int = 1) -> dict:
    """Prefill ``tokens`` seeded random token ids, select ``budget`` entries per (batch, KV head) in every
    layer, and measure the full, masked and ragged storage of that selection.

    Parameters
    ----------
    model : "tiny", "smollm2", a model directory / .gguf path, or a loaded transformers causal LM.
    tokens : prompt length N.
    budget : kept entries per KV head (s); or
    compression_ratio : the evicted fraction in [0, 1): s = max(1, round((1 - compression_ratio) * N)).
    seed : seeds the token ids, the tiny model and the selection.

    Returns
    -------
    dict with ``model, tokens, batch, layers, kv_heads, head_dim, dtype, budget, kept_entries,
    full_bytes, mask_bytes, masked_bytes, ragged_bytes, ragged_nominal_bytes, ragged_metadata_bytes,
    ragged_over_full, ragged_over_masked``.
    """
    if tokens < 1:
        raise InputError(f"--tokens: must be at least 1, got {tokens}")
    budget = budget_from(tokens, budget, compression_ratio)
    lm, name = _load(model, seed, tokens)
    window = getattr(lm.config, "max_position_embeddings", None)
    if window is not None and tokens > window:
        raise InputError(f"--tokens: {tokens} exceeds the model's window of {window}")
    vocab = lm.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    dense = DynamicCache(config=lm.config)
    try:
        ids = torch.randint(0, vocab, (batch, tokens), generator=g).to(lm.device)
        with torch.no_grad():
            lm(input_ids=ids, use_cache=True, **cache_kwargs(dense))
    except (MemoryError, RuntimeError) as exc:  # torch's CPU allocator raises RuntimeError, CUDA OutOfMemoryError
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        raise InputError(f"--tokens: the prefill of {tokens} tokens needs more memory than this machine has") from None
    layers = len(dense.layers)
    B, Hkv, N, D = dense.layers[0].keys.shape
    full_tensors = dense_tensors(dense)
    full_bytes = physical_bytes(full_tensors)

    ragged = RaggedKVCache.from_dense(dense)
    masks = []
    for i in range(layers):
        keep = recency_random_selection(N, budget, B * Hkv, seed + 1 + i)
        masks.append(keep_mask(keep, N, lm.device).reshape(B, Hkv, N))
        ragged.evict(i, [torch.from_numpy(k) for k in keep])
    mask_bytes = physical_bytes(masks)
    masked_bytes = physical_bytes(full_tensors + masks)
    ragged_bytes = ragged.physical_bytes()
    nominal = ragged.nominal_bytes()
    return {
        "model": name, "tokens": N, "batch": B, "layers": layers, "kv_heads": Hkv, "head_dim": D,
        "dtype": str(dense.layers[0].keys.dtype).replace("torch.", ""), "budget": budget,
        "kept_entries": ragged.entries(), "full_bytes": full_bytes, "mask_bytes": mask_bytes,
        "masked_bytes": masked_bytes, "ragged_bytes": ragged_bytes, "ragged_nominal_bytes": nominal,
        "ragged_metadata_bytes": ragged_bytes - nominal,
        "ragged_over_full": ragged_bytes / full_bytes, "ragged_over_masked": ragged_bytes / masked_bytes,
    }


def format_audit(result: dict) -> str:
    """The audit as a plain-text table (bytes and ratios to the full cache)."""
    full = result["full_bytes"]
    lines = [
        f"model {result['model']}: {result['layers']} layers x {result['kv_heads']} KV heads x head dim "
        f"{result['head_dim']} ({result['dtype']}), batch {result['batch']}, {result['tokens']} tokens, "
        f"budget {result['budget']} per head ({result['kept_entries']} entries kept)",
        f"{'storage':<28}{'bytes':>14}{'vs full':>10}",
    ]
    for label, key in (("full cache", "full_bytes"), ("masked (full + bool mask)", "masked_bytes"),
                       ("ragged (after evict)", "ragged_bytes"), ("  of which kept K/V", "ragged_nominal_bytes"),
                       ("  of which metadata", "ragged_metadata_bytes")):
        lines.append(f"{label:<28}{result[key]:>14,}{result[key] / full:>10.4f}")
    lines.append(f"ragged / masked = {result['ragged_over_masked']:.4f}")
    return "\n".join(lines)
