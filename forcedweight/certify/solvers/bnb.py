"""Exact depth-first branch and bound over all N keys (docs/enumerate.md), in Numba.

Keys are taken in the search's order (``search_order``: contribution norms ``||a_i||``,
descending; masses break ties). A node is a partial set ``T`` (``y_T = sum_T a_i``,
``w_T = p(T)``) plus the keys ``R`` after the last decided position, from which ``r = s - |T|``
keys remain to be chosen. With ``lam = best * (1 - rel_tol)`` a node is pruned when no completion
``S`` can have ``E(S) = ||y_S|| / w_S < lam``, by any of:

* mass: ``w_S <= w_max = w_T + (the r largest masses from R's first key on)``; if ``w_max = 0``
  every completion has ``E = inf``.
* box: in a fixed orthonormal basis (principal axes of ``A``), coordinate j of ``y_S`` lies in
  ``[y_Tj + (sum of the r smallest a_kj in R), y_Tj + (sum of the r largest)]``, so
  ``||y_S|| >= dist(0, box)`` and ``E(S) >= dist(0, box) / w_max``.
* projection (a linear test, exact for the ratio): for the unit vector ``u = y_T / ||y_T||``,
  ``||y_S|| >= <y_S, u>``, so ``E(S) >= lam`` for every completion when
  ``<y_T, u> - lam w_T + (sum of the r smallest (<a_k, u> - lam p_k) over R) >= 0``.
  This is the bound of docs/enumerate.md ``||y_S|| >= ||y_T|| + (sum of the r smallest <y_T, a_k>) / ||y_T||``
  with the mass folded into the same sum, hence never weaker than dividing by ``w_max``.
  The test is valid for *any* unit vector u, and its value is concave in u with supergradient
  ``y_T + sum_Z a_z`` (Z the minimising completion). When it fails, up to ``NREF = 8``
  (``NREF_LONG = 16`` on rows of ``LONG_ROWS = 2,048`` keys or more) supergradient steps
  (lengths THETA / sqrt(j); THETA_LONG / j**DECAY_LONG on those long rows) improve u; u stays a
  combination of ``y_T`` and the ``a_z`` met so far, ``sum_z c_z <a_z, a_k>`` is accumulated from Gram
  rows step by step and ``||v||``, ``<v, y_T>`` come from Gram entries with a rounding margin (a step
  costs r |R| + r^2, no d-vector). On real SmolLM2 rows this cut the nodes 2-9x against 2 steps and
  the wall time 1.3-3x on hard rows (the first pruning success ends the steps). On the long rows a test
  starts from the direction its level's last test ended with (siblings share T; ``WARM_STEPS = 4`` steps
  then; ``node_tests.warm_scratch``, kept in the search's state): 1.16-1.28x faster on N ~ 4,096 rows.
  The scans for the r smallest stop early once no later key (smaller norm) can enter them
  (``node_tests._node_lb_ok``; the same keys and sums as a full scan), and so do the leaves.

Why norm order: a key's reduced cost ``<a_k, u> - lam p_k`` is at least ``-||a_k|| - lam p_k``, so
the keys that can enter a node's r smallest, or survive its exclusion, are the large-norm ones.
Searching them first makes every scan stop sooner, and the keys that decide a node come first in
its candidate list. Against mass order (the order before) on 8 hard real SmolLM2 rows of N ~ 1,000
proved from their optimum, one core: 1.2-28x fewer nodes and 1.5-23x less time (row 6874: 10,289
nodes and 0.39 s against 288,349 and 9.0 s; BENCHMARKS.md, issue 15). Every test is order-free: they
bound over the keys from a node's first candidate on (suffix maxima of norms and masses, box sums).

The tests live in ``node_tests`` (``_node_lb_ok``, and ``_node_value``, their bisection bound); the
proved bound of a search stopped by the time or node limit, over its open frontier, in ``frontier``.

Before the search the incumbent is polished by best-improvement 1-swaps over all keys
(``core.swaps.swap_search``; only the incumbent moves: no proof depends on it).

All three bounds only grow as ``R`` shrinks, so once the node "next key = k" is pruned, every
later k at that depth is too (in any order). Inner products ``<y_T, a_k>`` come from the Gram matrix and are
corrected by a rigorous rounding margin; leaves are checked by a Gram lower end and then evaluated
directly in float64. ``proved`` means: no kept set has ``E < value * (1 - rel_tol)``
(``rel_tol = 1e-9``; ``SolverResult.tolerance = rel_tol * value``).
"""

