"""Query-leak audit: the same policy ranked with the question visible and not (kvpress ``query_aware``).

Two runs of the evaluate harness (:func:`forcedweight.deploy.evaluate.evaluate`) on the same tasks,
policies, allocators and ratios: ``query_aware=False`` (the policy scores the context only; the
question comes after eviction) and ``query_aware=True`` (context + question compressed together:
the policy's attention statistics include the question's tokens). The rows are paired on
(id, policy, allocator, compression ratio) → ``leak.parquet``; :func:`leak_margins` gives the paired
margin ``aware - agnostic`` per (policy, allocator, ratio, task) with a sign test and a bootstrap
interval (``core.stats.paired_comparison``; for cross-entropy, lower is better, so a positive margin
always means the question helped).

:func:`kept_context_sets` is the mechanism in one function: the kept context positions of one
policy at one ratio, with or without the question in the prefill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight.core.stats import paired_comparison
from forcedweight.deploy.allocate import budget_for, make_allocator
from forcedweight.deploy.audit.memory import kept_sets
from forcedweight.deploy.evaluate import evaluate
from forcedweight.deploy.evaluate_protocol import prompt_ids
from forcedweight.deploy.policies import POLICIES, make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import higher_is_better, metric_for_task

#: the policies of the issue; ``contourkv`` is an allocator (``--allocator contourkv``), audited with them
LEAK_POLICIES = ("snapkv", "tova", "h2o", "kvzip", "expected_attention")

LEAK_SCHEMA = pa.schema([
    ("policy", pa.string()), ("allocator", pa.string()), ("compression_ratio", pa.float64()),
    ("task", pa.string()), ("metric", pa.string()), ("id", pa.string()),
    ("score_query_agnostic", pa.float64()), ("score_query_aware", pa.float64()),
    ("kept_entries_query_agnostic", pa.int64()), ("kept_entries_query_aware", pa.int64()),
])
MARGIN_SCHEMA = pa.schema([
    ("policy", pa.string()), ("allocator", pa.string()), ("compression_ratio", pa.float64()),
    ("task", pa.string()), ("metric", pa.string()), ("n", pa.int64()), ("mean_agnostic", pa.float64()),
    ("mean_aware", pa.float64()), ("margin", pa.float64()), ("lo", pa.float64()), ("hi", pa.float64()),
    ("wins", pa.int64()), ("losses", pa.int64()), ("ties", pa.int64()), ("pvalue", pa.float64()),
    ("note", pa.string()),
])


def default_policies() -> list[str]:
    """The issue's leak policies that are registered now."""
    return [p for p in LEAK_POLICIES if p in POLICIES]


def kept_context_sets(model, tokenizer, example: dict, policy: str, compression_ratio: float,
                      query_aware: bool, allocator: str = "uniform", **options) -> list[list[np.ndarray]]:
    """The kept positions < N (the context's own tokens) per layer and KV head, for one example.

    With ``query_aware`` the prefill is context + question (as the harness does) and the budget is
    that of the longer prefill; only the kept positions inside the original context are returned.
    """
    n_ctx = prompt_ids(tokenizer, example, False).n_context
    pr = prompt_ids(tokenizer, example, query_aware)
    prefill = prefill_context(model, tokenizer, pr.context)
    pol = make_policy(policy, **options)
    sc = pol.padded_scores(prefill, compression_ratio=compression_ratio)
    total = budget_for(prefill.n_tokens, prefill.n_layers, prefill.n_kv_heads, compression_ratio)
    keep = kept_sets(make_allocator(allocator), sc, total, prefill)
    return [[k[k < n_ctx] for k in layer] for layer in keep]


def leak_rows(agnostic: pa.Table, aware: pa.Table) -> pa.Table:
    """Pair two evaluate result tables on (id, policy, allocator, compression ratio) → LEAK_SCHEMA.

    The query-aware run's compression ratio is that of its longer prefill; pairing uses the ratio
    asked for (both runs were given the same list).
    """
    def key(r):
        return (r["id"], r["policy"], r["allocator"], round(float(r["compression_ratio"]), 12))

    aw = {key(r): r for r in aware.to_pylist()}
    out = []
    for r in agnostic.to_pylist():
        if r["policy"] == "none":
            continue
        q = aw.get(key(r))
        if q is None:
            continue
        out.append({"policy": r["policy"], "allocator": r["allocator"],
                    "compression_ratio": float(r["compression_ratio"]), "task": r["task"],
                    "metric": r["metric"], "id": r["id"], "score_query_agnostic": float(r["score"]),
                    "score_query_aware": float(q["score"]), "kept_entries_query_agnostic": int(r["kept_entries"]),
                    "kept_entries_query_aware": int(q["kept_entries"])})
    return pa.Table.from_pylist(out, schema=LEAK_SCHEMA)


def leak_margins(table: pa.Table, n_boot: int = 2000, seed: int = 0) -> pa.Table:
    """Paired margin (aware - agnostic, sign flipped for cross-entropy) per policy/allocator/ratio/task."""
    groups: dict[tuple, list[dict]] = {}
    for r in table.to_pylist():
        groups.setdefault((r["policy"], r["allocator"], r["compression_ratio"], r["task"], r["metric"]), []).append(r)
    out = []
    for (pol, alloc, ratio, task, metric), rs in sorted(groups.items()):
        a = np.array([r["score_query_aware"] for r in rs])
        b = np.array([r["score_query_agnostic"] for r in rs])
        pc = paired_comparison(a, b, higher_is_better=higher_is_better(metric), n_boot=n_boot, seed=seed)
        out.append({"policy": pol, "allocator": alloc, "compression_ratio": ratio, "task": task, "metric": metric,
                    "n": pc.n, "mean_agnostic": float(np.nanmean(b)), "mean_aware": float(np.nanmean(a)),
                    "margin": pc.mean_diff, "lo": pc.lo, "hi": pc.hi, "wins": pc.wins, "losses": pc.losses,
                    "ties": pc.ties, "pvalue": pc.pvalue, "note": pc.note})
    return pa.Table.from_pylist(out, schema=MARGIN_SCHEMA)


def leak_audit(model, tasks, out, policies: Sequence[str], compression_ratios: Sequence[float],
               allocators: Sequence[str] = ("uniform",), max_examples: int | None = None, seed: int = 0,
               progress: bool = True, quiet: bool = False) -> Path:
    """Run the harness query-agnostic and query-aware into ``out/leak/{agnostic,aware}`` (each resumable)
    and write ``out/leak.parquet`` (LEAK_SCHEMA) and ``out/leak_margins.parquet``; return the former.

    ``model`` is whatever :func:`~forcedweight.deploy.evaluate.evaluate` takes (pass a LoadedModel to
    load it once).
    """
    out = Path(out)
    tables = {}
    for mode, aware in (("agnostic", False), ("aware", True)):
        res = evaluate(model, tasks, out / "leak" / mode, list(policies), list(allocators),
                       compression_ratios=list(compression_ratios), max_examples=max_examples,
                       query_aware=aware, seed=seed, progress=progress, report=False, quiet=quiet)
        tables[mode] = pq.read_table(res)
    table = leak_rows(tables["agnostic"], tables["aware"])
    path = out / "leak.parquet"
    fio.write_table_atomic(table, path)
    fio.write_table_atomic(leak_margins(table, seed=seed), out / "leak_margins.parquet")
    return path


__all__ = ["LEAK_POLICIES", "LEAK_SCHEMA", "MARGIN_SCHEMA", "default_policies", "kept_context_sets", "leak_audit",
           "leak_margins", "leak_rows", "metric_for_task"]
