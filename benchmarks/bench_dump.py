"""Benchmark of ``forcedweight dump``: rows/s, wall time against a plain forward, peak memory.

The baseline is a plain forward of the same decoder (transformers' default SDPA attention,
``use_cache=False``, no LM head, batch 1) over the same texts, measured in the same run; the
capture is a whole ``dump_rows`` call (tokenising, capture, Parquet writes, manifest) into a
fresh directory. Baseline and capture runs alternate ``--repeats`` times; the ratio of the medians
and the ratio of the fastest runs (least disturbed by other load) are reported.

    .venv/bin/python benchmarks/bench_dump.py                       # SmolLM2, corpus, layers 0,14,29
    .venv/bin/python benchmarks/bench_dump.py --layers 0-29 --stats-s 8 --stats-s 32
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

from forcedweight import models, rows
from forcedweight.dump import builtin_texts, dump_rows


def maxrss_mib() -> float:
    """Peak resident memory of this process (MiB): VmHWM, which reset_peak() can reset on Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def reset_peak() -> bool:
    """Reset the peak-RSS counter (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def plain_forward(loaded, token_ids) -> float:
    net = loaded.model
    net.config._attn_implementation = "sdpa"
    start = time.perf_counter()
    with torch.inference_mode():
        for ids in token_ids:
            net.model(input_ids=torch.tensor(ids)[None], use_cache=False)
    return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layers", default="0,14,29", help="layers to capture (default includes the last one, "
                    "so the capture runs the whole decoder like the baseline)")
    ap.add_argument("--heads", default=None)
    ap.add_argument("--positions", type=int, default=4)
    ap.add_argument("--all-positions", action="store_true")
    ap.add_argument("--with-keys", action="store_true")
    ap.add_argument("--stats-s", type=int, action="append", default=[])
    ap.add_argument("--max-texts", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable timings on a "
                    "shared machine; 0 = torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    loaded = models.load_model(args.model)
    load_s = time.perf_counter() - t0
    texts = builtin_texts()[: args.max_texts]
    token_ids = [loaded.tokenizer(t)["input_ids"] for t in texts]
    n_tokens = sum(len(t) for t in token_ids)
    rss_loaded = maxrss_mib()
    plain_forward(loaded, token_ids[:1])  # warm-up
    peak_reset = reset_peak()
    plain_forward(loaded, token_ids)
    rss_forward = maxrss_mib()

    kw = dict(layers=args.layers, heads=args.heads, positions=args.positions, all_positions=args.all_positions,
              with_keys=args.with_keys, stats_s=args.stats_s, progress=False)
    base_s, cap_s, n_rows, out_bytes = [], [], 0, 0
    workdir = Path(tempfile.mkdtemp(prefix="bench_dump_"))
    try:
        reset_peak()
        for rep in range(args.repeats):
            base_s.append(plain_forward(loaded, token_ids))
            out = workdir / f"rep{rep}"
            start = time.perf_counter()
            dump_rows(loaded, texts, out, **kw)
            cap_s.append(time.perf_counter() - start)
            n_rows = rows.count_rows(out)
            out_bytes = sum(p.stat().st_size for p in out.iterdir())
            shutil.rmtree(out)
        rss_dump = maxrss_mib()
        # memory: one more (untimed) dump under tracemalloc, which slows Python allocations
        tracemalloc.start()
        dump_rows(loaded, texts, workdir / "mem", **kw)
        py_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    base, cap = statistics.median(base_s), statistics.median(cap_s)
    print(f"model {loaded.name}: {len(texts)} texts, {n_tokens} tokens, load {load_s:.1f} s, "
          f"torch threads {torch.get_num_threads()}")
    print(f"options: layers={args.layers} heads={args.heads or 'all'} positions={args.positions} "
          f"all_positions={args.all_positions} with_keys={args.with_keys} stats_s={args.stats_s}")
    print(f"plain forward (sdpa)  median {base:.3f} s   runs {', '.join(f'{x:.3f}' for x in base_s)}")
    print(f"dump_rows             median {cap:.3f} s   runs {', '.join(f'{x:.3f}' for x in cap_s)}")
    print(f"ratio capture / plain forward: median {cap / base:.2f}x, best-of-runs {min(cap_s) / min(base_s):.2f}x "
          "(goal <= 1.2x)")
    print(f"rows: {n_rows}  ->  {n_rows / cap:,.0f} rows/s;  output {out_bytes / 2**20:.1f} MiB")
    if peak_reset:
        print(f"peak RSS: plain forward {rss_forward:.0f} MiB, dump_rows {rss_dump:.0f} MiB "
              f"(loading the model peaked at {rss_loaded:.0f} MiB)")
    else:
        print(f"peak RSS over the whole run: {maxrss_mib():.0f} MiB (could not reset the peak counter)")
    print(f"peak Python/NumPy allocations during a dump (tracemalloc): {py_peak / 2**20:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