from __future__ import annotations

import functools
import time

import numpy as np
from numba import njit

from forcedweight.core import operator as op
from forcedweight.core.kick_search import (KICK_AFTER, KICK_SIZE, KICK_WORK, RESTART_AFTER, RESTART_GROWTH,
                                           RESTART_PHASES, RESTART_WINDOW, kick_search, multistart_search)
from forcedweight.core.swaps import swap_search
from forcedweight.certify.solvers.bounds import RELAX_ITERS
from forcedweight.certify.solvers.frontier import REFINE_STATS, REFINE_WORK, first_level_bound, open_bound
from forcedweight.certify.solvers import node_tests
from forcedweight.certify.solvers.node_tests import SAFE, _exclude, _node_lb_ok, node_scratch, search_steps
from forcedweight.certify.solvers.result import SolverResult
from forcedweight.certify.solvers.search_row import contributions, prepare
from forcedweight.certify.solvers.subtrees import SearchState, next_batch, search_subtrees
from forcedweight.certify.solvers.lp_bound import TAIL_LPS

REL_TOL = 1e-9
POLISH_ROUNDS = 50  # most best-improvement 1-swaps on the incumbent
BOUND_ITERS = 12  # bisection steps of an open node's bound (relative precision 2**-12 of its cap; 30 before:
# with the bound's deadline, 12 steps bound more nodes in the time: on 19 open rows, N ~ 900-4,100, the
# row's bound rose on 6 and fell on none; BENCHMARKS.md, issue 15)
BOUND_SHARE = 0.2  # a search stopped by its time limit spends at most this share of it more on its bound
BOUND_MIN = 2.0  # ... but never less than this many seconds (at the main job's 2 s limit a share of 0.4 s left
# 5 of 18 open rows of N ~ 120-220 at bound 0, against 0 of 15 with no deadline; BENCHMARKS.md, issue 15)


def _set_error(A, pw, S) -> float:
    """``E(S) = ||sum_S a_i|| / p(S)`` from contributions ``A`` (N, d) and masses ``pw`` (N,) (any
    order; inf when the kept mass is 0). Direct, not by complements: ``A`` may be a pool's."""
    w = pw[S].sum()
    return float(np.linalg.norm(A[S].sum(axis=0)) / w) if w > 0 else np.inf

