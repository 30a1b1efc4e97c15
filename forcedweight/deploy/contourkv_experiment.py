"""The ContourKV experiments (issue 12): the paired comparison at matched physical bytes, and the
enforcement experiment (one fixed selection stored four ways).

**Paired** (:func:`paired_experiment`): ``evaluate`` (the issue-11 harness, resumable by (id, policy,
allocator, ratio, query_aware)) on one task file, in groups written to ``OUT/<group>/``:

- ``contourkv``: ``kvzip`` and ``snapkv`` scores with the ``contourkv`` allocator;
- ``kvzip``: ``kvzip`` with ``global`` (KVzip's own), ``uniform`` and ``adakv``;
- ``uniform``: ``snapkv``, ``expected_attention`` and ``compactor`` (when registered) with ``uniform``.

With ``baseline`` (an evaluate output directory of the same task file, e.g. the issue-11 benchmark's)
the opponents' rows are read from it instead of recomputed, so both share the same examples and
bytes. The rows are merged into ``OUT/results.parquet``, the harness's report is written to
``OUT/report/`` (``evaluate_report.write_report``), and ``OUT/contourkv.md`` / ``contourkv.csv`` hold,
per opponent and metric: wins / losses / ties over examples with the sign test and the bootstrap
interval (``evaluate_report.paired``, i.e. ``core.stats.paired_comparison``), the per-condition record
(a condition = (task, ratio): a win / loss when its 95% interval excludes 0, else a tie) and the
physical-bytes ratio per ratio.

**Enforcement** (:func:`enforcement_experiment`): one selection (policy + allocator at a ratio)
answered from the ragged cache, the masked storage, the token-level union of the heads' sets
(unenforced) and the token-level nominal budget (enforced), with the physical bytes of each
(:mod:`forcedweight.deploy.enforcement`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight.deploy.allocate import budget_for, check_compression_ratio, evict, make_allocator, select
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.enforcement import (dense_bytes, masked_attention, masked_storage, token_cache, token_topk,
                                             token_union)
from forcedweight.deploy.evaluate import RESULT_SCHEMA, check_forced_fit, evaluate, run_inputs
from forcedweight.deploy.evaluate_protocol import continuation_nll, greedy_answer, prompt_ids
from forcedweight.deploy.evaluate_report import _rows, paired, write_report
from forcedweight.deploy.policies import POLICIES, make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import CONTINUATION_TASK, metric_for_task, read_tasks, score_answer
from forcedweight.errors import InputError
from forcedweight.models import loaded_model, model_identity

RATIOS = (0.5, 0.75, 0.9)
CONTOUR = ("kvzip/contourkv", "snapkv/contourkv")
BYTES_TOLERANCE = 0.02


def groups() -> dict[str, tuple[list[str], list[str]]]:
    """The evaluate groups: name -> (policies, allocators)."""
    uniform = [p for p in ("snapkv", "expected_attention", "compactor") if p in POLICIES]
    return {"contourkv": (["kvzip", "snapkv"], ["contourkv"]), "kvzip": (["kvzip"], ["global", "uniform", "adakv"]),
            "uniform": (uniform, ["uniform"])}


def paired_experiment(model, tasks, out, ratios: Sequence[float] = RATIOS, max_examples: int | None = None,
                      baseline=None, only: Sequence[str] | None = None, seed: int = 0, progress: bool = True) -> Path:
    """Run (or resume) the groups, merge, report; return ``OUT/contourkv.md`` (module docstring).

    ``only``: run just these groups (e.g. to run them as parallel processes), then merge what exists.
    """
    out = Path(out)
    todo = groups()
    ratios = [check_compression_ratio(r) for r in ratios]  # the ratios and the task file before any model loads
    read_tasks(tasks, max_examples)
    if baseline is not None:
        _baseline_results(baseline)  # before any group runs
        todo = {"contourkv": todo["contourkv"]}
    if only:
        bad = sorted(set(only) - set(groups()))
        if bad:
            raise InputError(f"--only: unknown group(s) {', '.join(bad)} (known: {', '.join(groups())})")
        todo = {k: v for k, v in todo.items() if k in only}
    loaded = loaded_model(model, "the ContourKV experiment") if todo else None
    for name, (pols, allocs) in todo.items():
        evaluate(loaded, tasks, out / name, pols, allocs, compression_ratios=list(ratios), max_examples=max_examples,
                 seed=seed, progress=progress, report=False, quiet=not progress)
    return merge(out, ratios, baseline)


def _baseline_results(baseline) -> Path:
    """``baseline/results.parquet``; InputError naming ``--baseline`` when it is not there."""
    path = Path(baseline) / "results.parquet"
    if not path.is_file():
        raise InputError(f"--baseline {baseline}: no results.parquet there (give an evaluate output directory)")
    return path


def merge(out, ratios: Sequence[float] | None = None, baseline=None) -> Path:
    """Merge ``OUT/*/results.parquet`` (and ``baseline``'s opponent rows) into ``OUT/results.parquet``
    on the examples ContourKV ran; write the report and the ContourKV tables.

    ``ratios``: the compression ratios to keep; None keeps every ratio the ContourKV rows hold. Ratios
    no ContourKV row holds are refused (InputError), so a merge never empties a finished run's tables."""
    out = Path(out)
    files = []
    # with a baseline the opponents' rows are its own: groups an earlier run left in OUT are not read
    names = ("contourkv",) if baseline is not None else tuple(groups())
    reference = run_inputs(out / "contourkv")
    for group in sorted(p for p in out.iterdir() if p.is_dir() and p.name in names) if out.is_dir() else []:
        if reference is not None and run_inputs(group) != reference:
            raise InputError(f"{group}: run with another task file, model or seed than {out / 'contourkv'}; rerun it "
                             f"(--only {group.name}) or remove it")
        # a finished group's results, else the parts of one still running (each a finished example)
        files += [group / "results.parquet"] if (group / "results.parquet").is_file() else \
            sorted((group / ".results.parquet.parts").glob("part-*.parquet"))
    if baseline is not None:
        files.append(_baseline_results(baseline))
        if reference is not None and run_inputs(baseline) != reference:
            raise InputError(f"--baseline {baseline}: an evaluate run of another task file, model or seed than "
                             f"{out / 'contourkv'} (the pairs need the same examples and model)")
    tables = [pq.read_table(f) for f in files if f.is_file()]
    if not tables:
        raise InputError(f"{out}: no results to merge (run the experiment first)")
    rows = pa.concat_tables([t.select(RESULT_SCHEMA.names).cast(RESULT_SCHEMA) for t in tables]).to_pylist()
    ours = {r["id"] for r in rows if f"{r['policy']}/{r['allocator']}" in CONTOUR}
    held = {round(float(r["compression_ratio"]), 4) for r in rows if f"{r['policy']}/{r['allocator']}" in CONTOUR}
    wanted = held if ratios is None else {round(float(r), 4) for r in ratios}
    if not wanted & held:
        raise InputError(f"--compression-ratio: {sorted(wanted)} not among the ratios ContourKV ran in {out} "
                         f"({sorted(held) or 'none'})")
    seen, merged = set(), []
    for r in rows:
        key = (r["id"], r["policy"], r["allocator"], round(float(r["compression_ratio"]), 4), r["query_aware"])
        if r["id"] in ours and key not in seen and (r["policy"] == "none" or key[3] in wanted):
            seen.add(key)
            merged.append(r)
    results = out / "results.parquet"
    fio.write_table_atomic(pa.Table.from_pylist(merged, schema=RESULT_SCHEMA), results)
    write_report(results, out / "report")
    records = contourkv_table(_rows(results))
    _write(records, out / "contourkv.csv")
    md = out / "contourkv.md"
    with fio.atomic_path(md) as tmp:
        tmp.write_text(markdown(records, results))
    return md


def _oriented(p: dict, ours: str) -> dict:
    """A paired record with ``ours`` as method a (wins = ours better)."""
    if p["method_a"] == ours:
        return dict(p)
    q = dict(p, method_a=p["method_b"], method_b=p["method_a"], wins=p["losses"], losses=p["wins"],
             mean_diff=-p["mean_diff"], ci_lo=-p["ci_hi"], ci_hi=-p["ci_lo"], bytes_ratio=1.0 / p["bytes_ratio"])
    return q


def contourkv_table(rows: list[dict], n_boot: int = 2000) -> list[dict]:
    """Per (ContourKV method, opponent, metric): example-level record, condition-level record, bytes."""
    methods = {r["method"] for r in rows}
    out = []
    for ours in [m for m in CONTOUR if m in methods]:
        for opp in sorted(methods - {ours, "none"} - set(CONTOUR)) + [m for m in CONTOUR if m != ours and m in methods]:
            sub = [r for r in rows if r["method"] in (ours, opp)]
            for metric in sorted({r["metric"] for r in sub}):
                pm = [r for r in sub if r["metric"] == metric]
                agg = [_oriented(p, ours) for p in paired(pm, n_boot=n_boot)]
                if not agg:
                    continue
                a = agg[0]
                cells, losses_at = {"win": 0, "loss": 0, "tie": 0}, []
                for task, ratio in sorted({(r["task"], r["ratio"]) for r in pm}):
                    c = [_oriented(p, ours) for p in paired([r for r in pm if r["task"] == task and r["ratio"] == ratio],
                                                            n_boot=n_boot)]
                    if not c:
                        continue
                    c = c[0]
                    kind = "win" if c["ci_lo"] > 0 else "loss" if c["ci_hi"] < 0 else "tie"
                    cells[kind] += 1
                    if c["mean_diff"] < 0:
                        losses_at.append(f"{task}@{ratio:g}({c['mean_diff']:+.3g}{'*' if kind == 'loss' else ''})")
                byte_ratios = {}
                for ratio in sorted({r["ratio"] for r in pm}):
                    b = {m: np.mean([r["physical_bytes"] for r in pm if r["method"] == m and r["ratio"] == ratio])
                         for m in (ours, opp)}
                    byte_ratios[ratio] = float(b[ours] / b[opp])
                dev = max(abs(v - 1.0) for v in byte_ratios.values())
                out.append({"contourkv": ours, "opponent": opp, "metric": metric, "n": a["n"], "wins": a["wins"],
                            "losses": a["losses"], "ties": a["ties"], "sign_test_p": a["sign_test_p"],
                            "mean_diff": a["mean_diff"], "ci_lo": a["ci_lo"], "ci_hi": a["ci_hi"],
                            "cond_wins": cells["win"], "cond_losses": cells["loss"], "cond_ties": cells["tie"],
                            "bytes_ratio": "/".join(f"{byte_ratios[r]:.4f}" for r in sorted(byte_ratios)),
                            "bytes_within_2pct": bool(dev <= BYTES_TOLERANCE),
                            "behind_at": " ".join(losses_at)})
    return out


def _write(records: list[dict], path: Path) -> None:
    if records:
        fio.write_table_atomic(pa.Table.from_pylist(records), path.with_suffix(".parquet"))
        with fio.atomic_path(path) as tmp:
            cols = list(records[0])
            lines = [",".join(cols)] + [",".join(f'"{r[c]}"' if isinstance(r[c], str) else f"{r[c]:.6g}"
                                                 if isinstance(r[c], float) else str(r[c]) for c in cols) for r in records]
            tmp.write_text("\n".join(lines) + "\n")


def _f(v, d=3) -> str:
    return "—" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{d}f}"


def markdown(records: list[dict], source) -> str:
    lines = ["# ContourKV paired comparison at matched physical bytes", "", f"Results: `{source}`", "",
             "wins/losses/ties over (task, ratio, example) triples (a win = ContourKV better; for ce_nats lower "
             "is better); mean diff > 0 favours ContourKV, 95% bootstrap interval; conditions = (task, ratio) "
             "cells, won/lost when their interval excludes 0; bytes = ContourKV / opponent mean physical bytes at "
             "each ratio; behind at = cells where ContourKV's mean is worse (* significant).", "",
             "| ContourKV | opponent | metric | n | W | L | T | sign p | mean diff [95% CI] | cond W/L/T | bytes | behind at |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['contourkv']} | {r['opponent']} | {r['metric']} | {r['n']} | {r['wins']} | {r['losses']} | "
                     f"{r['ties']} | {_f(r['sign_test_p'])} | {_f(r['mean_diff'])} [{_f(r['ci_lo'])}, {_f(r['ci_hi'])}] | "
                     f"{r['cond_wins']}/{r['cond_losses']}/{r['cond_ties']} | {r['bytes_ratio']} | {r['behind_at']} |")
    return "\n".join(lines) + "\n"


# --- enforcement ---------------------------------------------------------------------------------

STORAGES = ("ragged", "masked", "token_union", "token_topk")


def _answer(model, tok, ex, pr, cache, n, logits_last) -> tuple[str, float]:
    if ex["task"] == CONTINUATION_TASK:
        return "", continuation_nll(model, cache, logits_last, pr.continuation, n)
    ids = greedy_answer(model, cache, pr.question, n, ex["max_new_tokens"])
    answer = tok.decode(ids, skip_special_tokens=True)
    return answer, score_answer(ex["task"], answer, ex["answer"])


def enforcement_example(model, tok, ex: dict, policy, allocator: str, ratios: Sequence[float]) -> list[dict]:
    """The four storages (and the full cache) of one example's selections (module docstring)."""
    pr = prompt_ids(tok, ex)
    prefill = prefill_context(model, tok, pr.context)
    n, L, H = prefill.n_tokens, prefill.n_layers, prefill.n_kv_heads
    base = {"id": ex["id"], "task": ex["task"], "metric": metric_for_task(ex["task"]), "policy": policy.name,
            "allocator": allocator, "context_tokens": n, "all_entries": n * L * H}
    use_ragged_attention(model)
    full = prefill.ragged_cache()
    full_bytes = dense_bytes(prefill.cache)  # the full cache held densely (the reference of every share)
    answer, score = _answer(model, tok, ex, pr, full, n, prefill.logits_last)
    rows = [dict(base, storage="none", compression_ratio=0.0, score=float(score), answer=answer,
                 physical_bytes=full_bytes, kept_entries=n * L * H, dense_bytes=full_bytes)]
    entry = full_bytes // (n * L * H)  # bytes of one (layer, KV head, entry): K and V
    sc = policy.padded_scores(prefill)
    for ratio in ratios:
        total = budget_for(n, L, H, ratio)
        alloc = make_allocator(allocator)
        keep = alloc.keep(sc, total, prefill=prefill) if getattr(alloc, "needs_prefill", False) else \
            select(sc, alloc.allocate(sc, total))
        counts = np.array([[len(k) for k in heads] for heads in keep])
        stores = {}
        ragged = prefill.ragged_cache()
        evict(ragged, keep)
        stores["ragged"] = (ragged, None, int(ragged.physical_bytes()), int(ragged.entries()))
        ms = masked_storage(prefill, keep)
        stores["masked"] = (ms.cache, ms.keep, ms.physical_bytes(), ms.entries())
        for name, tokens in (("token_union", token_union(keep)), ("token_topk", token_topk(sc, counts))):
            tc = token_cache(prefill, tokens)
            stores[name] = (tc, None, dense_bytes(tc), int(sum(len(t) for t in tokens)) * H)
        for name in STORAGES:
            cache, masks, nbytes, kept = stores[name]
            if name == "ragged":
                answer, score = _answer(model, tok, ex, pr, cache, n, prefill.logits_last)
            else:
                with masked_attention(model, masks):
                    answer, score = _answer(model, tok, ex, pr, cache, n, prefill.logits_last)
            rows.append(dict(base, storage=name, compression_ratio=float(ratio), score=float(score), answer=answer,
                             physical_bytes=int(nbytes), kept_entries=int(kept), dense_bytes=full_bytes,
                             nominal_bytes=int(total) * entry))
    return rows


def enforcement_experiment(model, tasks, out, policy: str = "kvzip", allocator: str = "global",
                           ratios: Sequence[float] = RATIOS, max_examples: int | None = None,
                           progress: bool = True) -> Path:
    """Run the enforcement experiment; write ``OUT/enforcement.parquet`` and ``OUT/enforcement.md``.

    Resumable: every finished example is a part in ``OUT/.enforcement.parts`` (with the run's
    fingerprint, ``io.prepare_work_dir``); a rerun of the same inputs continues after the last one. A
    second run on the same ``OUT`` is refused while the first holds it (``io.output_lock``).
    """
    out = Path(out)
    make_allocator(allocator)
    pol = make_policy(policy)
    ratios = list(dict.fromkeys(check_compression_ratio(r) for r in ratios))  # a repeated ratio: one setting
    examples = read_tasks(tasks, max_examples)
    target = out / "enforcement.parquet"
    fio.check_output_file(target)
    with fio.output_lock(out, "contourkv enforcement"):
        loaded = loaded_model(model, "the ContourKV experiment")
        for ex in examples:  # a ratio that cannot hold the policy's sinks + recent window: before any work
            n = prompt_ids(loaded.tokenizer, ex).n_context
            for ratio in ratios:
                check_forced_fit(pol, policy, n, budget_for(n, 1, 1, ratio), f"--compression-ratio {ratio}", ex["id"])
        parts = out / ".enforcement.parts"
        state = {"tasks": fio.file_digest(tasks), "ids": [ex["id"] for ex in examples], "policy": policy,
                 "allocator": allocator, "ratios": ratios, "model": model_identity(loaded)}
        done = fio.prepare_work_dir(parts, state, fio.stderr_notes())
        with fio.progress("contourkv enforcement", enabled=progress) as bar:
            task = bar.add_task("examples", total=len(examples), completed=len(done))
            for i, ex in enumerate(examples):
                name = f"part-{i:06d}.parquet"
                if name in done:
                    continue
                t = time.perf_counter()
                rows = enforcement_example(loaded.model, loaded.tokenizer, ex, pol, allocator, ratios)
                for r in rows:
                    r["seconds"] = time.perf_counter() - t  # the example's wall time, on each of its rows
                fio.write_table_atomic(pa.Table.from_pylist(rows), parts / name)
                done[name] = len(rows)
                fio.write_work_state(parts, state, done)
                bar.advance(task)
        rows = [r for name in sorted(done) for r in pq.read_table(parts / name).to_pylist()]
        fio.write_table_atomic(pa.Table.from_pylist(rows), target)
        md = out / "enforcement.md"
        with fio.atomic_path(md) as tmp:
            tmp.write_text(enforcement_markdown(rows, f"{policy}/{allocator}"))
        shutil.rmtree(parts, ignore_errors=True)
    return md


def enforcement_markdown(rows: list[dict], method: str) -> str:
    """Mean score and physical bytes (share of the dense cache) per storage x ratio x metric; the
    points lost by enforcing the nominal budget at token level (token_union - token_topk)."""
    lines = [f"# Enforcement: one fixed selection ({method}) stored four ways", "",
             "score: string match x 100 (points) or continuation cross-entropy (nats/token, lower is better); "
             "bytes: mean physical bytes held / the dense cache's.", "",
             "| metric | ratio | storage | n | score | bytes share | kept entries share |", "|---|---|---|---|---|---|---|"]
    for metric in sorted({r["metric"] for r in rows}):
        scale = 1.0 if metric == "ce_nats" else 100.0
        for ratio in sorted({r["compression_ratio"] for r in rows}):
            for st in ("none",) + STORAGES:
                g = [r for r in rows if r["metric"] == metric and r["compression_ratio"] == ratio and r["storage"] == st]
                if not g:
                    continue
                share = np.mean([r["physical_bytes"] / r["dense_bytes"] for r in g])
                kept = np.mean([r["kept_entries"] / r["all_entries"] for r in g])
                lines.append(f"| {metric} | {ratio:g} | {st} | {len(g)} | {scale * np.mean([r['score'] for r in g]):.3f} | "
                             f"{share:.3f} | {kept:.3f} |")
            u = [r for r in rows if r["metric"] == metric and r["compression_ratio"] == ratio and r["storage"] == "token_union"]
            k = [r for r in rows if r["metric"] == metric and r["compression_ratio"] == ratio and r["storage"] == "token_topk"]
            if u and k and ratio > 0:
                lines.append(f"| {metric} | {ratio:g} | **enforcing the nominal budget (union - topk)** | {len(u)} | "
                             f"{scale * (np.mean([r['score'] for r in u]) - np.mean([r['score'] for r in k])):+.3f} | | |")
    return "\n".join(lines) + "\n"


__all__ = ["CONTOUR", "RATIOS", "STORAGES", "contourkv_table", "enforcement_example", "enforcement_experiment",
           "groups", "markdown", "merge", "paired_experiment"]
