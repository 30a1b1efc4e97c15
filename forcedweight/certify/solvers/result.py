"""The common result of every exact solver."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SolverResult:
    """What a solver proved about ``ES(s)`` for one row.

    Attributes
    ----------
    value : float
        E of ``best_set`` (the best value found), recomputed by ``operator.forced_error``.
    best_set : ndarray (s,) int64, sorted
    lower_bound : float
        A proved lower bound on ES(s) (``value`` itself when ``proved``).
    proved : bool
        True when the solver proved ``value`` optimal within ``tolerance``.
    solver : str
        "bnb", "scip", "cpsat", "mitm", "enumerate".
    seconds : float
    tolerance : float
        The absolute tolerance of the proof on E (documented per solver).
    info : dict
        Solver-specific counters (nodes, ...).
    """

    value: float
    best_set: np.ndarray
    lower_bound: float
    proved: bool
    solver: str
    seconds: float
    tolerance: float = 0.0
    info: dict = field(default_factory=dict)

    def in_units(self, k: int) -> "SolverResult":
        """This result of a solve on values scaled by ``2**-k`` (``operator.unit_exponent``) in the row's own
        units: value, lower bound and tolerance times ``2**k`` (exact); returns self."""
        self.value, self.lower_bound, self.tolerance = (float(np.ldexp(x, k)) for x in
                                                        (self.value, self.lower_bound, self.tolerance))
        return self