@njit(cache=True, nogil=True)
def _search(A, pw, wtop, nrm, G, lo, hi, use_box, s, rel_tol, kappa, gamma, pos, L, Ln, state, ys, ws, bs,
            cs, wh, wz, wc, wst, best, bestset, budget, nref, theta, decay, nwarm, exclude, floor):
    """Resumable DFS over candidate lists. Level t's candidates are ``L[t, :Ln[t]]`` and its node is
    ``pos[t]`` (the next key ``L[t, pos[t]]``); state = [t, done, nodes, leaves, nodes per level...];
    best = [E_best]. Returns after ``budget`` nodes. ``done`` is 1 when the search is complete, 2 when
    it backtracks to a level below ``floor`` (the subtree of its node at level ``floor - 1`` is
    complete, or the siblings it was given at level ``floor``: ``subtrees`` hands threads such parts;
    0 = the whole search). ``wh, wz, wc, wst``: each level's last direction (``SearchState.warm_arrays``),
    which its next test starts from when ``nwarm > 0`` (``node_tests.search_steps``)."""
    N, d = A.shape
    kt, buf, bidx, _, _, _, _, dirn, gc, gk = node_scratch(nrm, pw, wtop, s, nref)  # (h, zs, zc: wh, wz, wc)
    t = state[0]
    nodes = 0
    while nodes < budget:
        nodes += 1
        p0 = pos[t]
        state[4 + t] += 1
        lam = best[0] * (1.0 - rel_tol)
        r = s - t
        Lt = L[t]
        ok = _node_lb_ok(t, Lt, p0, Ln[t], s, A, pw, nrm, G, ys, ws, bs, cs, lo, hi, use_box, lam, gamma, kt,
                         wtop, buf, bidx, wh[t], wz[t], wc[t], nref, theta, decay, dirn, gc, gk, nwarm, wst[t])
        if ok and r == 1:
            # leaves: every last key in R
            n2T = 0.0
            for q in range(d):
                n2T += ys[t, q] * ys[t, q]
            nyT = np.sqrt(n2T) * (1.0 - SAFE)
            for i in range(p0, Ln[t]):
                kk = Lt[i]
                # no later leaf can beat best: ||y_T + a|| >= ||y_T|| - mx[kk], w <= w_T + wtop[kk, 1]
                # (kt[kk, 0], kt[kk, 1])
                if nyT - kt[kk, 0] * (1.0 + SAFE) > best[0] * (ws[t] + kt[kk, 1]) * (1.0 + SAFE):
                    break
                wv = ws[t] + pw[kk]
                if wv <= 0.0:
                    continue
                bv = bs[t] + nrm[kk]
                lam = best[0] * (1.0 - rel_tol)
                n2 = n2T + 2.0 * cs[t, i] + G[kk, kk]
                if n2 - kappa * bv * bv < (lam * wv) * (lam * wv):
                    acc = 0.0
                    for q in range(d):
                        y = ys[t, q] + A[kk, q]
                        acc += y * y
                    e = np.sqrt(acc) / wv
                    state[3] += 1
                    if e < best[0]:
                        best[0] = e
                        for i2 in range(t):
                            bestset[i2] = L[i2, pos[i2]]
                        bestset[t] = kk
            ok = False
        if ok and r >= 2 and exclude:
            # reduced-cost exclusion: candidates no improving completion can hold leave this level's
            # list (this subtree and every later sibling); then re-test if the next key itself left
            k = Lt[p0]
            Ln[t] = _exclude(t, Lt, p0, Ln[t], s, ws, cs, lam, kt, buf, bidx, wh[t], dirn, gc, wst[t])
            if Ln[t] - p0 < r:
                ok = False
            elif Lt[p0] != k:
                continue
        if ok:
            # include the next key: push level t + 1 with the later candidates
            k = Lt[p0]
            for q in range(d):
                ys[t + 1, q] = ys[t, q] + A[k, q]
            ws[t + 1] = ws[t] + pw[k]
            bs[t + 1] = bs[t] + nrm[k]
            m = 0
            for i in range(p0 + 1, Ln[t]):
                kk = Lt[i]
                L[t + 1, m] = kk
                cs[t + 1, m] = cs[t, i] + G[k, kk]
                m += 1
            Ln[t + 1] = m
            t += 1
            pos[t] = 0
            wst[t, 0] = 0.0  # a new T at this level: no direction to start from
            continue
        # pruned or exhausted: back to the parent's next candidate
        t -= 1
        if t < 0:
            state[1] = 1
            break
        if t < floor:
            state[1] = 2
            break
        pos[t] += 1
    state[0] = max(t, 0)
    state[2] += nodes


