"""Certification with SCIP through pyscipopt (docs/enumerate.md).

"No kept set is better than t" is the infeasibility of the convex second-order cone

    ||y|| <= t w,   y = sum_i x_i a_i,   w = sum_i x_i p_i,   sum_i x_i = s,   x binary,

with ``a_i = p_i (v_i - mu)``, tight bounds on every ``y_j`` and on ``w`` (sums of the s smallest
/ largest entries). The solver runs rounds: ``t = (1 - REL_EPS) * E(best)``; if SCIP proves the
cone infeasible, ``best`` is optimal; if it finds a point, the kept set is re-evaluated exactly
(``operator.forced_error``), polished by best-improvement 1-swaps (``core.swaps.swap_search``) and
becomes the new ``best``.
(Minimising t directly makes ``t w`` bilinear and nonconvex; the fixed-t cone is what SCIP
propagates well.) To keep the cone well scaled, ``y`` is divided by t so that the cone reads
``||y / t|| <= w``; SCIP's feasibility tolerance is ``FEASTOL``.
"""

from __future__ import annotations

import time

import numpy as np

from forcedweight.core import operator as op
from forcedweight.core.swaps import swap_search
from forcedweight.certify.solvers.result import SolverResult

POLISH_SWAPS = 1000  # most 1-swaps when polishing a set found by SCIP
REL_EPS = 1e-6  # a round asks for a set with E < (1 - REL_EPS) * E(best)
FEASTOL = 1e-7  # SCIP numerics/feastol on the scaled cone (below ~1e-7 SoPlex warns it cannot
#                 reach the tightened LP tolerance without GMP)
RESOLUTION = float(np.finfo(np.float64).eps) / FEASTOL  # no round below t = RESOLUTION * (sum of the s largest
# ||a_i||): there the float64 rounding of a round's scaled sums y / t (eps * that sum / t) exceeds FEASTOL, so
# SCIP can tell neither side of the cone (a 6-key row at t / sum = 4e-13 spent its whole time limit)


def _round(A, p, s, t, nogoods, time_left):
    """One SCIP feasibility round. Returns ("infeasible"|"feasible"|"limit", set or None)."""
    from pyscipopt import SCIP_PARAMSETTING, Model, quicksum, sqrt

    n, d = A.shape
    At = A / t
    m = Model("forcedweight")
    m.hideOutput()
    m.setParam("limits/time", max(time_left, 0.01))
    m.setParam("numerics/feastol", FEASTOL)
    # no LP tolerance tightening in cone enforcement: SoPlex without GMP cannot go below 1e-10
    # and prints a warning on every attempt
    m.setParam("constraints/nonlinear/tightenlpfeastol", False)
    m.setParam("parallel/maxnthreads", 1)
    m.setParam("randomization/randomseedshift", 0)
    # a round is an infeasibility proof: primal heuristics, cutting planes and presolving cost
    # more than they save (measured 5-10x faster on peaked N = 64-128 rows, benchmarks/)
    m.setHeuristics(SCIP_PARAMSETTING.OFF)
    m.setSeparating(SCIP_PARAMSETTING.OFF)
    m.setPresolve(SCIP_PARAMSETTING.OFF)
    x = [m.addVar(f"x{i}", vtype="B") for i in range(n)]
    m.addCons(quicksum(x) == s)
    srt = np.sort(At, axis=0)
    ys = []
    for j in range(d):
        yj = m.addVar(f"y{j}", lb=float(srt[:s, j].sum()), ub=float(srt[-s:, j].sum()))
        m.addCons(quicksum(float(At[i, j]) * x[i] for i in range(n) if At[i, j] != 0.0) == yj)
        ys.append(yj)
    ps = np.sort(p)
    w = m.addVar("w", lb=float(ps[:s].sum()), ub=float(ps[-s:].sum()))
    # a set of zero-mass keys only (y = 0, w = 0: E undefined) passes the cone, within any tolerance on w;
    # SCIP then crashed (SIGFPE) after a few no-goods. A set with a finite E holds a key of positive mass.
    if (p == 0).sum() >= s:
        m.addCons(quicksum(x[i] for i in range(n) if p[i] > 0) >= 1)
    m.addCons(quicksum(float(p[i]) * x[i] for i in range(n) if p[i] != 0.0) == w)
    m.addCons(sqrt(quicksum(yj * yj for yj in ys)) <= w)
    for S in nogoods:
        m.addCons(quicksum(x[i] for i in S) <= s - 1)
    m.optimize()
    status = m.getStatus()
    if status == "infeasible":
        return "infeasible", None
    if m.getNSols() > 0:
        sol = m.getBestSol()
        S = np.flatnonzero(np.array([m.getSolVal(sol, xi) for xi in x]) > 0.5)
        return "feasible", S
    return "limit", None


