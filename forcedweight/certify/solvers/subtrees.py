"""The branch and bound's search on several threads (``solve_bnb(threads=K)``).

The parts of a depth-first search are independent once they are split off: a node's later siblings
(every set whose first keys are the path's and whose next key is after the node's) need only the
path's sums, the level's candidate list as it stands (its exclusions so far are valid for every
later sibling) and the incumbent. Level 0 is never pruned by reduced costs (its test has no
direction: ``T`` is empty), so its nodes, the first-level subtrees ``T = {k}``, start from the full
list. The threads take the first-level subtrees from a shared counter in the search's order; a thread
left without one takes the later siblings of another thread's shallowest node that has them (work
stealing: the siblings nearest the root are the largest part), at the end of that thread's batch.
Each part runs ``bnb._search`` (Numba, ``nogil``) on its own arrays with a ``floor``: it ends when it
backtracks above the part. Between batches (about 10 ms) a thread publishes a better set and takes
the best value found by any, so a thread prunes with an incumbent at most one batch old (a stale one
only prunes less: every proof stays valid). When the level-0 node ``k`` itself is pruned, no subtree
from ``k`` on can hold a better set (the bounds grow as ``R`` shrinks), so the counter stops there and
the parts inside later subtrees are left. The incumbent phases (kicks, random restarts) are jobs a
thread runs at the end of a batch once the search has visited their node count, its part offered to the
others, which search meanwhile (a search on one thread pauses for them).

Which thread finds which set first depends on timing, so with ``threads > 1`` the nodes visited (and a
bound after a time limit) vary from run to run, while a proved value does not (the optimum, ties to
within ``rel_tol``). ``solve_bnb`` therefore searches on one thread whenever ``node_limit`` is set.

A stopped search is bounded from one path (``frontier.open_bound`` bounds every node after a path in
the depth-first order, and the path's node): every part of the search before the earliest open
path is done, since the counter and the steals hand out parts in that order.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from forcedweight.certify.solvers.node_tests import warm_scratch


WAIT = 0.02  # seconds an idle thread waits for a part before it looks again
FIRST_BATCH = 256  # nodes of a thread's first batch (then sized to about 10 ms, as in the serial search)


def next_batch(budget: int, seconds: float, least: int = 100) -> int:
    """The next batch's nodes: about 10 ms at the last batch's rate (at most doubling), within
    ``[least, 200,000]``. The batches only pause a search, so the nodes visited do not depend on it."""
    return int(min(max(budget * min(2.0, 0.01 / max(seconds, 1e-4)), least), 200_000))


class SearchState:
    """One depth-first search's arrays (``bnb._search``'s): ``pos`` (s+1,), ``L`` (s+1, N), ``Ln``
    (s+1,), ``state`` (5+s,), ``ys`` (s+1, d), ``ws``/``bs`` (s+1,), ``cs`` (s+1, N) (by position in
    ``L``, as ``node_tests``); each level's last direction (``warm_arrays``: kept with the state, so that
    where the batches end does not change the search); and its
    ``floor`` (the shallowest level it may backtrack to; 0 = the whole search)."""

    def __init__(self, N: int, s: int, d: int):
        self.pos = np.zeros(s + 1, dtype=np.int64)
        self.L = np.zeros((s + 1, N), dtype=np.int64)
        self.L[0] = np.arange(N)
        self.Ln = np.zeros(s + 1, dtype=np.int64)
        self.Ln[0] = N
        self.state = np.zeros(5 + s, dtype=np.int64)
        self.ys = np.zeros((s + 1, d))
        self.ws = np.zeros(s + 1)
        self.bs = np.zeros(s + 1)
        self.cs = np.zeros((s + 1, N))
        self.wh, self.wz, self.wc, self.wst = warm_scratch(N, s)
        self.floor = 0

    def at_first_level(self, k: int) -> None:
        """Restart at the level-0 node ``k``, for its subtree only (level 0's arrays are never
        written by the search)."""
        self.pos[:] = 0
        self.pos[0] = k
        self.Ln[0] = self.L.shape[1]
        self.state[:] = 0
        self.wst[:] = 0.0
        self.floor = 1

    def arrays(self):
        return self.pos, self.L, self.Ln, self.state, self.ys, self.ws, self.bs, self.cs

    def warm_arrays(self):
        """``(wh, wz, wc, wst)``: each level's last direction (``node_tests.warm_scratch``)."""
        return self.wh, self.wz, self.wc, self.wst

    def path(self) -> tuple:
        """The keys of the current path, root first: its place in the depth-first order."""
        t = int(self.state[0])
        return tuple(int(self.L[i, self.pos[i]]) if self.pos[i] < self.Ln[i] else self.L.shape[1]
                     for i in range(t + 1))

    def split(self):
        """Hand the later siblings of the shallowest node that has any (at a level from ``floor`` on,
        above the current one) to a new state, which starts at the first of them; this state keeps
        that node's subtree only. None when no level has enough siblings left."""
        t_cur = int(self.state[0])
        s = self.pos.shape[0] - 1
        for t in range(max(self.floor, 1), t_cur):
            left = int(self.Ln[t] - self.pos[t] - 1)
            if left < s - t:  # too few later candidates to complete a set
                continue
            N, d = self.L.shape[1], self.ys.shape[1]
            new = SearchState(N, s, d)
            new.pos[:t] = self.pos[:t]
            new.L[:t] = self.L[:t]
            new.Ln[:t] = self.Ln[:t]
            new.L[t, :left] = self.L[t, self.pos[t] + 1:self.Ln[t]]
            new.Ln[t] = left
            new.ys[:t + 1] = self.ys[:t + 1]
            new.ws[:t + 1] = self.ws[:t + 1]
            new.bs[:t + 1] = self.bs[:t + 1]
            new.cs[:t + 1] = self.cs[:t + 1]
            new.cs[t, :left] = self.cs[t, self.pos[t] + 1:self.Ln[t]]  # by position, as L[t]
            # level t's last direction, which its next test starts from (deeper levels keep their own)
            new.wh[t, :left] = self.wh[t, self.pos[t] + 1:self.Ln[t]]
            new.wz[t] = self.wz[t]
            new.wc[t] = self.wc[t]
            new.wst[t] = self.wst[t]
            new.wst[t, 7] = max(self.wst[t, 7] - (self.pos[t] + 1), 0.0)  # where its sums h end, by position
            new.state[0] = t
            new.floor = t
            self.floor = t + 1
            return new
        return None


