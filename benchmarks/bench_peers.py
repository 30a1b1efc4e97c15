"""kvpress's own presses and pipeline beside ours, in the same process, on the same tasks (issue 18).

Needs the ``peers`` extra (kvpress 0.5.5, so transformers < 5.3): run it in ``.venv-low``
(scripts/setup_low.sh). Per example of ``--tasks`` (a file written by ``forcedweight tasks``) and per
press of ``--presses`` at ``--ratio`` (fraction evicted):

- kvpress: its ``kv-press-text-generation`` pipeline's greedy answer (the press prunes the
  DynamicCache during the context prefill), scored with our task metric; its memory: the same
  prefill under the press (``with press(model): model.model(context_ids, past_key_values=cache)``,
  what the pipeline does before decoding), the physical bytes of the DynamicCache it leaves
  (every storage counted once) and its kept entries;
- ours: the evaluate protocol (``forcedweight.deploy.evaluate.run_example``) with the adapted press
  ``kvpress:<Press>`` (same ``score``) and the ``uniform`` allocator (kvpress's per-head count), the
  budget enforced by the ragged cache; its physical bytes after eviction.
- ``none`` on both sides (full cache) as the sanity row: answers must agree.

Printed: a Markdown table (means over the examples) and, with ``--json``, every row.

    OMP_NUM_THREADS=1 .venv-low/bin/python benchmarks/bench_peers.py --tasks T.jsonl --model M.gguf
        [--n 6] [--ratio 0.5] [--presses KnormPress,SnapKVPress,ExpectedAttentionPress] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import kvpress  # the peers extra
import torch
from transformers import DynamicCache, pipeline

from forcedweight.compat import TRANSFORMERS_VERSION
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate import Method, run_example
from forcedweight.deploy.evaluate_protocol import prompt_ids
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.ragged_cache import physical_bytes
from forcedweight.deploy.tasks import read_tasks, score_answer
from forcedweight.models import load_model


def kvpress_side(pipe, model, tok, ex, press):
    """kvpress's answer, score, physical bytes and kept entries for one example and press (None: full)."""
    t0 = time.perf_counter()
    answer = pipe(ex["context"], question=ex["question"], answer_prefix=ex["answer_prefix"], press=press,
                  max_new_tokens=ex["max_new_tokens"])["answer"]
    seconds = time.perf_counter() - t0
    ctx = pipe.preprocess(ex["context"], [ex["question"]], ex["answer_prefix"], int(1e10))["context_ids"]
    same_ids = bool(torch.equal(ctx, prompt_ids(tok, ex).context))
    cache = DynamicCache()
    with (press(model) if press is not None else _null()), torch.inference_mode():
        model.model(input_ids=ctx, past_key_values=cache)
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    entries = sum(int(layer.keys.shape[1] * layer.keys.shape[2]) for layer in cache.layers)
    return dict(answer=answer, score=score_answer(ex["task"], answer, ex["answer"]), bytes=physical_bytes(tensors),
                entries=entries, seconds=seconds, same_context_ids=same_ids)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--presses", default="KnormPress,SnapKVPress,ExpectedAttentionPress")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    model.set_attn_implementation("sdpa")
    examples = read_tasks(args.tasks, args.n)
    presses = [p for p in args.presses.split(",") if p]
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok, device=model.device)

    rows = []
    # kvpress first, with the model's own SDPA attention
    for ex in examples:
        for name in ["none"] + presses:
            press = None if name == "none" else getattr(kvpress, name)(compression_ratio=args.ratio)
            rows.append(dict(id=ex["id"], press=name, side="kvpress", **kvpress_side(pipe, model, tok, ex, press)))
        print(f"example {ex['id']}: kvpress done", flush=True)
    # ours: the protocol with the adapted presses through the ragged cache
    use_ragged_attention(model)
    pols = {f"kvpress:{p}": make_policy(f"kvpress:{p}") for p in presses}
    methods = [Method("none", "uniform", args.ratio, None)] + [Method(p, "uniform", args.ratio, None) for p in pols]
    for ex in examples:
        t0 = time.perf_counter()
        out = run_example(model, tok, ex, prompt_ids(tok, ex), methods, pols, 0, False)
        for r in out:
            name = "none" if r["policy"] == "none" else r["policy"].split(":", 1)[1]
            rows.append(dict(id=ex["id"], press=name, side="ours", answer=r["answer"], score=r["score"],
                             bytes=r["physical_bytes"], entries=r["kept_entries"],
                             seconds=r["prefill_s"] + r["scoring_s"] + r["evict_s"] + r["decode_s"]))
        print(f"example {ex['id']}: ours {time.perf_counter() - t0:.1f} s", flush=True)

    def pick(side, name):
        return {r["id"]: r for r in rows if r["side"] == side and r["press"] == name}

    print(f"\nSmolLM2 ({loaded.name}), transformers {TRANSFORMERS_VERSION}, kvpress {kvpress.__version__ if hasattr(kvpress, '__version__') else '0.5.5'}, "
          f"{len(examples)} examples of {args.tasks}, compression ratio {args.ratio}\n")
    print("| press | kvpress score | ours score | same answer | kvpress KiB | ours KiB | kvpress entries | ours entries | kvpress s | ours s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ["none"] + presses:
        a, b = pick("kvpress", name), pick("ours", name)
        ids = sorted(set(a) & set(b))
        same = sum(a[i]["answer"].strip() == b[i]["answer"].strip() for i in ids)
        mean = lambda d, k: statistics.mean(d[i][k] for i in ids)  # noqa: E731
        print(f"| {name} | {mean(a, 'score'):.3f} | {mean(b, 'score'):.3f} | {same}/{len(ids)} | "
              f"{mean(a, 'bytes') / 1024:.0f} | {mean(b, 'bytes') / 1024:.0f} | {mean(a, 'entries'):.0f} | "
              f"{mean(b, 'entries'):.0f} | {mean(a, 'seconds'):.2f} | {mean(b, 'seconds'):.2f} |")
    same_ctx = all(r["same_context_ids"] for r in rows if r["side"] == "kvpress")
    print(f"\ncontext token ids identical to kvpress's pipeline on every example: {same_ctx}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
