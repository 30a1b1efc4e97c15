"""End-to-end ``certify`` throughput (rows/s) on synthetic rows, and scaling with workers.

Rows: weights = softmax(scale * g), g ~ N(0, 1) (``--scale`` sets how peaked), values ~ N(0, 1),
d = 64. For each (N, s) the same rows are certified twice in this run: with ``--solver none``
(heuristics + exact pool enumeration: the baseline) and with the default solver (``auto`` = bnb
here), so the table reports the certification cost as a ratio to the baseline, plus the share of
(row, s) proved optimal. Then workers 1 vs 2 on one configuration.

    .venv/bin/python benchmarks/bench_certify.py                   # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_certify.py --n 64 256 --s 8 --rows 4
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
import pyarrow.parquet as pq

from forcedweight import rows
from forcedweight.certify import CertifyOptions, certify_file


def synthetic_rows(path: Path, n: int, count: int, d: int = 64, scale: float = 2.0, seed: int = 0) -> Path:
    rng = np.random.default_rng([seed, n])
    recs = []
    for i in range(count):
        g = scale * rng.normal(size=n)
        p = np.exp(g - g.max())
        p /= p.sum()
        recs.append(dict(row_id=i, weights=p, values=rng.normal(size=n * d), value_dim=d))
    pq.write_table(rows.make_row_table(recs), path)
    return path


def timed(src, out, s_values, options, workers=1, chunk_rows=1):
    t0 = time.perf_counter()
    certify_file(src, out, s_values, options, workers=workers, progress=False, chunk_rows=chunk_rows)
    wall = time.perf_counter() - t0
    t = pq.read_table(out, columns=["status", "proved"]).to_pylist()
    return wall, sum(r["proved"] for r in t) / len(t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--s", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=1.0)
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--workers-rows", type=int, default=96)
    ap.add_argument("--workers-n", type=int, default=64, help="N of the rows of the workers comparison")
    args = ap.parse_args(argv)

    print(f"load average at start (1, 5, 15 min): {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # warm-up: JIT compilation (Numba caches on disk) is not part of the measurement
        warm = synthetic_rows(tmp / "warm.parquet", 64, 1)
        for solver in ("none", "auto"):
            certify_file(warm, tmp / "w.parquet", [8, 32], CertifyOptions(solver=solver), progress=False)

        print(f"rows: softmax({args.scale} * N(0,1)) weights, d = 64 values; {args.rows} rows per cell; "
              f"time limit {args.time_limit} s per (row, s)\n")
        print("| N | s | rows/s, solver none (pool + heuristics) | rows/s, auto (bnb) | cost ratio auto/none | proved |")
        print("|---|---|---|---|---|---|")
        for n in args.n:
            src = synthetic_rows(tmp / f"rows-{n}.parquet", n, args.rows)
            for s in args.s:
                if s >= n:
                    continue
                base, _ = timed(src, tmp / "base.parquet", [s], CertifyOptions(solver="none"))
                full, proved = timed(src, tmp / "full.parquet", [s],
                                     CertifyOptions(solver="auto", time_limit=args.time_limit))
                print(f"| {n} | {s} | {args.rows / base:.2f} | {args.rows / full:.2f} | {full / base:.2f} | "
                      f"{proved:.0%} |", flush=True)

        n, s = args.workers_n, 8
        src = synthetic_rows(tmp / "workers.parquet", n, args.workers_rows, seed=1)
        tiny = synthetic_rows(tmp / "tiny.parquet", n, 2, seed=2)
        opts = CertifyOptions(solver="auto", time_limit=args.time_limit)
        one, proved_one = timed(src, tmp / "one.parquet", [s], opts, workers=1, chunk_rows=4)
        two, proved_two = timed(src, tmp / "two.parquet", [s], opts, workers=2, chunk_rows=4)
        # start-up of a 2-process pool (spawn, imports, Numba cache loads), from a 2-row run
        t1, _ = timed(tiny, tmp / "t1.parquet", [s], opts, workers=1, chunk_rows=1)
        t2, _ = timed(tiny, tmp / "t2.parquet", [s], opts, workers=2, chunk_rows=1)
        start = max(0.0, t2 - t1)
        print(f"\nworkers (N = {n}, s = {s}, {args.workers_rows} rows, 4 rows per shard):\n"
              f"- 1 worker {args.workers_rows / one:.2f} rows/s; 2 workers {args.workers_rows / two:.2f} rows/s "
              f"end to end: speed-up {one / two:.2f}x (proved {proved_one:.0%} / {proved_two:.0%}; 1 worker searches "
              f"each row on this process's {numba.get_num_threads()} Numba threads, 2 workers one thread each on 2 cores)\n"
              f"- pool start-up (2-row run, 2 workers minus 1 worker): {start:.2f} s; "
              f"speed-up without it {one / max(two - start, 1e-9):.2f}x")
        print(f"load average during the run (1, 5, 15 min): {os.getloadavg()}")


if __name__ == "__main__":
    main()
