"""Certification of one attention row and budget (docs/enumerate.md): every heuristic, the pool, a solver.

``certify_row(row, s, options)`` returns one output record (``certify.record``): the forced-weight
error of top-mass, balancing and the other selectors, the exact pool minimum ``es_pool``, and what
an exact solver over all N keys proved. ``es_best`` is the minimum over all of them; ``best_set``
achieves it, and ``operator.forced_error(p, V, best_set) == es_best`` exactly (asserted here:
every candidate's value is recomputed by the operator, never taken from a solver).
``certify_file`` runs the whole pipeline over a Parquet file or directory
(``forcedweight.certify.run``).

The steps, one function each: ``_inputs`` (budget, keys/query) → ``_heuristics`` (top-mass,
balancing, the selectors) → ``_pool`` (``certify.pool``: the pool and ``ES_pool``) → ``_prove``
(the solver of ``options.solver``, and the status) → ``_checked`` (the best set re-valued) →
``record.make_record``.

Status (per row and s):

- ``optimal``: ``es_best`` is proved optimal over all N keys (by the solver within its tolerance,
  by exhaustive enumeration when the pool is every key, or because ``es_best = 0``);
- ``improved``: not proved, but the solver found a set better than every heuristic and the pool by
  more than the tolerance;
- ``unsolved``: no proof (time limit, or ``--solver none``); ``lower_bound`` is the solver's proved
  bound (0, the trivial bound, with ``--solver none``);
- ``invalid``: the row or budget broke the contract (only with ``--skip-invalid``); ``reason``.

Whether the solver beat every heuristic and the pool is recorded on its own in the boolean
column ``solver_improved`` (true for ``improved`` rows and for ``optimal`` rows whose optimum the
pool and the swaps missed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from forcedweight.certify.options import CertifyOptions, run_solver
from forcedweight.certify.pool import pool_optimum, pool_size_limit
from forcedweight.certify.record import make_record, penalties
from forcedweight.core import operator as op
from forcedweight.errors import RowError
from forcedweight.rows import Row, check_keys_query, validate_budget
from forcedweight.selectors import (
    FreeGeometry, Geometric, KNorm, Leverage, MissingInput, Quest, Random, RowView, StreamingLLM, as_view, balancing,
)

#: relative slack under which two errors count as equal (float64 round-off of E on d <= 4096)
REL_EQUAL = 1e-9
#: smallest positive weight, relative to the largest, that the exact search takes: the enumeration and the branch
#: and bound sum squares of contributions ``p_i (v_i - mu)`` (Gram entries), and below ~1e-154 of the largest
#: those underflow, so a set of such light keys passed for E = 0 and wrong sets were proved optimal (rows of
#: 8-13 keys with weights 1e-300..1e-150 of the others; float32 softmax weights stop at ~1e-45)
MASS_SPAN = 1e-100


def mass_span_problem(p: np.ndarray) -> str | None:
    """Why the row's weights (N,) are out of the exact search's range (``MASS_SPAN``), else None."""
    pos = p[p > 0]
    if pos.size == 0:  # (all-zero weights are refused by the row contract)
        return None
    lo, hi = float(pos.min()), float(pos.max())
    if lo >= MASS_SPAN * hi:
        return None
    span = f"{1 / MASS_SPAN:.0e}".replace("e+", "e")  # (1e100: the message read from the constant)
    return (f"weights span more than {span} (smallest positive {lo:.3g}, largest {hi:.3g}): the exact search's "
            f"sums of squares would underflow; certify takes rows whose positive weights are within "
            f"{MASS_SPAN:.0e} of the largest")


@dataclass
class _Known:
    """The best set known so far and who found it (``found``: every candidate, priority order)."""

    value: float
    by: str
    best_set: np.ndarray
    found: list = field(default_factory=list)


@dataclass
class _Proof:
    status: str
    proved: bool
    solver: str
    lower: float
    improved: bool = False
    reason: str | None = None


def _inputs(row: Row, s: int) -> RowView:
    """The row's view for the selectors; RowError on a bad budget or keys/query lengths."""
    validate_budget(s, row.n_keys, row.row_id)
    view = as_view(row)  # RowError when keys do not divide into N rows
    if view.keys is not None and view.query is not None:
        check_keys_query(row.n_keys, view.keys.size, np.size(view.query), row.row_id)
    return view


def _heuristics(view: RowView, s: int, options: CertifyOptions, pool: np.ndarray, err: Callable):
    """Top-mass, balancing and every selector: their sets and errors (``None`` = not applicable)."""
    p, V = view.p, view.V
    top = op.top_mass_set(p, s)
    bal, swaps = balancing(p, V, s, candidates=pool if options.balance_candidates == "pool" else None)
    sets = {"balancing": bal, "top-mass": top}
    selector_errors: dict[str, float | None] = {}
    for key, selector in (
        ("es_geometric", Geometric()), ("es_free_geometry", FreeGeometry()), ("es_leverage", Leverage()), ("es_random", Random(options.seed)),
        ("es_streaming", StreamingLLM()), ("es_knorm", KNorm()), ("es_quest", Quest()),
    ):
        try:
            S = selector.select(view, s)
        except MissingInput:
            selector_errors[key] = None
            continue
        sets[selector.name] = S
        selector_errors[key] = err(S)
    return top, bal, swaps, sets, selector_errors


def _best_known(pool_set: np.ndarray, sets: dict, err: Callable) -> _Known:
    """The best of the pool and the heuristics; order = priority on exact ties."""
    found = [("pool", pool_set), *sets.items()]
    values = [err(S) for _, S in found]
    k = int(np.argmin(values))
    return _Known(values[k], found[k][0], found[k][1], found)


