"""``evaluate``: eviction inside real generation with the budget physically enforced (issue 11).

For every example: tokenize (kvpress's split, :mod:`forcedweight.deploy.evaluate_protocol`), prefill
the context ONCE (``prefill_context``), then for every method (policy, allocator, budget setting):
a fresh copy of the cache (``Prefill.ragged_cache``, cloned, never re-prefilled); the policy's scores
(each policy scored once per example and reused across allocators and budgets); the allocator's
counts for the total budget (``budget_for``); the segmented top-s (``select``); ``evict`` in the
``RaggedKVCache`` (every evicted entry leaves memory); then the question fed at positions continuing
from the context length and a greedy answer through ``ragged_decode`` (or, for a continuation
example, its cross-entropy teacher-forced). ``none`` is the full cache (no eviction).

Budgets: ``compression_ratios`` (fraction of the context's entries evicted, kvpress's meaning) or
``budgets`` (mean kept entries per KV head; total = budget x layers x KV heads, capped at the
context). Bad input (missing columns, empty context, context + question over the model's window,
a ratio outside [0, 1), an unknown policy or allocator, a budget below sinks + recent) raises
InputError before anything is written.

Output ``DIR/results.parquet`` (atomic), one row per (example, policy, allocator, setting); the
work is resumable: each finished example is written as a part in the hidden ``DIR/.results.parquet.parts``
with a ``state.json`` fingerprint (tasks file, model, seed, options); a rerun reuses the parts whose
key (id, policy, allocator, compression_ratio / budget, query_aware) it needs and computes the rest.
A finished ``results.parquet`` keeps the fingerprint in its metadata, so a later run of the same
inputs with more methods (or a subset) reuses its rows and computes only the new methods.
Then ``DIR/report/`` (``forcedweight.deploy.evaluate_report``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight.deploy.allocate import (budget_for, budget_ratio, check_compression_ratio, evict, make_allocator,
                                          select)
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate_protocol import Prompt, continuation_nll, greedy_answer, prompt_ids
from forcedweight.deploy.evaluate_report import RESULT_SCHEMA, write_report  # (RESULT_SCHEMA: the rows it reads)
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import CONTINUATION_TASK, metric_for_task, read_tasks, score_answer
from forcedweight.errors import InputError, check_seed
from forcedweight.models import loaded_model, model_identity

NONE = "none"
STATE_VERSION = 2  # 2: the task file by content, the model by models.model_identity
#: the fingerprint of a run, kept in the metadata of its results.parquet
STATE_KEY = "forcedweight.evaluate.state"
#: test hook: SIGKILL this process after writing this many example parts (simulates a crash)
KILL_HOOK = "FORCEDWEIGHT_TEST_KILL_AFTER_EXAMPLES"

KEY = ("id", "policy", "allocator", "compression_ratio", "budget", "query_aware")


@dataclass(frozen=True)
class Method:
    """One evaluated method: a policy, an allocator and one budget setting (``ratio`` or ``budget``)."""

    policy: str
    allocator: str
    ratio: float | None = None
    budget: float | None = None

    def key(self, ex_id: str, query_aware: bool) -> tuple:
        """The resume key: (id, policy, allocator, ratio (None in budget mode), budget, query_aware)."""
        return (ex_id, self.policy, self.allocator, self.ratio if self.budget is None else None, self.budget,
                bool(query_aware))


def methods_for(policies: Sequence[str], allocators: Sequence[str], ratios: Sequence[float] | None,
                budgets: Sequence[float] | None, extra: Sequence[str] = ()) -> list[Method]:
    """The methods of a run: ``none`` once (the full cache), every other policy x allocator x setting,
    and every ``"policy/allocator"`` of ``extra`` x setting (repeats dropped)."""
    if ratios and budgets:
        raise InputError("give --compression-ratio or --budget, not both")
    settings = [(float(r), None) for r in (ratios or [])] + [(None, float(b)) for b in (budgets or [])]
    for r, b in settings:
        if r is not None:
            check_compression_ratio(r)
        if b is not None and not (b >= 1 and math.isfinite(b)):
            raise InputError(f"--budget: {b!r} must be a finite number >= 1 (mean kept entries per KV head)")
    pairs = []
    for spec in extra:
        if spec.count("/") != 1 or not all(spec.split("/")):
            raise InputError(f"--method: {spec!r} must be POLICY/ALLOCATOR (e.g. snapkv/adakv)")
        pairs.append(tuple(spec.split("/")))
    policies = list(dict.fromkeys(list(policies) + [p for p, _ in pairs if p == NONE]))
    pairs = [(p, a) for p, a in pairs if p != NONE]
    if not policies and not pairs:
        raise InputError("--policy: give at least one policy (none = the full cache)")
    out = []
    if NONE in policies:
        out.append(Method(NONE, NONE, 0.0, None))
    allocators = list(dict.fromkeys(allocators or ["uniform"]))
    pairs = list(dict.fromkeys([(p, a) for p in policies if p != NONE for a in allocators] + pairs))
    if pairs and not settings:
        raise InputError("give --compression-ratio or --budget for the policies other than none")
    for p, a in pairs:
        for r, b in settings:
            out.append(Method(p, a, r, b))
    return out


def _fingerprint(tasks, model: list, seed: int, query_aware: bool, policy_options: dict) -> dict:
    # the task file by content and the model by models.model_identity: another file or model is another run
    return {"version": STATE_VERSION, "tasks": fio.file_digest(tasks),
            "model": model, "seed": int(seed), "query_aware": bool(query_aware),
            "policy_options": {k: policy_options[k] for k in sorted(policy_options)}}


INPUT_KEYS = ("version", "tasks", "model", "seed", "query_aware")  # a run's inputs, apart from the policies' options


def run_inputs(out) -> dict | None:
    """The inputs (``INPUT_KEYS`` of its fingerprint) of the evaluate run in directory ``out``: from its
    ``results.parquet``, else from the parts of a run still going; None when neither records them."""
    out = Path(out)
    state = fio.parquet_json_metadata(out / "results.parquet", STATE_KEY.encode())
    if state is None:
        try:
            state = json.loads((out / ".results.parquet.parts" / "state.json").read_text())
        except (OSError, ValueError):
            return None
    return {k: state.get(k) for k in INPUT_KEYS} if isinstance(state, dict) else None


def _done_keys(parts: Path) -> tuple[set, list[Path]]:
    files = sorted(parts.glob("part-*.parquet"))
    done = set()
    for f in files:
        done |= {_row_key(r) for r in pq.read_table(f, columns=list(KEY)).to_pylist()}
    return done, files


def _check_examples(examples: list[dict], prompts: list[Prompt], methods: list[Method], window: int | None,
                    policies: dict, path) -> None:
    """Every bad input an example can hold, before any work (InputError naming the example)."""
    for ex, pr in zip(examples, prompts):
        if pr.n_context == 0:
            raise InputError(f"--tasks {path}: example {ex['id']}: empty context")
        total = pr.total_tokens(ex["max_new_tokens"])
        if window is not None and total > window:
            raise InputError(f"--tasks {path}: example {ex['id']}: context + question + answer = {total} tokens "
                             f"exceeds the model's window of {window}")
        for m in methods:
            if m.policy == NONE:
                continue
            pol = policies[m.policy]
            if getattr(pol, "selects", False):  # a sampled policy: its own target (SampledPolicy.check_ratio)
                try:
                    pol.check_ratio(pr.n_context, _sampled_ratio(pr.n_context, m))
                except InputError as e:
                    raise InputError(f"--tasks {path}: example {ex['id']}: {e}") from None
                continue
            setting = f"--compression-ratio {m.ratio}" if m.ratio is not None else f"--budget {m.budget}"
            check_forced_fit(pol, m.policy, pr.n_context, _total_budget(pr.n_context, 1, 1, m), setting, ex["id"])


def check_forced_fit(pol, name: str, n_context: int, per_head: int, setting: str, example_id) -> None:
    """InputError naming ``setting`` (the option and its value) and the example when ``per_head`` kept entries
    per KV head cannot hold policy ``pol``'s sinks + recent window over ``n_context`` tokens."""
    need = min(pol.sinks + pol.recent, n_context)
    if per_head < need:
        raise InputError(f"{setting}: example {example_id} keeps {per_head} entries per KV head, below "
                         f"{name}'s sinks + recent window ({need})")


