"""forcedweight: exact best kept subsets of attention keys under forced weights.

Capture attention rows from real models (``forcedweight.dump``), enumerate and certify the best
kept subsets (``forcedweight.certify.enumerate``, ``forcedweight.certify.solvers``), compute paper statistics
(``forcedweight.core.stats``, ``forcedweight.report``), generate NP-hard instances with known answers
(``forcedweight.instances``), and deploy through a ragged per-head KV cache and Triton decode
kernel (``forcedweight.kernels``, ``forcedweight.deploy``, ``forcedweight.probabilistic``).
"""

__version__ = "0.1.0"

from forcedweight.rows import load_rows  # noqa: E402  (the one loader a user needs for a dump)

__all__ = ["__version__", "load_rows"]
