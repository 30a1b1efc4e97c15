"""Attention kernels over the ragged per-head KV layout: ``ragged_decode`` (packed segments) and
``segment_decode`` (segment extents of a buffer, the ragged cache's layout) — Triton on CUDA, PyTorch on
CPU — and their float64 reference (``reference``)."""

from forcedweight.kernels.ragged_decode import (
    BACKENDS,
    ragged_decode,
    segment_decode,
    validate_features,
    validate_ragged,
    validate_segments,
)

__all__ = ["BACKENDS", "ragged_decode", "segment_decode", "validate_features", "validate_ragged", "validate_segments"]