def _sampled_ratio(n_tokens: int, m: Method) -> float:
    """The compression ratio a sampled policy draws at: ``m.ratio``, or the share a budget evicts."""
    return m.ratio if m.budget is None else budget_ratio(m.budget, n_tokens)


def _total_budget(n_tokens: int, n_layers: int, n_kv_heads: int, m: Method) -> int:
    if m.ratio is not None:
        return budget_for(n_tokens, n_layers, n_kv_heads, m.ratio)
    return int(min(round(m.budget), n_tokens)) * n_layers * n_kv_heads


def run_example(model, tokenizer, ex: dict, prompt: Prompt, methods: list[Method], policies: dict, seed: int,
                query_aware: bool) -> list[dict]:
    """Every method on one example (one shared prefill); the result rows."""
    metric = metric_for_task(ex["task"])
    t0 = time.perf_counter()
    prefill = prefill_context(model, tokenizer, prompt.context)
    prefill_s = time.perf_counter() - t0
    n = prefill.n_tokens
    dense = prefill.ragged_cache()
    dense_bytes = int(dense.physical_bytes())
    ce_full = None
    if ex["task"] == CONTINUATION_TASK:
        ce_full = continuation_nll(model, dense, prefill.logits_last, prompt.continuation, n)
    del dense
    scores: dict = {}
    rows = []
    for m in methods:
        cache = prefill.ragged_cache()
        scoring_s = evict_s = 0.0
        if m.policy != NONE and getattr(policies[m.policy], "selects", False):  # own kept set + bias (sampled)
            t = time.perf_counter()
            keep, bias, _ = policies[m.policy].select(prefill, _sampled_ratio(n, m), seed)
            evict(cache, keep, bias)
            evict_s = time.perf_counter() - t
        elif m.policy != NONE:
            pol = policies[m.policy]
            skey = (m.policy, m.ratio if pol.depends_on_ratio else None)
            if skey not in scores:
                t = time.perf_counter()
                scores[skey] = pol.padded_scores(prefill, compression_ratio=m.ratio)
                scores[skey + ("s",)] = time.perf_counter() - t
            sc, scoring_s = scores[skey], scores[skey + ("s",)]
            t = time.perf_counter()
            total = _total_budget(n, prefill.n_layers, prefill.n_kv_heads, m)
            alloc = make_allocator(m.allocator)
            if getattr(alloc, "needs_prefill", False):  # contourkv: dropped mass from the prefill's rows
                evict(cache, alloc.keep(sc, total, prefill=prefill))
            else:
                evict(cache, select(sc, alloc.allocate(sc, total)))
            evict_s = time.perf_counter() - t
        physical, nominal, kept = int(cache.physical_bytes()), int(cache.nominal_bytes()), int(cache.entries())
        t = time.perf_counter()
        if ex["task"] == CONTINUATION_TASK:
            ids, answer = [], ""
            score = continuation_nll(model, cache, prefill.logits_last, prompt.continuation, n)
        else:
            ids = greedy_answer(model, cache, prompt.question, n, ex["max_new_tokens"])
            answer = tokenizer.decode(ids, skip_special_tokens=True)
            score = score_answer(ex["task"], answer, ex["answer"])
        decode_s = time.perf_counter() - t
        del cache
        ratio = m.ratio if m.ratio is not None else (1.0 - kept / (n * prefill.n_layers * prefill.n_kv_heads))
        rows.append({
            "id": ex["id"], "task": ex["task"], "metric": metric, "policy": m.policy, "allocator": m.allocator,
            "compression_ratio": float(ratio), "budget": m.budget,
            "query_aware": bool(query_aware), "seed": int(seed), "answer": answer, "score": float(score),
            "ce_full": ce_full, "ce_delta": None if ce_full is None else float(score) - ce_full,
            "physical_bytes": physical, "nominal_bytes": nominal, "dense_bytes": dense_bytes,
            "kept_entries": kept, "context_tokens": n, "answer_tokens": len(ids), "prefill_s": prefill_s,
            "scoring_s": scoring_s, "evict_s": evict_s, "decode_s": decode_s,
            "effective_compression": 1.0 - kept / (n * prefill.n_layers * prefill.n_kv_heads),
        })
    return rows


