"""The proved lower bound of a stopped search against the seconds its bound phase may take.

    .venv/bin/python benchmarks/bench_bound_time.py --real DUMP --rows 25,343 [--s 8] [--node-limit 200000]
        [--bound-times 2,8,15,30,60] [--refine-work 5e9]

For each row (``row_id``s of a ``forcedweight dump``) and each bound time T: ``solve_bnb`` from the pool optimum
(``pool.pool_optimum``), stopped by ``--node-limit`` (one thread: the same open frontier at every T), whose bound
phase (``frontier.open_bound``: the first-level pass, then the best-first refinement of ``--refine-work``
key-steps) ends at T seconds (``bound_time``; a 10 s time limit gives 2 s). Prints the bound as a share of the
value, the seconds of the whole call (search and bound) and the refinement's counters. Set ``NUMBA_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import sys
import time


def _comma_list(text: str, convert, what: str) -> list:
    """A comma-separated option's values, each by ``convert``; argparse's one-line error otherwise."""
    try:
        return [convert(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of {what}: {text!r}") from None


def _seconds(text: str) -> list:
    """``--bound-times``: comma-separated positive seconds."""
    out = _comma_list(text, float, "seconds")
    if min(out) <= 0:
        raise argparse.ArgumentTypeError(f"bound times must be > 0: {text!r}")
    return out


def _row_ids(text: str) -> list:
    """``--rows``: comma-separated row_ids."""
    return _comma_list(text, int, "row_ids")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", required=True, help="a forcedweight dump (folder or Parquet file)")
    ap.add_argument("--rows", required=True, type=_row_ids, help="comma-separated row_ids")
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--node-limit", type=int, default=200_000)
    ap.add_argument("--bound-times", type=_seconds, default="2,8,15,30,60", help="comma-separated seconds of the bound phase")
    ap.add_argument("--refine-work", type=float, default=5e9, help="the refinement's key-step budget")
    args = ap.parse_args(argv)

    from forcedweight.certify.pool import pool_optimum
    from forcedweight.certify.solvers.bnb import solve_bnb
    from forcedweight.certify.warmup import warm_up
    from forcedweight.errors import InputError
    from forcedweight.rows import rows_by_id

    ids = args.rows
    try:
        rows = rows_by_id(args.real, set(ids))
    except InputError as e:
        sys.exit(f"bench_bound_time: {e}")
    missing = [i for i in ids if i not in rows]
    if missing:
        sys.exit(f"bench_bound_time: no row with row_id {missing[0]} in {args.real}")
    warm_up()
    print("| row | N | T (s) | proved | lower bound / value | seconds (search + bound) | splits | children tested | key-steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rid in ids:
        r = rows[rid]
        start = pool_optimum(r.p, r.V, args.s)[2]
        for bt in args.bound_times:
            t0 = time.perf_counter()
            res = solve_bnb(r.p, r.V, args.s, incumbent=start, node_limit=args.node_limit, time_limit=1e9,
                            bound_time=bt, refine_work=args.refine_work)
            total = time.perf_counter() - t0
            ref = res.info["refine"] or {}
            share = res.lower_bound / res.value if res.value > 0 else 1.0
            print(f"| {rid} | {r.n_keys} | {bt:g} | {res.proved} | {share:.3g} | {total:.1f} | {ref.get('splits', 0)} "
                  f"| {ref.get('children_tested', 0):,} | {ref.get('key_steps', 0):.3g} |", flush=True)


if __name__ == "__main__":
    main()