def search_subtrees(search, prep, s, rel_tol, kappa, gamma, serial: SearchState, best, bestset, steps, exclude,
                    deadline, threads: int, jobs=()):
    """Go on with ``serial`` (a search stopped between batches) on ``threads`` threads until it is
    complete or ``time.perf_counter() >= deadline``.

    ``search`` is ``bnb._search`` (passed in: bnb imports this module); ``prep = (A, pw, wtop, nrm, G, lo,
    hi, use_box)`` as it takes them; ``best`` (1,)
    and ``bestset`` (s,) are updated in place. The serial search finishes its current first-level
    subtree (less what is stolen from it); the other threads take the later ones. Returns
    ``(done, counts, frontier)``: whether the search is complete; ``counts`` (3 + s,) int64, the
    nodes, leaf evaluations and nodes per level of the whole search (the serial part included); and,
    when not done, the state whose open frontier covers every open node (the earliest open path in
    the depth-first order, or level 0 at the first subtree not started).

    ``jobs``: ``(nodes, fn)`` pairs, in order of ``nodes`` (the incumbent phases, ``bnb``): once the search
    has visited ``nodes`` nodes in all (the serial part's included), the next thread to end a batch inside
    its part offers the part to the others (as a stolen part: one left without work takes it) and calls
    ``fn(set, value)`` with the best set (s,) and its value, then goes on with the part if no one took it,
    else takes another (the others search meanwhile; ``fn`` must release the GIL, as Numba's ``nogil``
    functions do); a returned ``(set, value)`` better than the best is published as a thread's would be.
    Jobs not due before the search ends or times out are not run.

    ``steps``: ``(nref, theta, decay, nwarm)``, the node tests' supergradient steps, their lengths and the
    steps of a test that starts from its level's last direction (``node_tests.search_steps``).
    """
    A, pw, wtop, nrm, G, lo, hi, use_box = prep
    N, d = A.shape
    cond = threading.Condition()
    serial.floor = 1  # it finishes its first-level subtree; the later ones go to the counter
    shared = {"next": int(serial.pos[0]) + 1, "cut": N, "timeout": False, "hungry": 0,
              "nodes": int(serial.state[2])}  # nodes visited in all, for the jobs
    pending = list(jobs)
    handoff = []  # parts split off for idle threads
    counts = np.zeros(3 + s, dtype=np.int64)
    parts = [serial] + [None] * (threads - 1)  # each thread's part (None: idle)

    def add_counts(st: SearchState) -> None:
        counts[0] += st.state[2]
        counts[1] += st.state[3]
        counts[2:] += st.state[4:]
        st.state[2:] = 0

    def take(i: int) -> bool:
        """Give thread i a part (called with cond held); False when there is none left."""
        while not shared["timeout"]:
            if parts[i] is not None:
                return True
            if shared["next"] < shared["cut"]:
                st = SearchState(N, s, d)
                st.at_first_level(shared["next"])
                shared["next"] += 1
                parts[i] = st
            elif handoff:
                parts[i] = handoff.pop()
            elif all(p is None for p in parts):
                cond.notify_all()
                return False
            else:
                shared["hungry"] += 1
                cond.wait(WAIT)
                shared["hungry"] -= 1
        return False

    def work(i: int) -> None:
        own_best = best.copy()
        own_set = bestset.copy()
        budget = FIRST_BATCH
        while True:
            with cond:
                if not take(i):
                    return
                st = parts[i]
                own_best[0] = min(own_best[0], best[0])
            tb = time.perf_counter()
            n0 = int(st.state[2])
            search(A, pw, wtop, nrm, G, lo, hi, use_box, s, rel_tol, kappa, gamma, *st.arrays(), *st.warm_arrays(),
                    own_best, own_set, budget, *steps, exclude, st.floor)
            now = time.perf_counter()
            job = None
            with cond:
                shared["nodes"] += int(st.state[2]) - n0
                if own_best[0] < best[0]:
                    best[0] = own_best[0]
                    bestset[:] = own_set
                k = int(st.pos[0])
                if st.state[1] == 1:  # the level-0 node k was pruned: so is every later one
                    shared["cut"] = min(shared["cut"], k)
                if st.state[1] != 0 or k > shared["cut"]:
                    add_counts(st)
                    parts[i] = None
                elif shared["hungry"] > len(handoff) and shared["next"] >= shared["cut"]:
                    new = st.split()
                    if new is not None:
                        handoff.append(new)
                        cond.notify()
                if now >= deadline:
                    shared["timeout"] = True
                    cond.notify_all()
                elif parts[i] is st and pending and shared["nodes"] >= pending[0][0]:
                    job = pending.pop(0)[1]  # (only inside an open part: the search is not over)
                    start, value = bestset.copy(), float(best[0])
                    handoff.append(st)  # the part goes on meanwhile, on any thread
                    parts[i] = None
                    cond.notify()
            if job is not None:
                found = job(start, value)
                with cond:
                    if found is not None and found[1] < best[0]:
                        best[0] = found[1]
                        bestset[:] = found[0]
                    if any(part is st for part in handoff):  # no one took it: go on with it (parts stay in order)
                        handoff.remove(st)
                        parts[i] = st
            if parts[i] is st:  # a batch cut short by its part's end says nothing of the node rate
                budget = next_batch(budget, now - tb, min(100, FIRST_BATCH))

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    open_ = [st for st in parts + handoff if st is not None]
    for st in open_:
        add_counts(st)
    open_ = [st for st in open_ if int(st.pos[0]) <= shared["cut"]]
    if open_:
        return False, counts, min(open_, key=SearchState.path)
    if shared["next"] >= shared["cut"]:
        return True, counts, None
    frontier = SearchState(N, s, d)
    frontier.at_first_level(shared["next"])
    return False, counts, frontier
