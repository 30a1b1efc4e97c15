"""Certification of one attention row and budget (SPEC §5): every heuristic, the pool, a solver.

``certify_row(row, s, options)`` returns one output record: the forced-weight error of top-mass,
balancing and the other selectors, the exact pool minimum ``es_pool``, and what an exact solver
over all N keys proved. ``es_best`` is the minimum over all of them; ``best_set`` achieves it, and
``operator.forced_error(p, V, best_set) == es_best`` exactly (asserted here: every candidate's
value is recomputed by the operator, never taken from a solver). ``certify_file`` runs the whole
pipeline over a Parquet file or directory (see ``forcedweight.certify.run``).

Status (per row and s):

- ``optimal``: ``es_best`` is proved optimal over all N keys (by the solver within its tolerance,
  by exhaustive enumeration when the pool is every key, or because ``es_best = 0``);
- ``improved``: not proved, but the solver found a set better than every heuristic and the pool by
  more than the tolerance;

Whether the solver beat every heuristic and the pool is recorded on its own in the boolean
column ``solver_improved`` (true for ``improved`` rows and for ``optimal`` rows whose optimum the
pool and the swaps missed);
- ``unsolved``: no proof (time limit, or ``--solver none``); ``lower_bound`` is the solver's proved
  bound (0, the trivial bound, with ``--solver none``);
- ``invalid``: the row or budget broke the contract (only with ``--skip-invalid``); ``reason``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from forcedweight.core import operator as op
from forcedweight.errors import InputError, RowError
from forcedweight.rows import Row, validate_budget
from forcedweight.selectors import (
    Geometric, KNorm, Leverage, MissingInput, Quest, Random, StreamingLLM, as_view, balancing,
)

SOLVERS = ("auto", "bnb", "scip", "cpsat", "none")
DROPPED_COLUMNS = ("weights", "values", "keys", "query", "logits", "row_id", "n_keys")
#: relative slack under which two errors count as equal (float64 round-off of E on d <= 4096)
REL_EQUAL = 1e-9

#: the fixed output columns, in order, with their Arrow types (see ``runner.output_schema``)
OUTPUT_COLUMNS = (
    ("row_id", "int64"), ("s", "int64"), ("n_keys", "int64"),
    ("es_top", "float64"), ("es_balance", "float64"), ("swaps", "int64"),
    ("es_pool", "float64"), ("pool_size", "int64"),
    ("es_best", "float64"), ("best_set", "list<int64>"), ("best_by", "string"),
    ("lower_bound", "float64"), ("status", "string"), ("proved", "bool"), ("solver", "string"),
    ("solver_improved", "bool"),
    ("closable_share", "float64"), ("balancing_recovery", "float64"), ("dropped_mass", "float64"),
    ("ef_top", "float64"), ("pi_top", "float64"), ("pi_best", "float64"),
    ("es_geometric", "float64"), ("es_leverage", "float64"), ("es_random", "float64"),
    ("es_streaming", "float64"), ("es_knorm", "float64"), ("es_quest", "float64"),
    ("seconds", "float64"), ("reason", "string"),
)
_OUTPUT_NAMES = frozenset(name for name, _ in OUTPUT_COLUMNS)


@dataclass(frozen=True)
class CertifyOptions:
    """Settings of the certification of one (row, s).

    Attributes
    ----------
    pool_mass : top-mass keys beyond s in the candidate pool (``--pool-mass``).
    pool_error : keys with the largest single-key error in the pool (``--pool-error``).
    solver : "auto" (mitm on uniform-mass 1-D integer rows, else bnb), "bnb", "scip", "cpsat"
        (falls back to scip on rows that are not integral; ``reason`` says so) or "none".
    time_limit : seconds per (row, s) for the solver.
    seed : seed of the random selector.
    max_subsets : cap on C(pool, s); above it ``pool_mass``/``pool_error`` are lowered one at a
        time (the larger first) until the enumeration fits. ``pool_size`` records the pool used.
    balance_candidates : "all" (every key may swap in) or "pool".
    """

    pool_mass: int = 12
    pool_error: int = 8
    solver: str = "auto"
    time_limit: float = 10.0
    seed: int = 0
    max_subsets: int = 4_000_000
    balance_candidates: str = "all"

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise InputError(f"--solver must be one of {', '.join(SOLVERS)}, got {self.solver!r}")
        if self.pool_mass < 0:
            raise InputError(f"--pool-mass must be >= 0, got {self.pool_mass}")
        if self.pool_error < 0:
            raise InputError(f"--pool-error must be >= 0, got {self.pool_error}")
        if not self.time_limit > 0 or not math.isfinite(self.time_limit):
            raise InputError(f"--time-limit must be a positive number of seconds, got {self.time_limit}")
        if self.max_subsets < 1:
            raise InputError(f"--max-subsets must be >= 1, got {self.max_subsets}")
        if self.balance_candidates not in ("all", "pool"):
            raise InputError(f"balance_candidates must be 'all' or 'pool', got {self.balance_candidates!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def carried_columns(extra: dict) -> dict:
    """The input columns carried into the output (provenance and unknown columns)."""
    return {k: v for k, v in extra.items() if k not in DROPPED_COLUMNS and k not in _OUTPUT_NAMES}


def invalid_record(row_id: int, s: int, reason: str, extra: dict | None = None, n_keys: int | None = None) -> dict:
    """The output record of a bad (row, s) under ``--skip-invalid``."""
    rec: dict[str, Any] = {name: None for name, _ in OUTPUT_COLUMNS}
    rec.update(row_id=int(row_id), s=int(s), n_keys=n_keys, status="invalid", proved=False, reason=reason)
    rec.update(carried_columns(extra or {}))
    return rec


def pool_for(p: np.ndarray, V: np.ndarray, s: int, options: CertifyOptions) -> np.ndarray:
    """``enumerate.candidate_pool``, shrunk until ``C(pool, s) <= options.max_subsets``."""
    from forcedweight.certify.enumerate import candidate_pool

    a, b = options.pool_mass, options.pool_error
    while True:
        pool = np.asarray(candidate_pool(p, V, s, pool_mass=a, pool_error=b), dtype=np.int64)
        if math.comb(pool.size, s) <= options.max_subsets or (a == 0 and b == 0):
            return pool
        if a >= b:
            a -= 1
        else:
            b -= 1


def _ratio(e: float, ef: float, scale: float) -> float:
    """``pi = E / EF``; an EF at round-off level (``<= 1e-10 * scale``, scale = the largest
    ``||v_i - mu||``) counts as 0: ``inf`` when E is above that level, ``nan`` when both are."""
    floor = 1e-10 * max(scale, 1e-300)
    if ef <= floor:
        return float("nan") if e <= floor else float("inf")
    return e / ef


def run_solver(name: str, p: np.ndarray, V: np.ndarray, s: int, incumbent: np.ndarray, time_limit: float):
    """Dispatch to an exact solver; returns ``(SolverResult, note)`` (note: a fallback, or None)."""
    if name == "auto":
        from forcedweight.certify.solvers import mitm

        if mitm.matches(p, V):
            res = mitm.solve_mitm(p, V, s, time_limit=time_limit)
            left = time_limit - res.seconds
            if res.proved or left <= 0:
                return res, None
            # out of meet-in-the-middle's reach (N too large): the general solver, remaining time
            from forcedweight.certify.solvers.bnb import solve_bnb

            note = f"mitm gave up ({res.info.get('reason', 'no proof')}); used bnb"
            return solve_bnb(p, V, s, incumbent=incumbent, time_limit=left), note
        name = "bnb"
    if name == "bnb":
        from forcedweight.certify.solvers.bnb import solve_bnb

        return solve_bnb(p, V, s, incumbent=incumbent, time_limit=time_limit), None
    if name == "cpsat":
        from forcedweight.certify.solvers.cpsat import solve_cpsat

        try:
            return solve_cpsat(p, V, s, incumbent=incumbent, time_limit=time_limit), None
        except ValueError:
            note = "cpsat needs an integral row (uniform masses, integer 1-D values); used scip"
            name = "scip"
    else:
        note = None
    if name == "scip":
        from forcedweight.certify.solvers.scip import solve_scip

        return solve_scip(p, V, s, incumbent=incumbent, time_limit=time_limit), note
    raise ValueError(f"unknown solver {name!r}")


def certify_row(row: Row, s: int, options: CertifyOptions | None = None) -> dict:
    """Certify one row at budget s: heuristics, exact pool enumeration, a solver over all N keys.

    Parameters
    ----------
    row : rows.Row with ``p`` (N,) and ``V`` (N, d) in float64.
    s : budget, 1 <= s <= N (else RowError naming the row).
    options : CertifyOptions (defaults when None).

    Returns
    -------
    dict with the columns of ``OUTPUT_COLUMNS`` and the row's carried columns.
    """
    from forcedweight.certify.enumerate import enumerate_best

    options = options or CertifyOptions()
    t0 = time.perf_counter()
    p, V = row.p, row.V
    n = p.shape[0]
    validate_budget(s, n, row.row_id)
    A = op.centred_contributions(p, V)

    def err(S) -> float:
        return op.forced_error(p, V, S, A=A)

    view = as_view(row)  # RowError when keys do not divide into N rows
    if view.keys is not None and view.query is not None and np.size(view.query) != view.keys.shape[1]:
        raise RowError(row.row_id, f"query length {np.size(view.query)} differs from the key dim {view.keys.shape[1]}")
    top = op.top_mass_set(p, s)
    es_top = err(top)
    pool = pool_for(p, V, s, options)
    bal_cand = pool if options.balance_candidates == "pool" else None
    bal, swaps = balancing(p, V, s, candidates=bal_cand)
    _, pool_set = enumerate_best(p, V, pool, s)
    pool_set = op.as_index(pool_set, n)
    es_pool = err(pool_set)

    # every heuristic's set, valued by the operator; order = priority on exact ties
    found: list[tuple[str, np.ndarray]] = [("pool", pool_set), ("balancing", bal), ("top-mass", top)]
    selector_errors: dict[str, float | None] = {}
    for key, selector in (
        ("es_geometric", Geometric()), ("es_leverage", Leverage()), ("es_random", Random(options.seed)),
        ("es_streaming", StreamingLLM()), ("es_knorm", KNorm()), ("es_quest", Quest()),
    ):
        try:
            S = selector.select(view, s)
        except MissingInput:
            selector_errors[key] = None
            continue
        found.append((selector.name, S))
        selector_errors[key] = err(S)
    values = [err(S) for _, S in found]
    k = int(np.argmin(values))
    e_known, best_by, best_set = values[k], found[k][0], found[k][1]

    reason = None
    solver_improved = False
    exhaustive = pool.size == n
    if e_known <= 0.0:
        status, proved, solver_name, lower = "optimal", True, "zero", 0.0
    elif exhaustive:
        status, proved, solver_name, lower = "optimal", True, "enumerate", e_known
    elif options.solver == "none":
        status, proved, solver_name, lower = "unsolved", False, "none", 0.0
    else:
        res, reason = run_solver(options.solver, p, V, s, best_set, options.time_limit)
        solver_name = res.solver
        sol_set = op.as_index(res.best_set, n)
        if sol_set.size != s:
            raise RuntimeError(f"row {row.row_id}: solver {res.solver} returned {sol_set.size} keys, not s={s}")
        e_sol = err(sol_set)
        tol = max(float(res.tolerance), REL_EQUAL * e_known)
        discarded = False
        if e_sol < e_known - tol:
            solver_improved = True
            status, proved = ("optimal", True) if res.proved else ("improved", False)
        elif res.proved and e_sol > e_known + tol:
            # a proof contradicted by a known better set is not trusted (a solver bug)
            status, proved, discarded = "unsolved", False, True
            reason = f"{res.solver} claimed {e_sol:.17g} optimal but {best_by} has {e_known:.17g}; proof discarded"
        else:
            status, proved = ("optimal", True) if res.proved else ("unsolved", False)
        if e_sol < e_known:
            e_known, best_by, best_set = e_sol, res.solver, sol_set
        lower = 0.0 if discarded else min(float(res.lower_bound), e_known)
    es_best = e_known
    check = op.forced_error(p, V, best_set)
    if not (check == es_best or math.isclose(check, es_best, rel_tol=1e-12, abs_tol=1e-300)):
        raise RuntimeError(f"row {row.row_id}: best_set gives E = {check!r}, not es_best = {es_best!r}")

    ef_top = op.free_weight_error(p, V, top)
    ef_best = op.free_weight_error(p, V, best_set)
    gap = es_top - es_best
    # round-off scale of E and EF: the spread of the values around mu (an offset shared by every
    # value cancels in both, so it must not raise the floor)
    Vc = V - op.dense_output(p, V)[None, :]
    scale = float(np.sqrt(np.einsum("ij,ij->i", Vc, Vc).max()))
    rec = {
        "row_id": int(row.row_id), "s": int(s), "n_keys": int(n),
        "es_top": es_top, "es_balance": err(bal), "swaps": int(swaps),
        "es_pool": es_pool, "pool_size": int(pool.size),
        "es_best": es_best, "best_set": [int(i) for i in best_set], "best_by": best_by,
        "lower_bound": float(lower), "status": status, "proved": bool(proved), "solver": solver_name,
        "solver_improved": bool(solver_improved),
        "closable_share": gap / es_top if es_top > 0 else 0.0,
        "balancing_recovery": (es_top - err(bal)) / gap if gap > 0 else float("nan"),
        "dropped_mass": op.dropped_mass(p, top),
        "ef_top": ef_top, "pi_top": _ratio(es_top, ef_top, scale), "pi_best": _ratio(es_best, ef_best, scale),
        **selector_errors,
        "seconds": time.perf_counter() - t0, "reason": reason,
    }
    rec.update(carried_columns(row.extra))
    return rec


__all__ = ["CertifyOptions", "certify_row", "invalid_record", "pool_for", "run_solver",
           "OUTPUT_COLUMNS", "RowError"]
