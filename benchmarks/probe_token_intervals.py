"""A probe, not a proof: does a search over tokens, a fixed token's mass an interval over its copies, refute
``E(S) < lam`` on a layer-0 row with fewer nodes than over keys?

    .venv/bin/python benchmarks/probe_token_intervals.py --real DUMP --rows 5 --value 0.0283 \\
        [--fractions 0.000244,1] [--node-cap 300000] [--one-copy]

Tokens are the row's distinct value rows (``bench_token_instances.py``), ``u_tau = v_tau - mu``, ordered by
their heaviest copy. Depth first: a node fixes tokens with counts ``c`` (its mass anywhere in [sum of the c
lightest, sum of the c heaviest copies]) and chooses ``r`` more keys among the copies of later tokens. The
node is refuted at ``lam`` when for a unit ``g`` (16 supergradient steps from the fixed tokens' direction)
``sum_fixed min(lo (<g, u> - lam), hi (<g, u> - lam)) + (the r smallest p_i (<g, u_tau(i)> - lam)) >= 0``;
a node that is not has its children screened at its own ``g`` in one sweep (reduced costs) and the rest
tested; a leaf (all s keys fixed) enumerates its copies. ``lam`` is ``--value`` times each of
``--fractions``. ``--one-copy`` keeps each token's heaviest copy only (the ``heaviest`` instance, where the
masses are exact). No rounding margins and no tuning: it counts nodes, it proves nothing. Output: a JSON
line per ``lam``: refuted (the whole tree), nodes tested and screened out by depth, seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from numba import njit

from bench_token_instances import value_tokens
from forcedweight.certify.solvers.node_tests import _insert
from forcedweight.core.operator import centred_contributions
from forcedweight.rows import rows_by_id


@njit(cache=True)
def _fixed_part(g, lam, U, ft, flo, fhi, nf, ystar):
    """sum over the fixed tokens of min over their mass of m (<g, u> - lam); the minimiser's y into ystar."""
    d = U.shape[1]
    ystar[:] = 0.0
    val = 0.0
    for f in range(nf):
        c = np.dot(g, U[ft[f]]) - lam
        m = flo[f] if c >= 0.0 else fhi[f]
        val += m * c
        ystar += m * U[ft[f]]
    return val


@njit(cache=True)
def _phi(g, lam, U, ft, flo, fhi, nf, start, cop_p, cop_ptr, r, ystar):
    """The test's value at g, its minimiser's y into ystar (inf when fewer than r keys are left)."""
    T = U.shape[0]
    val = _fixed_part(g, lam, U, ft, flo, fhi, nf, ystar)
    if r == 0:
        return val
    bv = np.empty(r)
    bi = np.zeros(r, np.int64)  # the copies kept (their token: the cop_ptr interval holding them)
    n = 0
    for tau in range(start, T):
        c = np.dot(g, U[tau]) - lam
        a, b = cop_ptr[tau], cop_ptr[tau + 1]
        lo_i, hi_i = (a, min(b, a + r)) if c < 0.0 else (max(a, b - r), b)  # copies by mass, heaviest first
        for i in range(lo_i, hi_i):
            n = _insert(cop_p[i] * c, i, n, r, bv, bi)
    if n < r:
        return np.inf
    for j in range(r):
        val += bv[j]
        ystar += cop_p[bi[j]] * U[np.searchsorted(cop_ptr, bi[j], side="right") - 1]
    return val


@njit(cache=True)
def _refuted(g, lam, U, ft, flo, fhi, nf, start, cop_p, cop_ptr, r, steps, theta, ystar):
    """Supergradient ascent on the unit g (in place); True when some step's value is >= 0."""
    for it in range(steps + 1):
        if _phi(g, lam, U, ft, flo, fhi, nf, start, cop_p, cop_ptr, r, ystar) >= 0.0:
            return True
        ny = np.sqrt(np.dot(ystar, ystar))
        if it == steps or ny == 0.0:
            return False
        g += theta / np.sqrt(it + 1.0) * ystar / ny
        ng = np.sqrt(np.dot(g, g))
        if ng == 0.0:
            return False
        g /= ng
    return False


