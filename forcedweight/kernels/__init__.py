"""Attention kernels over the ragged per-head KV layout: ``ragged_decode`` (Triton on CUDA, PyTorch on
CPU) and its float64 reference ``reference.ragged_decode_reference``."""

from forcedweight.kernels.ragged_decode import BACKENDS, ragged_decode, validate_ragged

__all__ = ["BACKENDS", "ragged_decode", "validate_ragged"]