def solve_bnb(p, V, s: int, incumbent=None, time_limit: float = 10.0,
              rel_tol: float = REL_TOL, polish: bool = True, node_limit: int | None = None,
              A=None, relax_iters: int = RELAX_ITERS, refine_work: float = REFINE_WORK,
              kick_work: float = KICK_WORK, tail_lps: int = TAIL_LPS, exclude: bool = True,
              bound_time: float | None = None, threads: int = 1) -> SolverResult:
    """Exact ES(s) over all N keys by depth-first branch and bound.

    Parameters
    ----------
    p : (N,) float64 weights; V : (N, d) values; s : 1 <= s <= N.
    incumbent : optional (s,) key indices of a known good set (warm start; default top-mass).
    time_limit : seconds (checked between batches of nodes).
    rel_tol : a node is pruned when its bound is >= best * (1 - rel_tol).
    polish : first improve the incumbent by best-improvement 1-swaps over all keys; and when the
        search is not done after ``kick_search.KICK_AFTER`` nodes, by ``kick_work`` pair
        evaluations of random kicks and 1-swap descents, and after ``RESTART_AFTER * RESTART_GROWTH**j``
        nodes (j = 0, 1, ...) by random restarts from seed j (``core.kick_search``; 0 = off).
    node_limit : optional cap on the search nodes (deterministic: the same stop, statuses and
        bounds on any machine, when ``time_limit`` is not reached first).
    A : optional (N, d) centred contributions ``a_i = p_i (v_i - mu)`` to use instead of
        ``operator.centred_contributions(p, V)``: with the rows of a key subset (a pool) and the
        ``mu`` of the FULL row, the search is the exact optimum over that subset
        (``E(S) = ||sum_S a_i|| / p(S)``; ``V`` is then unused and ``value`` is computed from A).
    relax_iters : FISTA steps of the relaxation bound (``bounds.relax_bound``) on the open nodes
        of a stopped search whose tests prove less (0 = off; only the bound changes, not the search;
        none on rows of ``node_tests.LONG_ROWS`` keys or more, ``bound_relax_iters``).
    refine_work : budget (key-steps) of the best-first refinement of the open frontier's bound
        (``frontier._refine``: the node with the smallest bound gets its full bound, then is split
        into its children; 0 = off; only the bound of a stopped search changes, not the search).
    tail_lps : linear programs tried for the tail node of a stopped search (all sets of the last keys
        of the search order under one bound, ``lp_bound.choose_tail``; 0 = off; only the bound changes).
    exclude : drop candidates by reduced costs at every node that passes its tests
        (``node_tests._exclude``; False = the plain search over key ranges, for comparison).
    bound_time : seconds the proved bound of a stopped search may take after it (first-level pass,
        LPs and refinement end where they stand: ``frontier.open_bound``'s deadline). Default
        ``max(BOUND_SHARE * time_limit, BOUND_MIN)`` (2 s at limits up to 10 s), so an open row takes
        at most about 1.2x a 10 s limit (at N ~ 4,096 the key-step budgets alone took 2-6x) and short
        rows keep the seconds their refinement needs; with ``node_limit`` the default is no
        deadline, so a node-limited result (bound included) is the same on any machine.
    threads : threads of the search from the first incumbent phase on (``KICK_AFTER`` nodes; from the
        start without phases): the first-level subtrees are independent (``subtrees``), and the
        incumbent phases run on one of the threads beside the others' search instead of pausing it.
        Above 1 the nodes visited depend on timing; a proved value does not. Ignored (one thread)
        with ``node_limit``, so node-limited results stay deterministic.

    Returns
    -------
    SolverResult(solver="bnb"): ``proved`` when the search completed; otherwise
    ``lower_bound`` is a proved bound over the open frontier (``frontier.open_bound``; <= value), > 0
    wherever the first-level pass's bound (``root_bound(..., refine_work=0)``) is.
    """
    t0 = time.perf_counter()
    if node_limit is not None and node_limit < 1:
        raise ValueError(f"node_limit must be >= 1, got {node_limit}")
    external = A is not None
    p, V, A_keys = contributions(p, V, s, A)
    N = p.shape[0]

    start = op.top_mass_set(p, s) if incumbent is None else op.as_index(incumbent, N)
    if start.size != s:
        raise ValueError(f"incumbent has {start.size} keys, expected s = {s}")
    if s == N:
        S = np.arange(N, dtype=np.int64)
        v = _set_error(A_keys, p, S) if external else 0.0
        return SolverResult(v, S, v, True, "bnb", time.perf_counter() - t0, 0.0, {"nodes": 0})
    row = prepare(A_keys, p, s)
    order, rank = row.order, row.rank
    A, pw, nrm, G, lo, hi, use_box, kappa, gamma, wtop = row[:10]
    inc = np.sort(rank[start])
    e_start = _set_error(A, pw, inc)
    # (the 1-swap search values sets by complements, exact only for a whole row's contributions)
    if polish and s < N and not external:
        polished, _ = swap_search(p, V, start, max_swaps=POLISH_ROUNDS, A=A_keys)
        inc = np.sort(rank[polished])
    e_inc = _set_error(A, pw, inc)
    best = np.array([e_inc])
    bestset = inc.copy()  # the search overwrites it whenever it beats best
    # pos: each level's node (its position in the level's list); L: each level's candidate keys
    # (level 0: all); state: t, done, nodes, leaf evals, nodes per level
    search = SearchState(N, s, A.shape[1])
    pos, L, Ln, state, ys, ws, bs, cs = search.arrays()
    warm = search.warm_arrays()
    threads = 1 if node_limit is not None else max(1, int(threads))
    steps = search_steps(N)
    budget = 256
    deadline = t0 + time_limit
    # incumbent phases, at node counts where a batch ends exactly (node-limited runs stay
    # deterministic): kicks from the best set after KICK_AFTER nodes, then random restarts (and
    # kicks from their best when it is better) after RESTART_AFTER, and again with seed j after
    # RESTART_AFTER * RESTART_GROWTH**j; rows proved before never pay.
    # On one thread they pause the search; on several they run beside it (subtrees' jobs)
    # (phases: (nodes, restarts, seed))
    phases = ([(KICK_AFTER, False, 0)]
              + [(RESTART_AFTER * RESTART_GROWTH ** j, True, j) for j in range(RESTART_PHASES)]
              if polish and kick_work > 0 else [])
    gains = {"kick": None, "restart": None}

    def phase(restarts, seed, start_set, best_value):
        found, e_found, gain, r_gain = _incumbent_phase(A, pw, G, s, float(kick_work), restarts, seed,
                                                        start_set, best_value)
        if r_gain is not None:
            gains["restart"] = r_gain or bool(gains["restart"])
        if gain is not None:
            gains["kick"] = gain or bool(gains["kick"])
        return (found, e_found) if gain else None

    while True:
        if node_limit is not None:
            budget = min(budget, node_limit - int(state[2]))
        if phases and phases[0][0] > int(state[2]):
            budget = min(budget, phases[0][0] - int(state[2]))
        elif phases and threads == 1:
            # the search is not done: a better incumbent only prunes more (the search resumes
            # where it stopped)
            found = phase(*phases.pop(0)[1:], bestset.astype(np.int64), best[0])
            if found is not None:
                best[0] = found[1]
                bestset[:] = found[0]
            continue
        elif threads > 1:
            # the later first-level subtrees go to several threads, and the incumbent phases left run on one
            # of them beside the search
            jobs = [(after, functools.partial(phase, restarts, seed)) for after, restarts, seed in phases]
            done, counts, frontier = search_subtrees(_search, row.search_arrays, s, rel_tol,
                                                     kappa, gamma, search, best, bestset, steps,
                                                     exclude, deadline, threads, jobs)
            if frontier is not None:
                search = frontier
                pos, L, Ln, state, ys, ws, bs, cs = search.arrays()
                warm = search.warm_arrays()
            state[1] = int(done)
            state[2] = counts[0]
            state[3] = counts[1]
            state[4:] = counts[2:]
            break
        tb = time.perf_counter()
        _search(A, pw, wtop, nrm, G, lo, hi, use_box, s, rel_tol, kappa, gamma, pos, L, Ln, state, ys, ws, bs,
                cs, *warm, best, bestset, budget, *steps, exclude, 0)
        now = time.perf_counter()
        if state[1] or now >= deadline or (node_limit is not None and state[2] >= node_limit):
            break
        # aim at ~10 ms per batch (the batches only pause the search: the nodes visited, and so
        # a node-limited result, do not depend on them)
        budget = next_batch(budget, now - tb)
    S = np.sort(order[bestset])
    value = _set_error(A_keys, p, S) if external else op.forced_error(p, V, S)
    proved = bool(state[1])
    if proved:
        lb = value
    else:
        refine = np.zeros(len(REFINE_STATS), dtype=np.int64)
        # the frontier is bounded over key ranges: level t's open nodes take every key after its
        # current one (a superset of its remaining candidates), with full Gram sums for the path
        # (by key: the search kept cs by position in its lists, the frontier's range nodes take the
        # list arange(N), whose positions are keys; cs[0] is 0 either way)
        t_cur = int(state[0])
        idx = np.array([L[t, pos[t]] if pos[t] < Ln[t] else N for t in range(s + 1)], dtype=np.int64)
        for t in range(t_cur):
            cs[t + 1] = cs[t] + G[idx[t]]
        if bound_time is None:
            bound_time = np.inf if node_limit is not None else max(BOUND_SHARE * time_limit, BOUND_MIN)
        deadline = time.perf_counter() + float(bound_time)
        relax = bound_relax_iters(N, int(relax_iters))
        lb = float(open_bound(A, pw, wtop, nrm, G, lo, hi, use_box, s, idx, t_cur, ys, ws,
                              bs, cs, best[0], gamma, BOUND_ITERS, relax, float(refine_work), refine,
                              int(tail_lps), deadline))
        lb = min(max(lb, 0.0), value)
    info = {"nodes": int(state[2]), "refine": None if proved else dict(zip(REFINE_STATS, refine.tolist())), "leaf_evals": int(state[3]), "box_bound": bool(use_box),
            "polished": bool(e_inc < e_start), "level_nodes": state[4:].tolist(),
            "kick_improved": gains["kick"], "restart_improved": gains["restart"],
            "bound_time": None if proved else float(bound_time),
            "stopped_by": None if proved else ("nodes" if node_limit is not None and state[2] >= node_limit else "time")}
    return SolverResult(value, S, lb, proved, "bnb", time.perf_counter() - t0,
                        rel_tol * value, info)