def _row_key(r: dict) -> tuple:
    """A result row's resume key (as :meth:`Method.key`)."""
    return (r["id"], r["policy"], r["allocator"], r["compression_ratio"] if r["budget"] is None else None,
            r["budget"], bool(r["query_aware"]))


def _evaluate(model, tasks, out, policies: Sequence[str], allocators: Sequence[str] = ("uniform",),
             compression_ratios: Sequence[float] | None = None, budgets: Sequence[float] | None = None,
             max_examples: int | None = None, query_aware: bool = False, seed: int = 0,
             methods: Sequence[str] = (),
             policy_options: dict | None = None, progress: bool = True, report: bool = True,
             device: str = "cpu", quiet: bool = False) -> Path:
    """Run the protocol (module docstring) over a task file; write ``out/results.parquet`` and
    ``out/report/``; return the results path.

    Parameters
    ----------
    model : "smollm2", a model directory / .gguf path, a LoadedModel, or ``(model, tokenizer)``.
    tasks : a JSONL or Parquet task file in kvpress's columns.
    out : the output directory.
    policies : policy names (``none`` = the full cache); allocators : allocator names (every policy
        runs with every allocator); methods : further ``"policy/allocator"`` pairs.
    compression_ratios / budgets : the budget settings (one of the two).
    """
    note = fio.stderr_notes(quiet)
    check_seed(seed)  # (the sampled policies' draws: NumPy refuses a negative seed mid-run)

    out = Path(out)  # checked by evaluate() before it took the lock
    methods = methods_for(policies, allocators, compression_ratios, budgets, methods)
    options = dict(policy_options or {})
    pols = {m.policy: make_policy(m.policy, seed=seed, **options.get(m.policy, {}))
            for m in methods if m.policy != NONE}
    methods = list(dict.fromkeys(Method(m.policy, "sampled", m.ratio, m.budget)  # no allocator: "sampled"
                                 if getattr(pols.get(m.policy), "selects", False) else m for m in methods))
    for a in {m.allocator for m in methods if m.policy != NONE and m.allocator != "sampled"}:
        make_allocator(a)
    examples = read_tasks(tasks, max_examples)
    results = out / "results.parquet"
    loaded = loaded_model(model, "evaluate", device=device, note=note)
    mdl, tok = loaded.model, loaded.tokenizer
    prompts = [prompt_ids(tok, ex, query_aware) for ex in examples]
    cfg = mdl.config
    window = getattr(cfg, "max_position_embeddings", None)
    _check_examples(examples, prompts, methods, window, pols, tasks)
    fio.check_output_file(results)  # creates DIR: only once every input is known to be good

    use_ragged_attention(mdl)
    parts = out / ".results.parquet.parts"
    state = _fingerprint(tasks, model_identity(loaded), seed, query_aware, options)
    fresh = not parts.exists()
    wanted = {m.key(ex["id"], query_aware) for ex in examples for m in methods}
    same_inputs = fresh and fio.parquet_json_metadata(results, STATE_KEY.encode()) == state  # a finished run's
    if same_inputs and {_row_key(r) for r in pq.read_table(results, columns=list(KEY)).to_pylist()} == wanted:
        note(f"{results}: finished, with every setting asked for (nothing to run)")  # left as it is
        if report:
            write_report(results, out / "report")
        return results
    fio.prepare_work_dir(parts, state, note)
    if same_inputs:  # a finished run of the same inputs: reuse its rows
        shutil.copyfile(results, parts / "part-previous.parquet")
    done, _ = _done_keys(parts)
    kill_after = int(os.environ.get(KILL_HOOK, "0") or 0)
    written = 0
    with fio.progress("evaluate", enabled=progress) as bar:
        task = bar.add_task("examples", total=len(examples))
        for i, (ex, pr) in enumerate(zip(examples, prompts)):
            todo = [m for m in methods if m.key(ex["id"], query_aware) not in done]
            if todo:
                rows = run_example(mdl, tok, ex, pr, todo, pols, seed, query_aware)
                table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
                k = len(list(parts.glob(f"part-{i:06d}-*.parquet")))
                fio.write_table_atomic(table, parts / f"part-{i:06d}-{k:03d}.parquet")
                written += 1
                if kill_after and written >= kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            bar.advance(task)
    _, files = _done_keys(parts)
    table = pa.concat_tables([pq.read_table(f) for f in files]) if files else RESULT_SCHEMA.empty_table()
    order = {ex["id"]: i for i, ex in enumerate(examples)}
    rows = [r for r in table.to_pylist() if _row_key(r) in wanted]
    rows.sort(key=lambda r: (order[r["id"]], r["policy"] != NONE, r["policy"], r["allocator"],
                             r["compression_ratio"], r["budget"] or 0.0))
    table = pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)
    fio.write_table_atomic(table.replace_schema_metadata({STATE_KEY: json.dumps(state)}), results)
    shutil.rmtree(parts, ignore_errors=True)
    if report:
        write_report(results, out / "report")
    elif (out / "report").is_dir():  # the report of the rows just replaced: stale
        shutil.rmtree(out / "report")
    return results


def evaluate(model, tasks, out, *args, **kwargs) -> Path:
    """Run the evaluation into ``out`` (every option: ``_evaluate``), holding ``io.output_lock(out)``:
    a second run on the same output while this one runs is refused with one line naming the holder."""
    fio.check_output_dir(out)
    with fio.output_lock(out, "evaluate"):
        return _evaluate(model, tasks, out, *args, **kwargs)


evaluate.__doc__ += "\n" + (_evaluate.__doc__ or "")
