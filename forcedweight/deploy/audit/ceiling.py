"""The selection ceiling inside generation: attention restricted to s entries of the FULL cache chosen
with the true query, against every eviction policy at the same s.

After the context prefill, every query row of the chosen layers (the question's rows, the answer's
decode steps, a continuation's teacher-forced rows; the first ``steps`` rows after the context when
``steps`` is given) attends only to a set ``S`` of ``min(s, T)`` of the ``T`` keys it may see, chosen
with its own (true) query from its exact float64 softmax ``p`` and values ``V``:

- ``top``: top-mass (the s largest weights, ``core.operator.top_mass_set``);
- ``balancing``: best-improvement 1-swaps from top-mass over all keys (``selectors.balancing``);
- ``best``: the certified best forced-weight set of ``certify``'s solver
  (``certify.options.run_solver``, bnb by default, warm-started at balancing, ``time_limit`` seconds per
  row; ``status`` as certify's: ``optimal`` when proved, else ``improved`` (better than the balancing
  warm start) or ``unsolved``, with the proved ``lower_bound``);
- ``targeted``: balancing only where top-mass drops more than ``threshold`` of the mass, else top-mass.

The layer's output for that row is the forced-weight output ``m_S = sum_S p_i v_i / p(S)``: the
softmax renormalised over the kept set, which is what restricting attention to ``S`` computes.
**GQA**: each query head chooses its own set among its KV head's entries (the heads of a group do not
share a kept set; a shared set could only do worse for each head).

Every restricted row is recorded (``ceiling_steps.parquet``): its error ``E(S) = ||m_S - mu||``, the
error and dropped mass of top-mass on the same row, the solver's status and bound, so
``E(best) <= E(top)`` can be checked step by step. The eviction policies run at the same s in the same
layers (``uniform`` allocation: every KV head keeps ``min(s, N)`` context entries; the other layers
keep everything; the question and answer tokens are appended, as in the harness), through the
ragged cache. Note the ceiling's s counts every key of the row (context and new tokens), the
policies' s only the context's, so the comparison favours the policies.

The restriction runs in an attention function registered with transformers' ``AttentionInterface``
under its own name (``"forcedweight_ceiling"``), switched on per run; outside the chosen layers and
rows it is transformers' SDPA attention.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from transformers import AttentionInterface

from forcedweight.certify.options import SOLVERS, run_solver
from forcedweight.compat import attention_implementation
from forcedweight.core import operator as op
from forcedweight.deploy.allocate import select
from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate_protocol import Prompt, continuation_nll, greedy_answer, prompt_ids
from forcedweight.deploy.features import Features, layer_features
from forcedweight.deploy.prefill import copy_dense_cache, prefill_attention, prefill_context
from forcedweight.deploy.tasks import CONTINUATION_TASK, metric_for_task, score_answer
from forcedweight.errors import InputError
from forcedweight.selectors.balancing import balancing

ATTENTION_NAME = "forcedweight_ceiling"
SELECTIONS = ("top", "balancing", "best", "targeted")
REFERENCE = "full"


@dataclass
class CeilingState:
    """One restricted run: the selection, s, the layers and rows restricted, and the records."""

    method: str
    s: int
    layers: frozenset
    n_context: int
    steps: int | None = None
    solver: str = "bnb"
    time_limit: float = 0.1
    threshold: float = 0.5
    keep_rows: bool = False  # tests: also record p, V and the kept set of every row
    records: list = field(default_factory=list)


_ACTIVE: contextvars.ContextVar[CeilingState | None] = contextvars.ContextVar("forcedweight_ceiling", default=None)


def choose(method: str, p: np.ndarray, V: np.ndarray, s: int, solver: str = "bnb", time_limit: float = 0.1,
           threshold: float = 0.5) -> tuple[np.ndarray, dict]:
    """The kept set of one row (p (T,) float64 summing to 1, V (T, d) float64) by ``method``.

    Returns the sorted (min(s, T),) int64 indices and a dict ``status, lower_bound, swaps, switched``.
    """
    n = p.shape[0]
    s = min(int(s), n)
    top = op.top_mass_set(p, s)
    info = {"status": "", "lower_bound": float("nan"), "swaps": 0, "switched": False}
    if s == n:  # every key kept: E = 0, optimal whatever the method (was no status, as if unproved)
        if method == "best":
            info.update(status="optimal", lower_bound=0.0)
        return top, info
    if method == "top":
        return top, info
    if method == "targeted":
        if op.dropped_mass(p, top) <= threshold:
            return top, info
        info["switched"] = True
        method = "balancing"
    if method == "balancing":
        kept, swaps = balancing(p, V, s)
        info["swaps"] = int(swaps)
        return kept, info
    if method == "best":
        start, _ = balancing(p, V, s)  # warm start: so E(best) <= E(balancing) <= E(top)
        res, _ = run_solver(solver, p, V, s, start, time_limit, refine_work=0)  # the best set is used, never the bound
        kept = np.sort(np.asarray(res.best_set, dtype=np.int64))
        e_start = op.forced_error(p, V, start)
        improved = op.forced_error(p, V, kept) < e_start * (1 - 1e-12)
        # certify's vocabulary: optimal (proved), improved (beat the warm start), unsolved
        info["status"] = "optimal" if res.proved else ("improved" if improved else "unsolved")
        info["lower_bound"] = float(res.lower_bound)
        return kept, info
    raise InputError(f"ceiling: unknown selection {method!r} (known: {', '.join(SELECTIONS)})")


def ceiling_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention function: SDPA, then the restricted rows of the chosen layers replaced by their
    forced-weight outputs (module docstring). query (B=1, Hq, L, D); key / value (1, Hkv, T, D)."""
    out, weights = prefill_attention(module, query, key, value, attention_mask, scaling=scaling,
                                     dropout=dropout, **kwargs)
    st = _ACTIVE.get()
    layer = int(getattr(module, "layer_idx", -1))
    if st is None or layer not in st.layers:
        return out, weights
    if query.shape[0] != 1:
        raise InputError("ceiling: batch size 1 only")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    _, Hq, L, _ = query.shape
    Hkv, T = key.shape[1], key.shape[2]
    G = Hq // Hkv
    first = T - L  # position of the first query row
    end = T if st.steps is None else min(T, st.n_context + st.steps)
    rows = [i for i in range(L) if st.n_context <= first + i < end]
    if not rows:
        return out, weights
    # the rows below are plain causal softmax over every key from position 0: a soft-cap, sinks or a
    # window that bites (a row past it) would make them other rows than the model's
    feats = layer_features(module, kwargs, Hq, "the ceiling audit")
    bites = feats.window is not None and first + rows[-1] + 1 > feats.window
    what = Features(feats.softcap, feats.sinks, feats.window if bites else None).names()
    if what:
        raise InputError(f"--layers: layer {layer} has {', '.join(what)}: the ceiling restricts plain softmax "
                         "layers only")
    out = out.clone()
    K = key[0].double()
    Vs = value[0].double()
    for i in rows:
        pos = first + i
        for h in range(Hq):
            kv = h // G
            logits = (K[kv, :pos + 1] @ query[0, h, i].double()) * scale
            p = torch.softmax(logits, dim=0).cpu().numpy()
            V = Vs[kv, :pos + 1].cpu().numpy()
            t0 = time.perf_counter()
            kept, info = choose(st.method, p, V, st.s, st.solver, st.time_limit, st.threshold)
            seconds = time.perf_counter() - t0
            top = op.top_mass_set(p, min(st.s, p.shape[0]))
            m = op.forced_output(p, V, kept)
            rec = {"layer": layer, "head": h, "kv_head": kv, "position": pos, "n_keys": int(p.shape[0]),
                   "kept": int(kept.size), "error": op.forced_error(p, V, kept),
                   "error_top": op.forced_error(p, V, top), "dropped_mass": op.dropped_mass(p, kept),
                   "dropped_mass_top": op.dropped_mass(p, top), "seconds": seconds, **info}
            if st.keep_rows:
                rec.update(p=p, V=V, kept_set=kept)
            st.records.append(rec)
            out[0, i, h] = torch.from_numpy(m).to(out.dtype)
    return out, weights