def _prove(view: RowView, s: int, options: CertifyOptions, pool: np.ndarray, known: _Known,
           err: Callable) -> _Proof:
    """What is proved about ``ES(s)``; ``known`` is updated when the solver finds a better set."""
    n = view.n_keys
    zero = op.forced_error_rounding(view.V, s)  # a set at or below E's own rounding may be an exact 0: optimal
    if known.value <= zero:
        return _Proof("optimal", True, "zero", 0.0)
    if pool.size == n:  # the pool search (enumeration or pool bnb) was exhaustive
        return _Proof("optimal", True, "enumerate", known.value)
    if options.solver == "none":
        return _Proof("unsolved", False, "none", 0.0)
    res, reason = run_solver(options.solver, view.p, view.V, s, known.best_set, options.time_limit,
                             options.node_limit, options.refine_work, options.bound_time)
    sol_set = op.as_index(res.best_set, n)
    if sol_set.size != s:
        raise RuntimeError(f"row {view.row_id}: solver {res.solver} returned {sol_set.size} keys, not s={s}")
    e_sol, e_known = err(sol_set), known.value
    # two values within E's own float64 rounding (operator.forced_error_rounding) are one value: two
    # sets of exact E = 0 compute to noise of ~1e-17, which must neither contradict a proof nor improve
    tol = max(float(res.tolerance), REL_EQUAL * e_known, zero)
    discarded = improved = False
    if e_sol < e_known - tol:
        improved = True
        status, proved = ("optimal", True) if res.proved else ("improved", False)
    elif res.proved and e_sol > e_known + tol:
        # a proof contradicted by a known better set is not trusted (a solver bug)
        status, proved, discarded = "unsolved", False, True
        reason = f"{res.solver} claimed {e_sol:.17g} optimal but {known.by} has {e_known:.17g}; proof discarded"
    else:
        status, proved = ("optimal", True) if res.proved else ("unsolved", False)
    if e_sol < e_known:
        known.value, known.by, known.best_set = e_sol, res.solver, sol_set
    if known.value <= zero and not discarded:  # a set of E = 0 is optimal whether or not the search ended
        # (exact E = 0 computes to 0 or to noise of ~1e-17, as the CPU's instructions round)
        status, proved = "optimal", True
    lower = 0.0 if discarded else min(float(res.lower_bound), known.value)
    return _Proof(status, proved, res.solver, lower, improved, reason)


def _checked(view: RowView, known: _Known) -> float:
    """``es_best``, after re-valuing ``best_set`` with the operator from scratch."""
    check = op.forced_error(view.p, view.V, known.best_set)
    if not (check == known.value or math.isclose(check, known.value, rel_tol=1e-12, abs_tol=1e-300)):
        raise RuntimeError(f"row {view.row_id}: best_set gives E = {check!r}, not es_best = {known.value!r}")
    return known.value


def needs_solver(n: int, s: int, options: CertifyOptions) -> bool:
    """Whether a row of N = n keys may reach the solver at budget s (its pool does not cover it)."""
    return options.solver != "none" and pool_size_limit(n, s, options.pool_mass, options.pool_error) < n


def certify_row(row: Row, s: int, options: CertifyOptions | None = None) -> dict:
    """Certify one row at budget s: heuristics, exact pool enumeration, a solver over all N keys.

    Parameters
    ----------
    row : rows.Row with ``p`` (N,) and ``V`` (N, d) in float64.
    s : budget, 1 <= s <= N (else RowError naming the row).
    options : CertifyOptions (defaults when None).

    Returns
    -------
    dict with the columns of ``record.OUTPUT_COLUMNS`` and the row's carried columns.
    """
    options = options or CertifyOptions()
    t0 = time.perf_counter()
    p, V = row.p, row.V
    view = _inputs(row, s)
    memory = options.memory_problem(row.n_keys, V.shape[1], s, needs_solver(row.n_keys, s, options))
    if memory is not None:  # refused before any N x N (or pool x pool) allocation
        raise RowError(row.row_id, memory)
    span = mass_span_problem(p)
    if span is not None:
        raise RowError(row.row_id, span)
    A = op.centred_contributions(p, V)

    def err(S) -> float:
        return op.forced_error(p, V, S, A=A)

    pool, _, pool_set, pool_bnb = pool_optimum(p, V, s, options.pool_mass, options.pool_error,
                                               options.max_subsets, options.pool_node_limit)
    top, bal, swaps, sets, selector_errors = _heuristics(view, s, options, pool, err)
    if pool_bnb is not None:  # the configured pool's unproved bnb set: a candidate, not ES_pool
        sets["pool-bnb"] = pool_bnb
    es_pool = err(pool_set)
    known = _best_known(pool_set, sets, err)
    proof = _prove(view, s, options, pool, known, err)
    es_best = _checked(view, known)
    es_top = err(top)
    return make_record(
        row.row_id, s, row.n_keys, es_top=es_top, es_balance=err(bal), swaps=swaps,
        es_pool=es_pool, pool_size=pool.size, es_best=es_best, best_set=known.best_set,
        best_by=known.by, lower_bound=proof.lower, status=proof.status, proved=proof.proved,
        solver=proof.solver, solver_improved=proof.improved, dropped_mass=op.dropped_mass(p, top),
        penalty=penalties(p, V, top, known.best_set, es_top, es_best),
        selector_errors=selector_errors, seconds=time.perf_counter() - t0, reason=proof.reason,
        extra=row.extra,
    )


__all__ = ["MASS_SPAN", "REL_EQUAL", "RowError", "certify_row", "mass_span_problem"]
