"""Benchmark of ``forcedweight report`` statistics (run: .venv/bin/python benchmarks/bench_report.py).

1. ``stats.bootstrap_median_ci`` against ``scipy.stats.bootstrap(method="percentile")`` on the same
   sample, same resamples (same draws; the intervals agree exactly): time ratio.
2. ``build_report`` on a synthetic certify output (vectorised generator below), against the time
   to read the same table with polars in the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats as sps

from forcedweight.core import stats as st
from forcedweight.report import build_report


def synthetic_results(families_layers=10, heads=9, s_values=(4, 8, 16), per_family=50, seed=0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    keys = [(layer, h, s) for layer in range(families_layers) for h in range(heads) for s in s_values]
    n = len(keys) * per_family
    layer, head, s = (np.repeat([k[i] for k in keys], per_family) for i in range(3))
    dm = rng.beta(2, 5, n)
    es_top = dm * rng.uniform(0.5, 1.5, n)
    kappa = np.minimum(rng.exponential(0.04, n) * (0.3 + 2 * dm), 0.9)
    es_best = es_top * (1 - kappa)
    status = rng.choice(["optimal", "improved", "unsolved"], p=[0.9, 0.05, 0.05], size=n)
    return pl.DataFrame({
        "row_id": np.arange(n), "s": s, "n_keys": np.full(n, 512), "es_top": es_top,
        "es_balance": es_top - 0.9 * (es_top - es_best), "swaps": rng.integers(0, 4, n),
        "es_pool": es_best * (1 + 0.01 * rng.random(n)), "es_best": es_best, "lower_bound": es_best * 0.9,
        "status": status, "closable_share": kappa, "balancing_recovery": np.full(n, 0.9), "dropped_mass": dm,
        "ef_top": es_top / 1.2, "pi_top": 1 + rng.exponential(0.3, n), "es_geometric": es_top * 2,
        "es_leverage": es_top * 10, "es_random": es_top * 5, "model": ["bench"] * n, "layer": layer, "head": head,
    })


def timed(fn, repeat=3):
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-family", type=int, default=50)
    ap.add_argument("--n-boot", type=int, default=2000)
    args = ap.parse_args()
    for n in (50, 2000, 20000):
        x = np.random.default_rng(n).lognormal(size=n)
        b = st.bootstrap_batch(n, args.n_boot)
        ours = timed(lambda: st.bootstrap_median_ci(x, n_boot=args.n_boot, seed=0))
        ref = timed(lambda: sps.bootstrap((x,), np.median, n_resamples=args.n_boot, batch=b, method="percentile",
                                          vectorized=True, rng=np.random.default_rng(0)))
        print(f"bootstrap median n={n:6d} n_boot={args.n_boot}: ours {ours * 1e3:8.2f} ms, scipy {ref * 1e3:8.2f} ms, "
              f"speedup {ref / ours:5.2f}x")
    df = synthetic_results(per_family=args.per_family)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "results.parquet"
        df.write_parquet(path)
        read = timed(lambda: pl.read_parquet(path))
        t = time.perf_counter()
        build_report(path, Path(d) / "out", n_boot=args.n_boot, command="bench")
        total = time.perf_counter() - t
    fams = df.select("layer", "head", "s").n_unique()
    print(f"build_report: {df.height} rows, {fams} families, n_boot={args.n_boot}: {total:.2f} s "
          f"({total / fams * 1e3:.1f} ms per family; {total / read:.0f}x the time to read the table, {read * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
