"""Benchmark of the ragged decode path and the ragged cache's memory.

Model decode (CPU, the embedded SmolLM2-135M, float32, default 1 thread): ms/token of greedy decode
through transformers' ``DynamicCache`` (SDPA attention) and through ``RaggedKVCache`` at full budget
and evicted to 50% / 25% / 10% of the entries (the same budget in every (layer, KV head): the last
eighth of the budget by recency plus a seeded random draw), at each context length, all in one run:
one prefill per context (not timed), then for every repeat each variant in turn from a fresh copy of
that prefill (warm-up steps discarded, then ``--steps`` timed steps). Reported: best and median
ms/token over repeats, ratio to dense, physical / slack bytes, relayouts during the timed steps.

Kernel level, CPU (always): correctness of the PyTorch path against the float64 reference; physical bytes of one
selection stored full / masked / ragged (SmolLM2-135M shapes: 30 layers × 3 KV heads × head dim 64);
time of the PyTorch path against torch SDPA over a dense cache of the same kept length (ratio).

CUDA (when available): the Triton kernel's achieved bandwidth (bytes of K, V, bias, q and out moved
per call / time) against the device's HBM peak, and its time against SDPA over a dense cache of the
same kept length.

    .venv/bin/python benchmarks/bench_ragged.py [--contexts 1024,4096] [--fractions 0.5,0.25,0.1]
        [--steps 16] [--repeats 2] [--warmup 2] [--no-model] [--tokens 4096] [--ratio 0.25] [--batch 1]
        [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from forcedweight.deploy.ragged_cache import RaggedKVCache, physical_bytes
from forcedweight.kernels import ragged_decode, segment_decode
from forcedweight.kernels.reference import ragged_decode_reference
from forcedweight.models import load_model
from forcedweight.deploy.attention import use_ragged_attention

# HBM peak bandwidth in GB/s by device-name substring (vendor datasheets); --peak-gbps overrides
HBM_PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
                 "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864, "L4": 300, "A10G": 600, "RTX 4090": 1008}


def make_ragged(batch, kv_heads, G, D, lengths, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.as_tensor(lengths), 0)
    T = int(indptr[-1])
    q = torch.randn(batch, kv_heads * G, D, generator=g).to(dtype).to(device)
    k = torch.randn(T, D, generator=g).to(dtype).to(device)
    v = torch.randn(T, D, generator=g).to(dtype).to(device)
    bias = torch.randn(T, generator=g).to(device)
    return q, k, v, indptr.to(device), bias


def paired_time(fa, fb, device, min_time=1.0):
    """Median seconds per call of ``fa`` and of ``fb``, calls alternated so that both see the same
    machine load (CUDA: triton's do_bench for each)."""
    if device.type == "cuda":
        import triton.testing

        return tuple(triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median") / 1e3 for f in (fa, fb))
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3:  # warm-up (allocator, thread pool), discarded
        fa(), fb()
    ta, tb, start = [], [], time.perf_counter()
    while time.perf_counter() - start < min_time or len(ta) < 11:
        for f, ts in ((fa, ta), (fb, tb)):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return sorted(ta)[len(ta) // 2], sorted(tb)[len(tb) // 2]


def correctness(device):
    rows = []
    for dtype in (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,):
        q, k, v, indptr, bias = make_ragged(2, 3, 3, 64, [1, 517, 33, 0, 1024, 77], dtype, device)
        out, lse = ragged_decode(q, k, v, indptr, bias)
        ref_out, ref_lse = ragged_decode_reference(q, k, v, indptr, bias)
        live = torch.isfinite(ref_lse)
        rows.append({"dtype": str(dtype).replace("torch.", ""),
                     "max_abs_err_out": (out.double().cpu() - ref_out).abs().max().item(),
                     "max_abs_err_lse": (lse.double().cpu() - ref_lse)[live].abs().max().item()})
    return rows


def memory(tokens, ratio, layers=30, kv_heads=3, D=64, seed=0):
    """Bytes of one random per-head selection of s = ratio·N entries, full vs masked vs ragged."""
    g = torch.Generator().manual_seed(seed)
    s = max(1, round(ratio * tokens))
    cache, full, masks = RaggedKVCache(), [], []
    for layer in range(layers):
        ks, vs = torch.randn(1, kv_heads, tokens, D, generator=g), torch.randn(1, kv_heads, tokens, D, generator=g)
        full += [ks, vs]
        cache.update(ks, vs, layer)
        keep = [torch.sort(torch.randperm(tokens, generator=g)[:s]).values for _ in range(kv_heads)]
        mask = torch.zeros(1, kv_heads, tokens, dtype=torch.bool)
        for h, idx in enumerate(keep):
            mask[0, h, idx] = True
        masks.append(mask)
        cache.evict(layer, keep)
    full_b, masked_b, ragged_b = physical_bytes(full), physical_bytes(full + masks), cache.physical_bytes()
    return {"tokens": tokens, "kept_per_head": s, "full_bytes": full_b, "masked_bytes": masked_b,
            "ragged_bytes": ragged_b, "ragged_nominal_bytes": cache.nominal_bytes(),
            "ragged_slack_bytes": cache.slack_bytes(),
            "masked_over_full": masked_b / full_b, "ragged_over_full": ragged_b / full_b,
            "overhead_share": (ragged_b - cache.nominal_bytes()) / cache.nominal_bytes()}


def speed(device, batch, kept, dtype, peak_gbps=None):
    """Ragged decode vs SDPA over a dense cache of the same kept length (equal lengths for SDPA;
    the ragged case also at ±50% varying lengths with the same total, packed (``ragged_decode``) and in
    the cache's extents layout with 1/64 spare rows per segment (``segment_decode``, what a decode step
    through ``RaggedKVCache`` runs))."""
    kv_heads, G, D = 8, 4, 128  # a Llama-3-8B-like layer (GQA G = 4)
    rows = []
    S = batch * kv_heads
    for layout in ("uniform", "varying", "varying, cache extents"):
        if layout == "uniform":
            lengths = [kept] * S
        else:
            g = torch.Generator().manual_seed(1)
            lengths = (kept * (0.5 + torch.rand(S, generator=g))).long().tolist()
            lengths[-1] += kept * S - sum(lengths)
        q, k, v, indptr, bias = make_ragged(batch, kv_heads, G, D, lengths, dtype, device)
        kwargs = {}
        if device.type == "cuda":
            from forcedweight.kernels.triton_decode import choose_num_splits

            kwargs = {"num_splits": choose_num_splits(S, max(lengths), 64, device)}
        if layout == "varying, cache extents":  # the same segments with spare rows between them
            caps = [n + max(1, n // 64) for n in lengths]
            starts_l = [0]
            for c in caps[:-1]:
                starts_l.append(starts_l[-1] + c)
            C = sum(caps)
            rows_idx = torch.cat([torch.arange(s0, s0 + n) for s0, n in zip(starts_l, lengths)]).to(device)
            kb = torch.zeros(C, D, dtype=dtype, device=device).index_copy_(0, rows_idx, k)
            vb = torch.zeros(C, D, dtype=dtype, device=device).index_copy_(0, rows_idx, v)
            bb = torch.zeros(C, device=device).index_copy_(0, rows_idx, bias)
            starts = torch.tensor(starts_l, device=device)
            lens = torch.tensor(lengths, device=device)
            host = (starts_l, lengths)

            def run():
                return segment_decode(q, kb, vb, starts, lens, bb, check=False, host=host, max_len=max(lengths),
                                      **kwargs)
        else:
            def run():
                return ragged_decode(q, k, v, indptr, bias, check_indptr=False, **kwargs)
        kd = torch.randn(batch, kv_heads, kept, D, device=device).to(dtype)
        vd = torch.randn(batch, kv_heads, kept, D, device=device).to(dtype)
        qd = q.unsqueeze(2)
        t_ragged, t_sdpa = paired_time(run, lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True),
                                       device)
        row = {"device": device.type, "layout": layout, "batch": batch, "kv_heads": kv_heads, "G": G, "D": D,
               "kept_per_head": kept, "dtype": str(dtype).replace("torch.", ""),
               "ragged_seconds": t_ragged, "sdpa_seconds": t_sdpa, "ragged_over_sdpa": t_ragged / t_sdpa}
        if device.type == "cuda":
            moved = k.numel() * k.element_size() + v.numel() * v.element_size() + bias.numel() * 4 \
                + 2 * q.numel() * q.element_size() + 2 * S * 8
            gbps = moved / t_ragged / 1e9
            name = torch.cuda.get_device_name(device)
            peak = peak_gbps or next((p for key, p in HBM_PEAK_GBPS.items() if key in name), None)
            row.update({"device_name": name, "achieved_gbps": gbps, "peak_gbps": peak,
                        "fraction_of_peak": None if peak is None else gbps / peak})
        rows.append(row)
    return rows


def uniform_keep(n, budget, segments, seed):
    """Per segment: the last ``budget // 8`` positions plus a seeded random draw of the rest (sorted)."""
    g = torch.Generator().manual_seed(seed)
    recent = budget // 8
    out = []
    for _ in range(segments):
        rest = torch.randperm(n - recent, generator=g)[:budget - recent]
        out.append(torch.sort(torch.cat([rest, torch.arange(n - recent, n)])).values)
    return out


def _decode(model, cache, token, steps):
    """Greedy decode ``steps`` tokens from ``token`` [B, 1]; returns (wall seconds, CPU seconds of this
    process, last token). CPU time is the steadier figure on a shared machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=token, cache=cache, use_cache=True).logits
            token = logits[:, -1:].argmax(-1)
    return time.perf_counter() - t0, time.process_time() - c0, token


def model_decode(contexts, fractions, steps, repeats, warmup, seed=0):
    """ms/token of dense vs ragged decode on the embedded SmolLM2 (see the module docstring)."""
    from transformers import DynamicCache

    loaded = load_model()
    model = loaded.model.eval()
    vocab = model.config.vocab_size
    rows = []
    for N in contexts:
        g = torch.Generator().manual_seed(seed + N)
        ids = torch.randint(0, vocab, (1, N), generator=g)
        model.set_attn_implementation("sdpa")
        prefill = DynamicCache(config=model.config)
        t0 = time.perf_counter()
        with torch.no_grad():
            first = model(input_ids=ids, cache=prefill, use_cache=True).logits[:, -1:].argmax(-1)
        prefill_s = time.perf_counter() - t0
        B, Hkv = prefill.layers[0].keys.shape[:2]

        def dense_cache():
            return copy.deepcopy(prefill)

        def ragged_cache(frac):
            cache = RaggedKVCache.from_dense(prefill)
            if frac < 1:
                budget = max(1, round(frac * N))
                for i in range(len(cache.layers)):
                    cache.evict(i, uniform_keep(N, budget, B * Hkv, seed + 1 + i))
            return cache

        variants = [("dense DynamicCache", None)] + [(f"ragged {round(100 * f)}%", f) for f in [1.0] + fractions]
        times = {name: [] for name, _ in variants}
        cpu = {name: [] for name, _ in variants}
        info = {}
        for rep in range(repeats + 1):  # repeat 0 is the warm-up pass
            for name, frac in variants:
                cache = dense_cache() if frac is None else ragged_cache(frac)
                if frac is None:
                    model.set_attn_implementation("sdpa")
                else:
                    use_ragged_attention(model)
                _, _, tok = _decode(model, cache, first, warmup)  # warm-up steps, discarded
                relayouts0 = cache.relayouts() if frac is not None else 0
                seconds, cpu_s, _ = _decode(model, cache, tok, steps if rep else 1)
                if rep:
                    times[name].append(1e3 * seconds / steps)
                    cpu[name].append(1e3 * cpu_s / steps)
                if frac is None:
                    held = physical_bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])
                    info[name] = {"entries": cache.layers[0].keys.shape[2] * Hkv * B * len(cache.layers),
                                  "physical_bytes": held, "slack_bytes": 0, "relayouts": 0}
                else:
                    info[name] = {"entries": cache.entries(), "physical_bytes": cache.physical_bytes(),
                                  "slack_bytes": cache.slack_bytes(), "relayouts": cache.relayouts() - relayouts0}
                del cache
        dense_best = min(times["dense DynamicCache"])
        for name, frac in variants:
            ts = times[name]
            row = {"context": N, "variant": name, "kept_fraction": 1.0 if frac is None else frac,
                   "ms_per_token_best": min(ts), "ms_per_token_median": statistics.median(ts),
                   "ms_per_token_all": ts, "ratio_to_dense_best": min(ts) / dense_best,
                   "ratio_to_dense_paired": statistics.median(
                       [a / b for a, b in zip(ts, times["dense DynamicCache"])]),
                   "cpu_ms_per_token_best": min(cpu[name]),
                   "cpu_ratio_to_dense_best": min(cpu[name]) / min(cpu["dense DynamicCache"]),
                   "prefill_seconds": prefill_s, "load_average": os.getloadavg(), **info[name]}
            row["slack_share"] = row["slack_bytes"] / row["physical_bytes"]
            rows.append(row)
            print(f"N={N:5d} {name:20s} best {row['ms_per_token_best']:7.2f} ms/token  "
                  f"median {row['ms_per_token_median']:7.2f}  x dense {row['ratio_to_dense_best']:.3f} "
                  f"(paired {row['ratio_to_dense_paired']:.3f})  cpu {row['cpu_ms_per_token_best']:7.2f} "
                  f"x dense {row['cpu_ratio_to_dense_best']:.3f}  slack {100 * row['slack_share']:.2f}%  "
                  f"relayouts {row['relayouts']}", flush=True)
    model.set_attn_implementation("sdpa")
    return rows


def markdown_table(rows) -> str:
    lines = ["| context | cache | entries held | ms/token (best) | ms/token (median) | × dense (best) | "
             "× dense (paired median) | CPU ms/token (best) | CPU × dense | physical MB | slack % of held | "
             "relayouts |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['variant']} | {r['entries']:,} | {r['ms_per_token_best']:.2f} | "
                     f"{r['ms_per_token_median']:.2f} | {r['ratio_to_dense_best']:.3f} | "
                     f"{r['ratio_to_dense_paired']:.3f} | {r['cpu_ms_per_token_best']:.2f} | "
                     f"{r['cpu_ratio_to_dense_best']:.3f} | {r['physical_bytes'] / 2**20:.1f} | "
                     f"{100 * r['slack_share']:.2f} | {r['relayouts']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="context length N for the memory audit")
    ap.add_argument("--ratio", type=float, default=0.25, help="kept fraction per head")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kept", type=int, default=None, help="kept entries per head for timing (default ratio·N)")
    ap.add_argument("--peak-gbps", type=float, default=None, help="HBM peak of this GPU (overrides the table)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (1: stable timings on a shared machine)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--contexts", default="1024,4096", help="model decode: prompt lengths")
    ap.add_argument("--fractions", default="0.5,0.25,0.1", help="model decode: kept fractions besides 100%%")
    ap.add_argument("--steps", type=int, default=16, help="model decode: timed decode steps per variant")
    ap.add_argument("--repeats", type=int, default=2, help="model decode: timed passes over the variants")
    ap.add_argument("--warmup", type=int, default=2, help="model decode: untimed steps before each timing")
    ap.add_argument("--no-model", action="store_true", help="skip the model decode benchmark")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    kept = args.kept or max(1, round(args.ratio * args.tokens))
    results = {"threads": args.threads, "load_average_start": os.getloadavg()}
    if not args.no_model:
        rows = model_decode([int(x) for x in args.contexts.split(",")],
                            [float(x) for x in args.fractions.split(",")], args.steps, args.repeats, args.warmup)
        results["model_decode"] = rows
        results["load_average_after_model"] = os.getloadavg()
        print(markdown_table(rows), flush=True)
    results.update({"correctness_cpu": correctness(torch.device("cpu")), "memory": memory(args.tokens, args.ratio),
                    "speed": speed(torch.device("cpu"), args.batch, kept, torch.float32)})
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        results["correctness_cuda"] = correctness(dev)
        results["speed"] += [row for dt in (torch.bfloat16, torch.float16)
                             for row in speed(dev, args.batch, kept, dt, args.peak_gbps)]
        results["speed"] += speed(dev, 8 * args.batch, 4 * kept, torch.bfloat16, args.peak_gbps)
    else:
        results["cuda"] = "not available: GPU figures (Triton bandwidth, time vs SDPA) not measured"
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