def _incumbent_phase(A, pw, G, s, work, restarts, seed, start_set, best_value):
    """One incumbent phase of the search (arrays in its order, as ``_search``'s): ``work`` pair evaluations
    of kicks from ``start_set`` (s,), the best set so far; with ``restarts``, first random restarts (uniform
    starts, then starts among keys of comparable mass, ``work`` each), kicked from their best only when it
    beats ``best_value``; every random draw from ``seed``. Returns ``(found, value, kick_gain,
    restart_gain)``: the kicks' set (s,) and its E (None, inf when they did not run), and whether the kicks /
    the restarts beat ``best_value`` (None when they did not run)."""
    restart_gain = None
    if restarts:
        restart = multistart_search(A, pw, G, s, work, seed)
        e_restart = _set_error(A, pw, restart)
        windowed = multistart_search(A, pw, G, s, work, seed, RESTART_WINDOW * s)
        e_windowed = _set_error(A, pw, windowed)
        if e_windowed < e_restart:
            restart, e_restart = windowed, e_windowed
        restart_gain = bool(e_restart < best_value)
        if not restart_gain:
            return None, np.inf, None, False
        start_set = restart
    kicked = kick_search(A, pw, G, start_set, work, KICK_SIZE, seed)
    e_kick = _set_error(A, pw, kicked)
    return kicked, e_kick, bool(e_kick < best_value), restart_gain


