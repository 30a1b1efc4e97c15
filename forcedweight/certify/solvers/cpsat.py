"""OR-Tools CP-SAT for integral rows (uniform masses, 1-D integer values): the MIP-side cross-check.

Model: booleans ``x_i`` (key i kept), ``sum x = s``, and an integer ``z >= |N sum_i a_i x_i - s T|``
(divided through by ``g = gcd(N, s)``), minimised. With uniform masses ``E(S) = g z / (N s)``, so
CP-SAT's proved objective bound is a proved lower bound on ES(s). When ``s = N/2``, S and its
complement have the same error, so key 0 is fixed in S (a symmetry cut that keeps an optimum).
"""

from __future__ import annotations

import math
import time

import numpy as np

from forcedweight.core import operator
from forcedweight.certify.solvers.mitm import integer_values
from forcedweight.certify.solvers.result import SolverResult

INT64_SAFE = 2**62


def solve_cpsat(
    p: np.ndarray,
    V: np.ndarray,
    s: int,
    incumbent=None,
    time_limit: float = 10.0,
    workers: int = 1,
    seed: int = 0,
) -> SolverResult:
    """Exact ``ES(s)`` by CP-SAT for a uniform-mass, 1-D, integer row.

    Parameters
    ----------
    p : (N,) float64 uniform weights.
    V : (N, 1) float64 integer values.
    s : int, 1 <= s <= N.
    incumbent : optional kept set (s indices) given to CP-SAT as a solution hint.
    time_limit : float, seconds.
    workers : int, CP-SAT search workers (1 or 2 on a laptop).
    seed : int, CP-SAT random seed.

    Returns
    -------
    SolverResult
        ``proved`` when CP-SAT reports OPTIMAL; otherwise ``lower_bound`` comes from its best
        objective bound. ``info["numerator"]`` is the proved ``min |N sum_S a - s T|`` when proved.

    Raises
    ------
    ValueError
        The row is not integral (masses not uniform, values not 1-D integers, sums too large).
    """
    from ortools.sat.python import cp_model  # heavy optional dependency, loaded when used

    t0 = time.perf_counter()
    a = integer_values(p, V)  # raises ValueError naming what breaks the structure
    p = np.asarray(p, dtype=np.float64)
    Vc = a.astype(np.float64)[:, None]
    n = a.size
    if not 1 <= s <= n:
        raise ValueError(f"budget s={s} outside [1, {n}]")
    g = math.gcd(n, s)
    cn, cs = n // g, s // g
    total = int(a.sum())
    coef = [cn * int(x) for x in a]
    bound = sum(abs(c) for c in coef) + abs(cs * total)
    if bound >= INT64_SAFE:
        raise ValueError("values too large for CP-SAT's int64 coefficients")

    model = cp_model.CpModel()
    x = [model.NewBoolVar(f"x{i}") for i in range(n)]
    model.Add(sum(x) == s)
    diff = model.NewIntVar(-bound, bound, "diff")
    model.Add(diff == sum(c * xi for c, xi in zip(coef, x)) - cs * total)
    z = model.NewIntVar(0, bound, "z")
    model.AddAbsEquality(z, diff)
    if 2 * s == n:
        model.Add(x[0] == 1)
    if incumbent is not None:
        inc = set(int(i) for i in np.asarray(incumbent).ravel())
        if 2 * s == n and 0 not in inc:
            inc = set(range(n)) - inc
        for i in range(n):
            model.AddHint(x[i], int(i in inc))
    model.Minimize(z)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(max(time_limit, 0.01))
    solver.parameters.num_search_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    status = solver.Solve(model)

    scale = g / (n * s)
    tol = operator.forced_error_rounding(a, s)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        kept = np.array([i for i in range(n) if solver.Value(x[i])], dtype=np.int64)
    elif incumbent is not None:
        kept = np.sort(np.asarray(incumbent, dtype=np.int64).ravel())
    else:
        kept = np.arange(s, dtype=np.int64)
    value = operator.forced_error(p, Vc, kept)
    proved = status == cp_model.OPTIMAL
    info = {"status": solver.StatusName(status), "branches": int(solver.NumBranches()),
            "conflicts": int(solver.NumConflicts())}
    if proved:
        numerator = int(round(solver.ObjectiveValue())) * g
        info["numerator"] = numerator
        info["exact_value"] = numerator / (n * s)
        lower = value
    else:
        bound_z = solver.BestObjectiveBound() if status == cp_model.FEASIBLE else 0.0
        lower = max(0.0, math.ceil(bound_z - 1e-9) * scale - tol)
    return SolverResult(value, kept, lower, proved, "cpsat", time.perf_counter() - t0, tol, info)
