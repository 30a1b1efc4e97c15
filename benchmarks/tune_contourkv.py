"""Fix ContourKV's two parameters (beta, recent_floor) on continuation cross-entropy of a SEPARATE task
file (its own seed and length, never the evaluation's) or of OTHER TEXTS (``--texts``: text files
none of the evaluation's contexts come from, e.g. the project's own docs/*.md), with the kvzip score.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tune_contourkv.py --tasks TUNE.jsonl --out tune.csv
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tune_contourkv.py --texts 'docs/*.md' --tokens 1000 --out tune.csv

``--texts``: each file (sorted, at least ``tokens + 128`` tokens long) gives one continuation example:
its first ``tokens`` tokens are the context, the next 128 the continuation; the examples are written
beside ``--out`` as ``<out>.tasks.jsonl`` so the run can be repeated from them.

For every example: one prefill, kvzip scored once, then for every (beta, recent_floor) and ratio the
ContourKV selection evicted in the ragged cache and the continuation's mean NLL teacher-forced
(the harness's ``continuation_nll``); ``kvzip/global`` (beta = 0, floor 0) is the reference row.
Prints the mean CE delta against kvzip/global per setting, pooled over examples and ratios.
"""

from __future__ import annotations

import argparse
import csv
import glob
import itertools
import sys
import time

import numpy as np
import torch

from forcedweight.deploy.allocate import budget_for, evict
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.contourkv import ContourKVAllocator
from forcedweight.deploy.evaluate_protocol import continuation_nll, prompt_ids
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import CONTINUATION_TASK, read_tasks, write_tasks
from forcedweight.models import load_model


def text_examples(paths: list[str], tokenizer, tokens: int, continuation_tokens: int = 128) -> list[dict]:
    """One continuation example per text file long enough (kvpress columns, as ``forcedweight tasks``)."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            ids = tokenizer.encode(f.read(), add_special_tokens=False)
        if len(ids) < tokens + continuation_tokens:
            continue
        out.append({"context": tokenizer.decode(ids[:tokens]), "question": "", "answer_prefix": "",
                    "answer": [tokenizer.decode(ids[tokens:tokens + continuation_tokens])], "max_new_tokens": 0,
                    "task": CONTINUATION_TASK, "id": f"text-{len(out)}:{path}"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=None)
    ap.add_argument("--texts", default=None, help="glob of text files: continuation examples from them")
    ap.add_argument("--tokens", type=int, default=1000, help="context tokens per --texts example")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policy", default="kvzip")
    ap.add_argument("--betas", default="0,0.05,0.1,0.25,0.5")
    ap.add_argument("--floors", default="0,8")
    ap.add_argument("--ratios", default="0.75,0.9")
    ap.add_argument("--max-examples", type=int, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    loaded = load_model("smollm2")
    model, tok = loaded.model, loaded.tokenizer
    use_ragged_attention(model)
    if (args.tasks is None) == (args.texts is None):
        ap.error("give exactly one of --tasks and --texts")
    if args.texts is not None:
        examples = text_examples(sorted(glob.glob(args.texts)), tok, args.tokens)[: args.max_examples]
        write_tasks(examples, args.out + ".tasks.jsonl")
    else:
        examples = [e for e in read_tasks(args.tasks, args.max_examples) if e["task"] == CONTINUATION_TASK]
    betas = [float(b) for b in args.betas.split(",")]
    floors = [int(f) for f in args.floors.split(",")]
    ratios = [float(r) for r in args.ratios.split(",")]
    pol = make_policy(args.policy)
    rows = []
    for ex in examples:
        t0 = time.perf_counter()
        pr = prompt_ids(tok, ex)
        prefill = prefill_context(model, tok, pr.context)
        sc = pol.padded_scores(prefill)
        n = prefill.n_tokens
        for ratio, beta, floor in itertools.product(ratios, betas, floors):
            total = budget_for(n, prefill.n_layers, prefill.n_kv_heads, ratio)
            cache = prefill.ragged_cache()
            evict(cache, ContourKVAllocator(beta=beta, recent_floor=floor).keep(sc, total, prefill=prefill))
            ce = continuation_nll(model, cache, prefill.logits_last, pr.continuation, n)
            rows.append({"id": ex["id"], "ratio": ratio, "beta": beta, "recent_floor": floor, "ce": ce,
                         "physical_bytes": int(cache.physical_bytes())})
        print(f"{ex['id']}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    ref = {(r["id"], r["ratio"]): r["ce"] for r in rows if r["beta"] == 0 and r["recent_floor"] == 0}
    print("beta  floor  mean CE - kvzip/global (nats/token)   wins/losses")
    for beta, floor in itertools.product(betas, floors):
        d = np.array([r["ce"] - ref[(r["id"], r["ratio"])] for r in rows if r["beta"] == beta and r["recent_floor"] == floor])
        print(f"{beta:<5} {floor:<6} {d.mean():+.4f}   {(d < 0).sum()}/{(d > 0).sum()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