def root_bound(p, V, s: int, A=None, relax_iters: int = RELAX_ITERS, refine_work: float = REFINE_WORK) -> float:
    """The proved bound of the search before any node: min over the first-level nodes ``{k}``, then
    ``refine_work`` key-steps of refinement (``frontier.first_level_bound``; no deadline).

    ``solve_bnb``'s ``lower_bound`` on a stopped search is > 0 wherever this bound with ``refine_work=0``
    (the first-level pass alone) is, deadline or not; with refinement this bound can be > 0 where a
    timed search's is not (its refinement ends at ``bound_time``: a layer-0 row of N = 3,969 took 12.9 s
    here). Arrays as in ``solve_bnb``; returns a float in ``[0, E(top-mass polished)]`` (capped by the
    top-mass set).
    """
    p, V, A_keys = contributions(p, V, s, A)
    row = prepare(A_keys, p, s)
    top = op.top_mass_set(p, s)
    e_top = _set_error(A_keys, p, top)
    if s == p.shape[0]:
        return e_top
    relax = bound_relax_iters(p.shape[0], int(relax_iters))
    return float(first_level_bound(*row.search_arrays, s, 0, e_top, row.gamma, BOUND_ITERS, relax, float(refine_work),
                                   np.zeros(len(REFINE_STATS), dtype=np.int64)))


def bound_relax_iters(n_keys: int, relax_iters: int) -> int:
    """The relaxation steps of a stopped search's bound (``frontier.open_bound``: the first-level pass, the path
    nodes and the refinement; ``root_bound`` alike) on a row of ``n_keys`` keys: ``relax_iters`` below
    ``node_tests.LONG_ROWS`` keys (the long rows of ``search_steps`` too), 0 (tests and splits only) from there on.

    A relaxation step costs O((N - k) d) key-steps, so on long rows the default budget bought 1-4 relaxed
    nodes and no split, leaving the bound where the first-level pass had it; without the relaxation the same
    budget splits 10-140 nodes (tests with early-stopped scans). On 18 open rows of N ~ 3,400-7,750
    (BENCHMARKS.md, issue 15) the bound rose on 8 and fell on none. In the first-level pass the quick
    relaxation took two thirds of the pass (two N ~ 3,400-4,000 rows: 9.4 s against 3.2 s and 2.0 s against 0.9 s)
    and left the same first-level nodes at 0, so it is off there too. Below LONG_ROWS the relaxation is kept
    (on layer-0 rows of N ~ 230 the bound fell without it).
    """
    return int(relax_iters) if n_keys < node_tests.LONG_ROWS else 0
