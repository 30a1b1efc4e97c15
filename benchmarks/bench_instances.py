"""Time to decide balanced-partition (ZEROES) instances against m, for every exact solver.

For each m, ``--count`` instances (kinds round-robin: yes, no, near_miss) from
``forcedweight.instances.generate`` are decided at s = m/2 by

- ``proof``: the generator's signed-sum meet-in-the-middle (``instances.proofs.prove_balanced``);
- ``mitm``: ``solvers.mitm.solve_mitm`` (the baseline of the ratios);
- ``cpsat``: ``solvers.cpsat.solve_cpsat`` (1 worker);
- ``bnb``: ``solvers.bnb.solve_bnb`` (the general branch and bound) when that module exists;
- ``scip``: ``solvers.scip.solve_scip`` when that module exists;
- ``enumerate``: ``enumerate.enumerate_best`` over all m keys, only while C(m, m/2) <= --max-subsets
  (it has no time limit; above the cap it is reported as "skip").

Every solver that claims a proof is checked against the proved answer (its optimum must equal
the exact gap within the float64 tolerance of E). Reported per (m, solver): proved / count,
median seconds over the proved instances, the ratio of that median to mitm's, and timeouts.

    .venv/bin/python benchmarks/bench_instances.py            # defaults: about 2-3 minutes on 2 cores
    .venv/bin/python benchmarks/bench_instances.py --m 12 16 20 --count 3 --time-limit 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from forcedweight.instances import generate, partition_row, prove_balanced
from forcedweight.certify.solvers.cpsat import solve_cpsat
from forcedweight.certify.solvers.mitm import solve_mitm
from forcedweight.core import operator


def load(module: str, name: str):
    """A solver from another module of the package, or None while it does not exist yet."""
    try:
        mod = __import__(f"forcedweight.certify.solvers.{module}", fromlist=[name])
    except ImportError:
        return None
    return getattr(mod, name, None)


def decide(name, fn, p, V, s, inst, tol):
    """Run one solver; return (seconds, proved, agrees) where agrees checks the proved value."""
    t0 = time.perf_counter()
    value, proved = fn(p, V, s)
    seconds = time.perf_counter() - t0
    agrees = (not proved) or abs(value - inst["gap"]) <= tol
    if not agrees:
        print(f"  DISAGREE {name}: value {value!r} vs proved gap {inst['gap']!r} (m={p.size}, kind={inst['kind']})")
    return seconds, proved, agrees


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[12, 16, 20, 24, 28, 32, 36, 40])
    ap.add_argument("--count", type=int, default=3, help="instances per m (kinds round-robin)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bits", type=int, default=None, help="bits per integer (default: the generator's)")
    ap.add_argument("--any-total", action="store_true",
                    help="odd-total no-instances allowed (the generator's even_total=False; needed with few --bits)")
    ap.add_argument("--time-limit", type=float, default=2.0, help="seconds per instance and solver")
    ap.add_argument("--max-subsets", type=float, default=2e8, help="enumeration cap on C(m, m/2)")
    ap.add_argument("--workers", type=int, default=1, help="CP-SAT workers")
    args = ap.parse_args(argv)

    from forcedweight.certify.enumerate import enumerate_best

    scip = load("scip", "solve_scip")
    bnb = load("bnb", "solve_bnb")
    tl = args.time_limit

    def run_proof(p, V, s, a):
        proof = prove_balanced(a)
        return proof.gap, True

    solvers = {
        "mitm": lambda p, V, s: (lambda r: (r.value, r.proved))(solve_mitm(p, V, s, time_limit=tl)),
        "cpsat": lambda p, V, s: (lambda r: (r.value, r.proved))(
            solve_cpsat(p, V, s, time_limit=tl, workers=args.workers)),
    }
    if bnb is not None:
        solvers["bnb"] = lambda p, V, s: (lambda r: (r.value, r.proved))(bnb(p, V, s, time_limit=tl))
    if scip is not None:
        solvers["scip"] = lambda p, V, s: (lambda r: (r.value, r.proved))(scip(p, V, s, time_limit=tl))
    solvers["enumerate"] = lambda p, V, s: (enumerate_best(p, V, np.arange(p.size), s)[0], True)

    # warm-up (Numba compilation of the enumeration) outside the timings
    w = generate(8, 1, 0)[0]
    wp = np.full(8, 1 / 8)
    enumerate_best(wp, w["integers"].astype(float)[:, None], np.arange(8), 4)

    print(f"time limit {tl:g} s per instance and solver; {args.count} instances per m; seed {args.seed}")
    header = "| m | bits | solver | proved | timeouts | median s | × mitm | agree |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for m in args.m:
        insts = generate(m, args.count, args.seed, bits=args.bits, even_total=not args.any_total)
        results = {name: [] for name in ["proof", *solvers]}
        for inst in insts:
            row = partition_row(inst)
            p = np.asarray(row["weights"])
            V = np.asarray(row["values"])[:, None]
            s = row["s"]
            tol = operator.forced_error_rounding(inst["integers"], s)
            t0 = time.perf_counter()
            run_proof(p, V, s, inst["integers"])
            results["proof"].append((time.perf_counter() - t0, True, True))
            for name, fn in solvers.items():
                if name == "enumerate" and math.comb(m, s) > args.max_subsets:
                    results[name].append(None)
                    continue
                results[name].append(decide(name, fn, p, V, s, inst, tol))
        base = statistics.median(r[0] for r in results["mitm"] if r[1]) if any(r[1] for r in results["mitm"]) else None
        for name, rs in results.items():
            if all(r is None for r in rs):
                skip = f"skip (C(m, m/2) = {math.comb(m, m // 2):.1e})"
                lines.append(f"| {m} | {insts[0]['bits']} | {name} | {skip} | | | | |")
                continue
            done = [r for r in rs if r is not None]
            proved = [r for r in done if r[1]]
            med = statistics.median(r[0] for r in proved) if proved else None
            ratio = f"{med / base:.1f}" if med is not None and base else "–"
            agree = all(r[2] for r in done)
            lines.append(
                f"| {m} | {insts[0]['bits']} | {name} | {len(proved)}/{len(done)} | {len(done) - len(proved)} | "
                f"{'–' if med is None else f'{med:.3g}'} | {ratio} | {'yes' if agree else 'NO'} |"
            )
        print("\n".join(lines[-len(results):]), flush=True)
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