@njit(cache=True)
def _screen(g, lam, U, ft, flo, fhi, nf, start, cop_p, cop_ptr, r, ok, S):
    """ok[tau, c] = the child (tau, c) is refuted at g: one backward sweep, S[j, k] = the k smallest key
    values among the tokens >= j."""
    T = U.shape[0]
    ystar = np.zeros(U.shape[1])
    base = _fixed_part(g, lam, U, ft, flo, fhi, nf, ystar)
    bv = np.full(r, np.inf)  # the r smallest so far (inf: none yet; S reads all r)
    bi = np.zeros(r, np.int64)
    n = 0
    S[T, 0] = 0.0
    S[T, 1:r + 1] = np.inf
    for tau in range(T - 1, start - 1, -1):
        c = np.dot(g, U[tau]) - lam
        a, b = cop_ptr[tau], cop_ptr[tau + 1]
        for cc in range(1, r + 1):
            ok[tau, cc] = True
            if cc <= b - a:
                hi = cop_p[a:a + cc].sum()
                lo = cop_p[b - cc:b].sum()
                ok[tau, cc] = base + (lo * c if c >= 0.0 else hi * c) + S[tau + 1, r - cc] >= 0.0
        lo_i, hi_i = (a, min(b, a + r)) if c < 0.0 else (max(a, b - r), b)
        for i in range(lo_i, hi_i):
            n = _insert(cop_p[i] * c, i, n, r, bv, bi)
        S[tau, 0] = 0.0
        for k in range(1, r + 1):
            S[tau, k] = S[tau, k - 1] + bv[k - 1]


@njit(cache=True)
def _leaf_below(U, ft, fc, nf, cop_p, cop_ptr, lam):
    """Whether some choice of the fixed tokens' copies (counts fc) has E < lam (True also when a token has
    more than 12 copies: not enumerated, the leaf counts as not refuted)."""
    d = U.shape[1]
    sums = np.zeros((nf, 4096))
    sizes = np.zeros(nf, np.int64)
    for f in range(nf):
        a, n = cop_ptr[ft[f]], cop_ptr[ft[f] + 1] - cop_ptr[ft[f]]
        if n > 12:
            return True
        for mask in range(1 << n):
            cnt, tot = 0, 0.0
            for bit in range(n):
                if mask >> bit & 1:
                    cnt += 1
                    tot += cop_p[a + bit]
            if cnt == fc[f]:
                sums[f, sizes[f]] = tot
                sizes[f] += 1
    idx = np.zeros(nf, np.int64)
    while True:
        y = np.zeros(d)
        w = 0.0
        for f in range(nf):
            w += sums[f, idx[f]]
            y += sums[f, idx[f]] * U[ft[f]]
        if w > 0.0 and np.sqrt(np.dot(y, y)) < lam * w:
            return True
        f = 0
        while f < nf:
            idx[f] += 1
            if idx[f] < sizes[f]:
                break
            idx[f] = 0
            f += 1
        if f == nf:
            return False


