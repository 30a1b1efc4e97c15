"""Small random attention rows of several shapes, shared by the enumeration and solver tests."""

import numpy as np

KINDS = ("peaked", "flat", "duplicates", "tied", "zero_mass")


def make_row(seed: int, n: int, d: int, kind: str):
    """Weights (n,) summing to 1 and values (n, d), float64, of one of ``KINDS``."""
    rng = np.random.default_rng(seed)
    if kind == "peaked":
        p = rng.random(n) ** 6
    elif kind == "flat":
        p = 1.0 + 0.01 * rng.random(n)
    elif kind == "tied":
        p = np.ones(n)
    else:
        p = rng.random(n) + 0.05
    if kind == "zero_mass" and n > 2:
        p[rng.integers(n)] = 0.0
    p = p / p.sum()
    V = rng.normal(size=(n, d))
    if kind == "duplicates":
        V[: (n + 1) // 2] = V[0]
    if kind == "tied":
        V = np.round(V)
    return p, V
