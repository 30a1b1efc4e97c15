"""The settings of a certification (``CertifyOptions``) and the registry of exact solvers.

``SOLVERS`` maps each ``--solver`` name to a function
``solve(p, V, s, incumbent, time_limit, node_limit=None, refine_work=REFINE_WORK, bound_time=None) -> (SolverResult, note)``, where ``note`` says when the
solver fell back to another one (recorded as ``reason``), else None. ``"none"`` maps to None
(no solver runs). Adding a solver: write ``solvers/<name>.py`` returning a ``SolverResult`` and
register a wrapper here.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from forcedweight.certify.enumerate import enumerate_bytes
from forcedweight.certify.pool import MAX_SUBSETS, POOL_NODE_LIMIT, pool_size_limit
from forcedweight.certify.solvers import cpsat, mitm, scip
from forcedweight.certify.solvers.bnb import solve_bnb
from forcedweight.certify.solvers.frontier import REFINE_WORK, frontier_bytes
from forcedweight.certify.solvers.lp_bound import TAIL_LPS
from forcedweight.certify.solvers.result import SolverResult
from forcedweight.core import operator as op
from forcedweight.errors import InputError

SolveFn = Callable[..., "tuple[SolverResult, str | None]"]


def _bound_effort(refine_work, bound_time=None):
    """bnb's options for the bound of a stopped search: ``refine_work = 0`` turns off all work on it
    (the refinement and the LP directions), for callers that use only the best set; ``bound_time``
    (seconds, None = bnb's default) is its deadline."""
    return {"refine_work": refine_work, "tail_lps": TAIL_LPS if refine_work > 0 else 0, "bound_time": bound_time}


def _threads() -> int:
    """The search threads of one row: this process's Numba threads (all cores in process; a pool
    worker gets ``cores // workers``, ``certify.run``), so ``--workers 1`` puts every core on each
    row and ``--workers 2`` on 2 cores runs rows side by side, one thread each, as before."""
    import numba

    return int(numba.get_num_threads())


def in_unit_scale(solve, p, V, *args, **kwargs):
    """``solve(p, V, *args, **kwargs)`` on the values scaled by a power of two to a largest magnitude in
    [0.5, 1), its result scaled back: E is homogeneous in V and a power of two scales every float64 step
    exactly, so the search is the same; but values of 1e-170 no longer underflow the Gram matrix and the
    squared norms of bnb's tests (a wrong set was proved optimal), nor SCIP's tolerances swallow 1e-13."""
    k = op.unit_exponent(V)
    return solve(p, np.ldexp(np.asarray(V, dtype=np.float64), -k), *args, **kwargs).in_units(k)


def _bnb(p, V, s, incumbent, time_limit, node_limit=None, refine_work=REFINE_WORK, bound_time=None):
    return in_unit_scale(solve_bnb, p, V, s, incumbent=incumbent, time_limit=time_limit, node_limit=node_limit,
                         threads=_threads(), **_bound_effort(refine_work, bound_time)), None


def _auto(p, V, s, incumbent, time_limit, node_limit=None, refine_work=REFINE_WORK, bound_time=None):
    """mitm on uniform-mass 1-D integer rows (bnb with the time left when it gives up), else bnb."""
    if not mitm.matches(p, V):
        return _bnb(p, V, s, incumbent, time_limit, node_limit, refine_work, bound_time)
    res = mitm.solve_mitm(p, V, s, time_limit=time_limit)
    left = time_limit - res.seconds
    if res.proved or left <= 0:
        return res, None
    # out of meet-in-the-middle's reach (N too large): the general solver, remaining time
    note = f"mitm gave up ({res.info.get('reason', 'no proof')}); used bnb"
    return _bnb(p, V, s, incumbent, left, node_limit, refine_work, bound_time)[0], note


def _resolution_note(res) -> str | None:
    """The note of a SCIP result left unsolved because its value is below SCIP's resolution, else None."""
    if res.info.get("below_resolution"):
        return "the value is below SCIP's numerical resolution (solvers.scip.RESOLUTION); not proved, bnb can"
    return None


def _scip(p, V, s, incumbent, time_limit, node_limit=None, refine_work=REFINE_WORK, bound_time=None):
    res = in_unit_scale(scip.solve_scip, p, V, s, incumbent=incumbent, time_limit=time_limit)
    return res, _resolution_note(res)


def _cpsat(p, V, s, incumbent, time_limit, node_limit=None, refine_work=REFINE_WORK, bound_time=None):
    """CP-SAT on integral rows; scip (with a note) on the others."""
    try:
        return cpsat.solve_cpsat(p, V, s, incumbent=incumbent, time_limit=time_limit), None
    except ValueError:
        note = "cpsat needs an integral row (uniform masses, integer 1-D values); used scip"
    res, below = _scip(p, V, s, incumbent, time_limit)
    return res, note if below is None else f"{note}; {below}"


#: ``--solver`` name -> solve function (None: no solver); the order is the one the help lists
SOLVERS: dict[str, SolveFn | None] = {"auto": _auto, "bnb": _bnb, "scip": _scip, "cpsat": _cpsat, "none": None}


def run_solver(name: str, p: np.ndarray, V: np.ndarray, s: int, incumbent: np.ndarray, time_limit: float,
               node_limit: int | None = None, refine_work: float = REFINE_WORK,
               bound_time: float | None = None):
    """Run the solver registered as ``name``; returns ``(SolverResult, note)`` (note: a fallback, or None).

    ``node_limit`` caps bnb's search nodes (scip and cpsat run on time alone; mitm is exact or gives up
    deterministically); ``refine_work`` is bnb's budget for refining a stopped search's lower bound and
    ``bound_time`` that bound's deadline in seconds after the search stops (None: bnb's default).
    """
    solve = SOLVERS.get(name)
    if solve is None:
        raise ValueError(f"unknown solver {name!r}")
    return solve(p, V, s, incumbent, time_limit, node_limit, refine_work, bound_time)


#: the largest --time-limit accepted (seconds; about 31 years)
MAX_TIME_LIMIT = 1e9


@dataclass(frozen=True)
class CertifyOptions:
    """Settings of the certification of one (row, s).

    Attributes
    ----------
    pool_mass : top-mass keys beyond s in the candidate pool (``--pool-mass``).
    pool_error : keys with the largest single-key error in the pool (``--pool-error``).
    solver : a name in ``SOLVERS``: "auto" (mitm on uniform-mass 1-D integer rows, else bnb),
        "bnb", "scip", "cpsat" (falls back to scip on rows that are not integral; ``reason``
        says so) or "none".
    time_limit : seconds per (row, s) for the solver.
    seed : seed of the random selector.
    max_subsets : cap on C(pool, s); above it ``pool_mass``/``pool_error`` are lowered one at a
        time (the larger first) until the enumeration fits (``pool.pool_for``). ``pool_size``
        records the pool used.
    balance_candidates : "all" (every key may swap in) or "pool".
    node_limit : optional cap on bnb's search nodes per (row, s) (``--node-limit``): with it (and a
        time limit not reached first) the statuses and bounds are the same on any machine.
    pool_node_limit : nodes of the pool-restricted bnb that computes ``ES_pool`` where
        ``C(pool, s) > max_subsets`` (``pool.pool_optimum``); unproved within it, the pool is shrunk.
    refine_work : budget, in key-steps (counted, not timed: deterministic), of the refinement of the
        lower bound of a search stopped by its time or node limit (``--refine-work``; bnb only, 0 = the
        frontier bound without refinement). It runs after the limit, so it adds to ``seconds``: the
        default (5e8) is about 1 s per open row at N = 256-1024 on one core, 2e9 about 6-7 s.
    bound_time : seconds that bound may take after a search stopped by its time limit (``--bound-time``;
        bnb only; None = ``max(bnb.BOUND_SHARE * time_limit, bnb.BOUND_MIN)``, and no deadline with
        ``node_limit``, so node-limited runs stay deterministic). The refinement stops at whichever of
        ``refine_work`` and ``bound_time`` comes first: raise both to buy higher bounds for open rows.
    max_memory : bytes one (row, s) may ask of the pool search and the solver (``--max-memory``; None =
        half the machine's RAM, ``default_max_memory``). A row whose estimate (``pool_memory``: the pool's
        dense tables; ``solver_memory``: bnb's dense N x N Gram matrix) is above it is refused with its
        reason: an error, or ``status=invalid`` under ``--skip-invalid``, before any memory is taken.
    """

    pool_mass: int = 12
    pool_error: int = 8
    solver: str = "auto"
    time_limit: float = 10.0
    seed: int = 0
    max_subsets: int = MAX_SUBSETS
    balance_candidates: str = "all"
    node_limit: int | None = None
    pool_node_limit: int = POOL_NODE_LIMIT
    refine_work: float = REFINE_WORK
    bound_time: float | None = None
    max_memory: int | None = None

    def __post_init__(self):
        if self.max_memory is not None and not (isinstance(self.max_memory, int) and self.max_memory >= 1):
            raise InputError(f"--max-memory must be a positive number of bytes, got {self.max_memory!r}")
        if self.solver not in SOLVERS:
            raise InputError(f"--solver must be one of {', '.join(SOLVERS)}, got {self.solver!r}")
        if self.pool_mass < 0:
            raise InputError(f"--pool-mass must be >= 0, got {self.pool_mass}")
        if self.pool_error < 0:
            raise InputError(f"--pool-error must be >= 0, got {self.pool_error}")
        if not self.time_limit > 0 or not math.isfinite(self.time_limit):
            raise InputError(f"--time-limit must be a positive number of seconds, got {self.time_limit}")
        if self.time_limit > MAX_TIME_LIMIT:  # SCIP refuses limits above 1e20; no run needs 30 years
            raise InputError(f"--time-limit {self.time_limit:g} exceeds the largest limit, {MAX_TIME_LIMIT:g} s (about 31 years)")
        if self.max_subsets < 1:
            raise InputError(f"--max-subsets must be >= 1, got {self.max_subsets}")
        if self.node_limit is not None and self.node_limit < 1:
            raise InputError(f"--node-limit must be >= 1, got {self.node_limit}")
        if not (self.refine_work >= 0 and math.isfinite(self.refine_work)):
            raise InputError(f"--refine-work must be a finite number >= 0, got {self.refine_work}")
        if self.bound_time is not None and not (self.bound_time >= 0 and math.isfinite(self.bound_time)):
            raise InputError(f"--bound-time must be a finite number of seconds >= 0, got {self.bound_time}")
        if self.pool_node_limit < 0:
            raise InputError(f"pool_node_limit must be >= 0, got {self.pool_node_limit}")
        if self.balance_candidates not in ("all", "pool"):
            raise InputError(f"balance_candidates must be 'all' or 'pool', got {self.balance_candidates!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def memory_cap(self) -> int:
        """``max_memory`` in bytes, the machine's default when None."""
        return default_max_memory() if self.max_memory is None else int(self.max_memory)

    def memory_problem(self, n: int, d: int, s: int, solver: bool = True) -> str | None:
        """Why a row of N = n keys and d value dims cannot be certified at budget s within ``memory_cap``
        (None: it can): the pool search's estimate (``pool_memory``) and, when ``solver`` (the row reaches
        it: ``row.needs_solver``), the solver's (``solver_memory``). They run one after the other, so the
        larger is the row's."""
        cap = self.memory_cap
        pool = pool_memory(n, d, s, self.pool_mass, self.pool_error, self.max_subsets, self.pool_node_limit)
        need = solver_memory(self.solver, n, d) if solver else 0
        if max(pool, need) <= cap:
            return None
        if need >= pool:
            return (f"solver {self.solver} needs ~{need / 2**30:.3g} GiB for N = {n} (a dense N x N Gram matrix), "
                    f"above --max-memory {cap / 2**30:.3g} GiB; raise --max-memory or use --solver none")
        keys = pool_size_limit(n, s, self.pool_mass, self.pool_error)
        return (f"the candidate pool (up to {keys} keys at s = {s}) needs ~{pool / 2**30:.3g} GiB for N = {n} "
                f"(dense pool x pool tables), above --max-memory {cap / 2**30:.3g} GiB; raise --max-memory, or "
                f"lower --max-subsets, --pool-mass or --pool-error")


def default_max_memory() -> int:
    """Half of the machine's physical memory in bytes (``os.sysconf``), 4 GiB where unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def solver_memory(solver: str, n: int, d: int) -> int:
    """Estimated peak bytes of the solver on one row of N = n keys and d value dims.

    bnb (and auto, which runs bnb on every row it does not hand to mitm) holds the dense N x N
    float64 Gram matrix of the contributions beside a few N x d copies, and the bound of a stopped
    search grows its node store up to ``frontier_bytes(N)`` (counted 1.5 times: a doubling copies the
    old arrays into the new); scip and cpsat build a model
    of O(N d) coefficients; ``none`` solves nothing. The pool search before it is ``pool_memory``.
    """
    if solver == "none":
        return 0
    base = 8 * n * d * 8  # contributions, their rotation and the row's copies (float64)
    if solver in ("auto", "bnb"):
        return base + 8 * n * n + 3 * int(frontier_bytes(n)) // 2
    return base * 4


def pool_memory(n: int, d: int, s: int, pool_mass: int, pool_error: int, max_subsets: int,
                pool_node_limit: int = POOL_NODE_LIMIT) -> int:
    """Estimated peak bytes of the pool search (``pool.pool_optimum``) on one row of N = n keys and d value
    dims at budget s, with a pool of at most P = ``pool.pool_size_limit`` keys.

    Where ``C(P, s) > max_subsets`` the branch and bound restricted to the pool runs first (counted as bnb
    on P keys, ``solver_memory``; not when ``pool_node_limit`` is 0), then the enumeration of a pool shrunk
    to ``C(P', s) <= max_subsets`` (``enumerate.enumerate_bytes``: two dense P' x P' tables). At the
    defaults (P = 28 at s = 8) this is kilobytes; it grows with ``--max-subsets`` at small s (s = 2 and
    a cap of 1e9 allow a pool of 44,721 keys: 30 GiB).
    """
    P = pool_size_limit(n, s, pool_mass, pool_error)
    need = 0
    if math.comb(P, s) > max_subsets:
        need = solver_memory("bnb", P, d) if pool_node_limit > 0 else 0
        lo, hi = s, P  # the largest pool size whose subsets fit (C(s, s) = 1 always does)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if math.comb(mid, s) <= max_subsets else (lo, mid - 1)
        P = lo
    return max(need, enumerate_bytes(n, d, P, s))


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_memory(text: str | None, option: str = "--max-memory") -> int | None:
    """``"8G"``, ``"512MiB"``, ``"1e9"`` -> bytes (binary units); None -> None; bad text -> InputError."""
    if text is None:
        return None
    t = str(text).strip().lower().replace(" ", "")
    num = t.rstrip("kmgtib")
    unit = t[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise InputError(f"{option}: expected a size such as 8G, 512M or 1e9 (bytes), got {text!r}") from None
    if not (math.isfinite(value) and value >= 1):
        raise InputError(f"{option}: must be at least 1 byte, got {text!r}")
    return int(value)


__all__ = ["SOLVERS", "CertifyOptions", "default_max_memory", "parse_memory", "pool_memory", "run_solver",
           "solver_memory"]