@njit(cache=True)
def token_search(lam, U, cop_p, cop_ptr, s, steps, theta, node_cap, stats):
    """Depth-first refutation of E < lam over tokens (module docstring). stats: [nodes, leaves, capped,
    a leaf below lam, tested by depth (s), screened out by depth (s)]. True when the whole tree is refuted."""
    T, d = U.shape
    ft, fc = np.zeros(s, np.int64), np.zeros(s, np.int64)
    flo, fhi = np.zeros(s), np.zeros(s)
    nxt, cnt, used = np.zeros(s + 1, np.int64), np.ones(s + 1, np.int64), np.zeros(s + 1, np.int64)
    ok = np.zeros((s + 1, T, s + 1), np.bool_)
    S = np.zeros((T + 1, s + 1))
    ystar, g = np.zeros(d), np.zeros(d)
    g[0] = 1.0
    _screen(g, lam, U, ft, flo, fhi, 0, 0, cop_p, cop_ptr, s, ok[0], S)
    depth = 0
    while depth >= 0:
        if stats[0] >= node_cap:
            stats[2] = 1
            return False
        tau, c, r_left = nxt[depth], cnt[depth], s - used[depth]
        if tau >= T:
            depth -= 1
            if depth >= 0:
                cnt[depth] += 1
            continue
        a, b = cop_ptr[tau], cop_ptr[tau + 1]
        if c > min(b - a, r_left):
            nxt[depth], cnt[depth] = tau + 1, 1
            continue
        if ok[depth, tau, c]:
            stats[4 + s + depth] += 1
            cnt[depth] += 1
            continue
        ft[depth], fc[depth] = tau, c
        fhi[depth], flo[depth] = cop_p[a:a + c].sum(), cop_p[b - c:b].sum()
        stats[0] += 1
        stats[4 + depth] += 1
        r = r_left - c
        g[:] = 0.0
        for f in range(depth + 1):
            g += 0.5 * (flo[f] + fhi[f]) * U[ft[f]]
        ng = np.sqrt(np.dot(g, g))
        if ng == 0.0:
            g[0], ng = 1.0, 1.0
        g /= ng
        if _refuted(g, lam, U, ft, flo, fhi, depth + 1, tau + 1, cop_p, cop_ptr, r, steps, theta, ystar):
            cnt[depth] += 1
            continue
        if r == 0:
            stats[1] += 1
            if _leaf_below(U, ft, fc, depth + 1, cop_p, cop_ptr, lam):
                stats[3] = 1
                return False
            cnt[depth] += 1
            continue
        used[depth + 1], nxt[depth + 1], cnt[depth + 1] = used[depth] + c, tau + 1, 1
        _screen(g, lam, U, ft, flo, fhi, depth + 1, tau + 1, cop_p, cop_ptr, r, ok[depth + 1], S)
        depth += 1
    return True


def token_arrays(p: np.ndarray, V: np.ndarray, one_copy: bool = False):
    """(U (T, d) = v_tau - mu by token, ordered by heaviest copy; copy masses (heaviest first within a
    token); token start offsets (T + 1,)). ``one_copy``: only each token's heaviest copy."""
    A = centred_contributions(p, V)
    token, T = value_tokens(V)
    first = np.unique(token, return_index=True)[1]  # a key of each token
    heaviest = np.zeros(T)
    np.maximum.at(heaviest, token, p)
    U = A[first] / p[first][:, None]
    order = np.argsort(-heaviest, kind="stable")
    rank = np.empty(T, np.int64)
    rank[order] = np.arange(T)
    token = rank[token]
    by_copy = np.lexsort((-p, token))
    cop_p = p[by_copy]
    cop_ptr = np.r_[0, np.cumsum(np.bincount(token, minlength=T))]
    if one_copy:
        cop_p, cop_ptr = cop_p[cop_ptr[:-1]].copy(), np.arange(T + 1)
    return U[order], cop_p, cop_ptr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", required=True, help="a dump directory")
    ap.add_argument("--rows", required=True, help="row_ids, comma-separated")
    ap.add_argument("--value", type=float, required=True, help="the row's best known value (lam's unit)")
    ap.add_argument("--fractions", default="0.000244,1")
    ap.add_argument("--node-cap", type=float, default=3e5)
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--one-copy", action="store_true")
    a = ap.parse_args()
    ids = [int(x) for x in a.rows.split(",")]
    rows = rows_by_id(a.real, set(ids))
    for rid in ids:
        U, cop_p, cop_ptr = token_arrays(rows[rid].p, rows[rid].V, a.one_copy)
        for frac in (float(x) for x in a.fractions.split(",")):
            stats = np.zeros(4 + 2 * a.s, np.int64)
            t0 = time.perf_counter()
            done = token_search(a.value * frac, U, cop_p, cop_ptr, a.s, 16, 0.5, int(a.node_cap), stats)
            print(json.dumps(dict(row=rid, tokens=int(U.shape[0]), one_copy=a.one_copy, lam_fraction=frac,
                                  refuted=bool(done), nodes=int(stats[0]), capped=bool(stats[2]),
                                  leaf_below=bool(stats[3]), tested=stats[4:4 + a.s].tolist(),
                                  screened=stats[4 + a.s:].tolist(), seconds=round(time.perf_counter() - t0, 1))),
                  flush=True)


if __name__ == "__main__":
    main()