AttentionInterface.register(ATTENTION_NAME, ceiling_attention)


@contextlib.contextmanager
def restricted(model, state: CeilingState | None):
    """Run ``model`` with :func:`ceiling_attention` and ``state`` active (None: plain SDPA)."""
    with attention_implementation(model, ATTENTION_NAME, (_ACTIVE, state)):
        yield state


def _truncated(prompt: Prompt, steps: int | None) -> torch.Tensor | None:
    """The continuation scored: its first ``steps + 1`` tokens (all of them without ``steps``)."""
    if prompt.continuation is None or steps is None:
        return prompt.continuation
    return prompt.continuation[:, :steps + 1]


def _generate(model, tokenizer, ex: dict, prompt: Prompt, cache, logits_last, n: int, steps: int | None):
    """(answer, score, n_answer_tokens) of one run over ``cache`` (greedy answer or continuation NLL)."""
    if ex["task"] == CONTINUATION_TASK:
        return "", continuation_nll(model, cache, logits_last, _truncated(prompt, steps), n), 0
    ids = greedy_answer(model, cache, prompt.question, n, ex["max_new_tokens"])
    answer = tokenizer.decode(ids, skip_special_tokens=True)
    return answer, score_answer(ex["task"], answer, ex["answer"]), len(ids)