def solve_scip(p, V, s: int, incumbent=None, time_limit: float = 10.0) -> SolverResult:
    """Exact ES(s) over all N keys by rounds of SCIP cone-infeasibility proofs.

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : 1 <= s <= N.
    incumbent : optional (s,) key indices (default: top-mass polished by 1-swaps).
    time_limit : seconds over all rounds.

    Returns
    -------
    SolverResult(solver="scip"). ``proved``: SCIP proved that no set has
    ``E < (1 - REL_EPS) * value``; ``tolerance = REL_EPS * value``. A value at or below
    ``operator.forced_error_rounding(V, s)`` (the float64 rounding of E) is proved at once with
    ``tolerance = value`` (no set has E < 0; below that floor a round could never end: SCIP's
    tolerances cannot separate it from an exact 0). A value above that floor but below SCIP's resolution,
    ``RESOLUTION`` times the sum of the s largest ``||a_i||``, is returned unsolved at once with
    ``info["below_resolution"] = True``: there a round's arithmetic cannot support a proof (``bnb``, whose
    margins are rigorous, can). (Feasibility tolerances only
    make SCIP accept a point more easily; every point is re-evaluated exactly, and one that is no
    real improvement is cut off by a no-good constraint.) Unsolved: ``lower_bound = 0`` (a fixed-t round proves nothing until it
    finishes).
    """
    t0 = time.perf_counter()
    p, V = op.as_row(p, V, s)
    n = p.shape[0]
    A = op.centred_contributions(p, V)
    best = op.top_mass_set(p, s) if incumbent is None else op.as_index(incumbent, n)
    if best.size != s:
        raise ValueError(f"incumbent has {best.size} keys, expected s = {s}")
    if incumbent is None:
        best, _ = swap_search(p, V, best, max_swaps=POLISH_SWAPS, A=A)
    value = op.forced_error(p, V, best, A)
    floor = op.forced_error_rounding(V, s)
    reach = RESOLUTION * float(np.sort(np.linalg.norm(A, axis=1))[-s:].sum())
    rounds, nogoods = 0, []
    proved = False
    while value > floor and value * (1.0 - REL_EPS) >= reach:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            break
        rounds += 1
        status, S = _round(A, p, s, value * (1.0 - REL_EPS), nogoods, left)
        if status == "infeasible":
            proved = True
            break
        if status == "limit":
            break
        raw = S
        S, _ = swap_search(p, V, raw, max_swaps=POLISH_SWAPS, A=A)
        e = op.forced_error(p, V, S, A)
        if e < value:
            best, value = S, e
        else:  # inside SCIP's tolerance but no real improvement: exclude it and go on
            nogoods.append(raw)
    at_zero = value <= floor  # E >= 0: nothing is left to prove, up to the rounding of E itself
    proved = proved or at_zero
    lb = value if proved else 0.0
    return SolverResult(value, np.sort(best).astype(np.int64), lb, proved, "scip",
                        time.perf_counter() - t0, value if at_zero else REL_EPS * value,
                        {"rounds": rounds, "nogoods": len(nogoods),
                         "below_resolution": bool(not proved and value * (1.0 - REL_EPS) < reach)})
