"""Cost of the dropped-mass statistic against one dense attention layer (paper 004: 0.002-0.03x).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_contourkv.py [--n 512,1024,2048] [--window 64]

SmolLM2-135M's attention shape (9 query heads, 3 KV heads, d = 64), float32, random post-RoPE
queries/keys/values. The statistic: ``dropped_mass_onepass`` over the last ``window`` queries for a
kept set (one pass over the keys per row: logits, two log-sum-exps). The dense layer: causal SDPA of
all N queries over the N keys and values (the prefill's attention of one layer). Median of repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from forcedweight.deploy.dropped_mass import dropped_mass_onepass


def _time(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="512,1024,2048")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    hq, hkv, d = 9, 3, 64
    print("| N | window | statistic (ms) | dense layer (ms) | ratio |")
    print("|---|---|---|---|---|")
    for n in [int(x) for x in args.n.split(",")]:
        q = torch.randn(1, hq, n, d)
        k = torch.randn(1, hkv, n, d)
        v = torch.randn(1, hkv, n, d)
        kept = torch.rand(hkv, n) < 0.25
        w = min(args.window, n)
        pos = torch.arange(n - w, n)
        qw = q[0, :, -w:].contiguous()

        def stat():
            dropped_mass_onepass(qw, k[0], kept, d**-0.5, pos)

        def dense():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        ts, td = _time(stat, args.repeats), _time(dense, args.repeats)
        print(f"| {n} | {w} | {1e3 * ts:.2f} | {1e3 * td:.2f} | {ts / td:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