def _summary(records: list) -> dict:
    if not records:
        return {"rows": 0, "mean_error": float("nan"), "mean_error_top": float("nan"), "optimal_share": float("nan")}
    st = [r["status"] for r in records if r["status"]]
    return {"rows": len(records), "mean_error": float(np.mean([r["error"] for r in records])),
            "mean_error_top": float(np.mean([r["error_top"] for r in records])),
            "optimal_share": float(np.mean([x == "optimal" for x in st])) if st else float("nan")}


def ceiling_example(model, tokenizer, ex: dict, layers: Sequence[int], s_values: Sequence[int],
                    selections: Sequence[str] = SELECTIONS, policies: dict | None = None,
                    steps: int | None = None, solver: str = "bnb", time_limit: float = 0.1,
                    threshold: float = 0.5, keep_rows: bool = False) -> tuple[list[dict], list[dict]]:
    """Every selection and policy at every s on one example (one shared prefill).

    Returns ``(rows, step_records)``: one row per (method, s) plus the full-attention reference
    (kind ``reference`` / ``selection`` / ``policy``), and the per-row records of the selections.
    """
    prompt = prompt_ids(tokenizer, ex, False)
    prefill = prefill_context(model, tokenizer, prompt.context)
    n, n_layers = prefill.n_tokens, prefill.n_layers
    layers = frozenset(int(x) for x in layers)
    bad = [x for x in layers if not 0 <= x < n_layers]
    if bad:
        raise InputError(f"--layers: {bad} outside [0, {n_layers})")
    metric = metric_for_task(ex["task"])
    base = {"id": str(ex["id"]), "task": ex["task"], "metric": metric, "context_tokens": n}
    rows, steps_out = [], []

    def row(kind, method, s, answer, score, seconds, summary):
        rows.append({**base, "kind": kind, "method": method, "s": s, "answer": answer, "score": float(score),
                     "ce": float(score) if ex["task"] == CONTINUATION_TASK else None, "seconds": seconds, **summary})

    t = time.perf_counter()
    with restricted(model, None):
        answer, score, _ = _generate(model, tokenizer, ex, prompt, copy_dense_cache(prefill.cache, model),
                                     prefill.logits_last, n, steps)
    row("reference", REFERENCE, None, answer, score, time.perf_counter() - t, _summary([]))
    for s in s_values:
        for method in selections:
            state = CeilingState(method, int(s), layers, n, steps, solver, time_limit, threshold, keep_rows)
            t = time.perf_counter()
            with restricted(model, state):
                answer, score, _ = _generate(model, tokenizer, ex, prompt, copy_dense_cache(prefill.cache, model),
                                             prefill.logits_last, n, steps)
            row("selection", method, int(s), answer, score, time.perf_counter() - t, _summary(state.records))
            steps_out += [{**base, "method": method, "s": int(s), **r} for r in state.records]
    if policies:
        previous = model.config._attn_implementation
        use_ragged_attention(model)
        try:
            for name, pol in policies.items():
                sc = pol.padded_scores(prefill)
                for s in s_values:
                    counts = np.full((n_layers, prefill.n_kv_heads), n, dtype=np.int64)
                    counts[sorted(layers)] = min(int(s), n)
                    keep = select(sc, counts)
                    cache = prefill.ragged_cache()
                    for i in sorted(layers):  # the other layers keep every entry
                        cache.evict(i, keep[i])
                    t = time.perf_counter()
                    answer, score, _ = _generate(model, tokenizer, ex, prompt, cache, prefill.logits_last, n, steps)
                    row("policy", name, int(s), answer, score, time.perf_counter() - t, _summary([]))
        finally:
            model.set_attn_implementation(previous)
    return rows, steps_out


def check_options(s_values: Sequence[int], selections: Sequence[str], solver: str, time_limit: float,
                  threshold: float, steps: int | None) -> None:
    """InputError naming the option for every bad ceiling setting."""
    if not s_values:
        raise InputError("--s: give at least one budget")
    for s in s_values:
        if int(s) != s or s < 1:
            raise InputError(f"--s: {s!r} must be an integer >= 1 (kept entries per query head)")
    for m in selections:
        if m not in SELECTIONS:
            raise InputError(f"--selection: unknown selection {m!r} (known: {', '.join(SELECTIONS)})")
    if solver not in SOLVERS or SOLVERS[solver] is None:
        raise InputError(f"--solver: {solver!r} (known: {', '.join(k for k, v in SOLVERS.items() if v)})")
    if not time_limit > 0:
        raise InputError(f"--time-limit: must be > 0 seconds, got {time_limit}")
    if not 0.0 <= threshold <= 1.0:
        raise InputError(f"--threshold: dropped mass in [0, 1], got {threshold}")
    if steps is not None and steps < 1:
        raise InputError(f"--steps: must be >= 1, got {steps}")


__all__ = ["ATTENTION_NAME", "REFERENCE", "SELECTIONS", "CeilingState", "ceiling_attention", "ceiling_example",
           "check_options", "choose", "restricted"]
