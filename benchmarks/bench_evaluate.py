"""Benchmark of the evaluate harness: seconds per example split into prefill, scoring, eviction and
decode, against a full-cache ``model.generate`` on the same prompts in the same run; KVzip's scoring
as a multiple of one prefill.

Per example (RULER ``niah_single_1`` at ``--tokens``, greedy answers of up to ``--max-new-tokens``):
``model.generate`` over context + question (transformers' SDPA attention, DynamicCache; its time
includes its own prefill), then the harness's protocol (``forcedweight.deploy.evaluate.run_example``):
one prefill, the full cache (``none``) and every ``--policies`` x uniform at ``--ratio``. Medians
over the examples; the first example is a warm-up and not counted unless ``--examples 1``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_evaluate.py [--tokens 1000] [--examples 3]
        [--max-new-tokens 12] [--ratio 0.5] [--policies knorm,snapkv,expected_attention,kvzip]
        [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate import Method, run_example
from forcedweight.deploy.evaluate_protocol import prompt_ids
from forcedweight.deploy.policies import POLICIES, make_policy
from forcedweight.deploy.tasks import make_tasks
from forcedweight.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--examples", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--policies", default="knorm,snapkv,expected_attention,kvzip")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policies = [p for p in args.policies.split(",") if p and p in POLICIES]
    lm = load_model()
    tok = lm.tokenizer
    examples = make_tasks(tok, ["niah_single_1"], args.tokens, args.examples, seed=0,
                          max_new_tokens=args.max_new_tokens)
    ref = load_model().model  # transformers' own attention, for model.generate
    model = use_ragged_attention(lm.model)
    pols = {p: make_policy(p) for p in policies}
    methods = [Method("none", "none", 0.0)] + [Method(p, "uniform", args.ratio) for p in policies]
    records = []
    for i, ex in enumerate(examples):
        pr = prompt_ids(tok, ex)
        ids = torch.cat([pr.context, pr.question], 1)
        t = time.perf_counter()
        with torch.inference_mode():
            gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                               do_sample=False)
        generate_s = time.perf_counter() - t
        rows = run_example(model, tok, ex, pr, methods, pols, 0, False)
        none = rows[0]
        same = none["answer"] == tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        rec = {"example": ex["id"], "context_tokens": none["context_tokens"], "generate_s": generate_s,
               "generate_tokens": int(gen.shape[1] - ids.shape[1]), "none_equals_generate": same,
               "prefill_s": none["prefill_s"], "none_decode_s": none["decode_s"],
               "none_answer_tokens": none["answer_tokens"]}
        for r in rows[1:]:
            rec[f"{r['policy']}_scoring_s"] = r["scoring_s"]
            rec[f"{r['policy']}_evict_s"] = r["evict_s"]
            rec[f"{r['policy']}_decode_s"] = r["decode_s"]
            rec[f"{r['policy']}_scoring_x_prefill"] = r["scoring_s"] / none["prefill_s"]
            cost = pols[r["policy"]].last_cost or {}
            if "prefill_multiple" in cost:  # KVzip: reconstruction tokens forwarded / context tokens
                rec[f"{r['policy']}_forward_tokens_x_context"] = float(cost["prefill_multiple"])
        records.append(rec)
        print(json.dumps(rec), flush=True)
    counted = records[1:] if len(records) > 1 else records
    med = {k: statistics.median(r[k] for r in counted) for k in counted[0] if isinstance(counted[0][k], float)}
    print(f"\nSmolLM2-135M, CPU, {args.threads} thread(s); niah_single_1 at {args.tokens} tokens, "
          f"greedy up to {args.max_new_tokens} tokens; medians over {len(counted)} example(s)")
    print(f"none answers equal model.generate: {sum(r['none_equals_generate'] for r in records)}/{len(records)}")
    print(f"model.generate (full cache, prefill included): {med['generate_s']:.2f} s")
    print(f"harness prefill (once per example):           {med['prefill_s']:.2f} s")
    print(f"harness none decode (question + answer):       {med['none_decode_s']:.2f} s")
    print("| policy | scoring s | x prefill | evict s | decode s | prefill + scoring + evict + decode s |")
    print("|---|---|---|---|---|---|")
    for k in med:
        if k.endswith("_forward_tokens_x_context"):
            print(f"{k[:-len('_forward_tokens_x_context')]}: forwards {med[k]:.2f} x the context's tokens")
    for p in policies:
        total = med["prefill_s"] + med[f"{p}_scoring_s"] + med[f"{p}_evict_s"] + med[f"{p}_decode_s"]
        print(f"| {p} | {med[p + '_scoring_s']:.3f} | {med[p + '_scoring_x_prefill']:.2f} | "
              f"{med[p + '_evict_s']:.3f} | {med[p + '_decode_s']:.2f} | {total:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "records": records, "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
