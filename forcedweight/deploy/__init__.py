"""Deployment: the ragged per-head KV cache, the attention function that decodes through it, and the
memory audit (mask over a full cache versus ragged storage)."""

from forcedweight.deploy.ragged_cache import RaggedKV, RaggedKVCache, RaggedLayer, physical_bytes

__all__ = ["RaggedKV", "RaggedKVCache", "RaggedLayer", "physical_bytes"]
