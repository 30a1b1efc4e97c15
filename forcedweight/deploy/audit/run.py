"""``audit``: the three audits of issue 13 over one task file, written to one directory.

``DIR/memory.parquet`` (+ ``memory.png``), ``DIR/leak.parquet`` (+ ``leak_margins.parquet`` and the two
harness runs under ``DIR/leak/``), ``DIR/ceiling.parquet`` (+ ``ceiling_steps.parquet``) and
``DIR/report.md``. Every option is checked (InputError naming it) before the model is loaded; each
part's table is written atomically as soon as it is done.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pyarrow as pa

from forcedweight import io as fio
from forcedweight.deploy.allocate import check_compression_ratio, make_allocator
from forcedweight.deploy.audit.ceiling import SELECTIONS, ceiling_example, check_options
from forcedweight.deploy.audit.leak import leak_audit
from forcedweight.deploy.audit.memory import memory_rows
from forcedweight.deploy.audit.report import write_report
from forcedweight.deploy.evaluate_protocol import prompt_ids
from forcedweight.deploy.policies import make_policy
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.tasks import read_tasks
from forcedweight.errors import InputError, check_seed
from forcedweight.models import LoadedModel, loaded_model, model_identity, peek_architecture

PARTS = ("memory", "leak", "ceiling")

MEMORY_SCHEMA = pa.schema([
    ("policy", pa.string()), ("allocator", pa.string()), ("compression_ratio", pa.float64()),
    ("storage", pa.string()), ("bytes", pa.int64()), ("dense_bytes", pa.int64()), ("id", pa.string()),
    ("context_tokens", pa.int64()), ("kept_entries", pa.int64()),
])
CEILING_SCHEMA = pa.schema([
    ("id", pa.string()), ("task", pa.string()), ("metric", pa.string()), ("context_tokens", pa.int64()),
    ("kind", pa.string()), ("method", pa.string()), ("s", pa.int64()), ("answer", pa.string()),
    ("score", pa.float64()), ("ce", pa.float64()), ("seconds", pa.float64()), ("rows", pa.int64()),
    ("mean_error", pa.float64()), ("mean_error_top", pa.float64()), ("optimal_share", pa.float64()),
])
STEP_SCHEMA = pa.schema([
    ("id", pa.string()), ("task", pa.string()), ("metric", pa.string()), ("context_tokens", pa.int64()),
    ("method", pa.string()), ("s", pa.int64()), ("layer", pa.int64()), ("head", pa.int64()),
    ("kv_head", pa.int64()), ("position", pa.int64()), ("n_keys", pa.int64()), ("kept", pa.int64()),
    ("error", pa.float64()), ("error_top", pa.float64()), ("dropped_mass", pa.float64()),
    ("dropped_mass_top", pa.float64()), ("seconds", pa.float64()), ("status", pa.string()),
    ("lower_bound", pa.float64()), ("swaps", pa.int64()), ("switched", pa.bool_()),
])


def _check_layers(layers, n_layers: int | None) -> list[int]:
    """``layers`` as ints, or an InputError naming ``--layers`` for none or one outside ``0..n_layers - 1``
    (only a negative one when ``n_layers`` is None: the model's shape is not known yet)."""
    layers = [int(x) for x in layers]
    bad = [x for x in layers if x < 0 or (n_layers is not None and x >= n_layers)]
    if bad or not layers:
        shape = f" (the model has layers 0..{n_layers - 1})" if n_layers is not None else ""
        raise InputError(f"--layers: {bad or 'none'}{shape}")
    return layers


PARTS_RECORD = ".audit-inputs.json"  # part -> the task file (by content) and model it was run on
PART_FILES = {"memory": "memory.parquet", "leak": "leak.parquet", "ceiling": "ceiling.parquet"}


def _recorded_parts(out: Path) -> dict:
    try:
        record = json.loads((out / PARTS_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _check_other_parts(out: Path, parts, inputs: dict) -> None:
    """InputError when a part this run leaves as it is was made from another task file or model: the report
    would set them side by side as one audit."""
    for part, inp in _recorded_parts(out).items():
        if part not in parts and (out / PART_FILES.get(part, "-")).is_file() and inp != inputs:
            raise InputError(f"--out: {out / PART_FILES[part]} was made from another task file or model; run every "
                             f"part on these inputs (--part {','.join(PARTS)}) or use another --out directory")


def _record_part(out: Path, part: str, inputs: dict) -> None:
    record = _recorded_parts(out)
    record[part] = inputs
    with fio.atomic_path(out / PARTS_RECORD) as tmp:
        tmp.write_text(json.dumps(record))


def audit(model, tasks, out, *args, **kwargs) -> Path:
    """Run the audit into ``out`` (every option: ``_audit``), holding ``io.output_lock(out)``: a second
    run on the same output while this one runs is refused with one line naming the holder."""
    fio.check_output_dir(out)
    with fio.output_lock(out, "audit"):
        return _audit(model, tasks, out, *args, **kwargs)


def _audit(model, tasks, out, policies: Sequence[str], compression_ratios: Sequence[float] = (),
          allocators: Sequence[str] = ("uniform",), parts: Sequence[str] = PARTS,
          layers: Sequence[int] | None = None, s_values: Sequence[int] = (8, 32, 128),
          selections: Sequence[str] = SELECTIONS, steps: int | None = None, solver: str = "bnb",
          time_limit: float = 0.1, threshold: float = 0.5, max_examples: int | None = None,
          memory_examples: int = 1, ceiling_examples: int | None = None, seed: int = 0,
          progress: bool = True, quiet: bool = False) -> Path:
    """Run the chosen parts (module docstring); return ``out/report.md``.

    Parameters
    ----------
    model : "smollm2", a model directory / .gguf, a LoadedModel or ``(model, tokenizer)``.
    policies : eviction policies (memory and leak audits, and the ceiling's comparison).
    compression_ratios : fractions evicted (memory and leak). allocators : for memory and leak.
    layers : the ceiling's restricted layers (default: every layer). s_values : the ceiling's budgets.
    steps : restrict only the first ``steps`` query rows after the context (and score a continuation's
        first ``steps + 1`` tokens). memory_examples / ceiling_examples : examples used by those parts.
    """
    note = fio.stderr_notes(quiet)

    out = Path(out)  # (checked by audit() before it took the lock)
    check_seed(seed)
    parts = list(dict.fromkeys(parts))
    for p in parts:
        if p not in PARTS:
            raise InputError(f"--part: unknown part {p!r} (known: {', '.join(PARTS)})")
    if not parts:
        raise InputError("--part: give at least one of " + ", ".join(PARTS))
    policies = [p for p in dict.fromkeys(policies) if p != "none"]
    pols = {p: make_policy(p, seed=seed) for p in policies}
    if not pols and ("memory" in parts or "leak" in parts):
        raise InputError("--policy: give at least one eviction policy")
    for a in allocators:
        make_allocator(a)
    ratios = [check_compression_ratio(r) for r in compression_ratios]
    if not ratios and ("memory" in parts or "leak" in parts):
        raise InputError("--compression-ratio: give at least one (memory and leak audits)")
    if "ceiling" in parts:
        check_options(s_values, selections, solver, time_limit, threshold, steps)
        drawn = [p for p, pol in pols.items() if getattr(pol, "selects", False)]
        if drawn:  # the ceiling keeps s entries per head by each policy's scores; a sampled one draws its own
            raise InputError(f"--policy {drawn[0]}: the ceiling compares s kept entries chosen by scores; a sampled "
                             f"policy draws its own (its top-s is {drawn[0].replace('sampled-', 'topk-')}), or "
                             "run it without --part ceiling")
    for n, opt in ((memory_examples, "--memory-examples"), (ceiling_examples, "--ceiling-examples"),
                   (max_examples, "--max-examples")):
        if n is not None and n < 1:
            raise InputError(f"{opt}: must be >= 1, got {n}")
    examples = read_tasks(tasks, max_examples)
    if layers is not None:  # before the output directory is made: from the model's
        # metadata where it can be read without the weights (models.peek_architecture), else a negative index
        shape = None if isinstance(model, (LoadedModel, tuple)) else peek_architecture(model)
        _check_layers(layers, shape[0] if shape else None)
    for name in ("memory.parquet", "leak.parquet", "ceiling.parquet", "ceiling_steps.parquet", "report.md"):
        fio.check_output_file(out / name)
    loaded = loaded_model(model, "the audit", note=note)
    mdl, tok = loaded.model, loaded.tokenizer
    n_layers = int(mdl.config.num_hidden_layers)
    layers = _check_layers(range(n_layers) if layers is None else layers, n_layers)
    inputs = {"tasks": fio.file_digest(tasks), "model": model_identity(loaded)}
    _check_other_parts(out, parts, inputs)

    if "memory" in parts:
        rows = []
        with fio.progress("audit memory", enabled=progress) as bar:
            task = bar.add_task("examples", total=min(memory_examples, len(examples)))
            for ex in examples[:memory_examples]:
                prefill = prefill_context(mdl, tok, prompt_ids(tok, ex, False).context)
                rows += memory_rows(prefill, pols, allocators, ratios, ex["id"], seed=seed)
                bar.advance(task)
        fio.write_table_atomic(pa.Table.from_pylist(rows, schema=MEMORY_SCHEMA), out / "memory.parquet")
        _record_part(out, "memory", inputs)
        note(f"wrote {out / 'memory.parquet'}")
    if "leak" in parts:
        leak_audit(loaded, tasks, out, list(pols), ratios, allocators, max_examples=max_examples, seed=seed,
                   progress=progress, quiet=quiet)
        _record_part(out, "leak", inputs)
        note(f"wrote {out / 'leak.parquet'}")
    if "ceiling" in parts:
        rows, steps_rows = [], []
        chosen = examples[:ceiling_examples] if ceiling_examples else examples
        with fio.progress("audit ceiling", enabled=progress) as bar:
            task = bar.add_task("examples", total=len(chosen))
            for ex in chosen:
                r, st = ceiling_example(mdl, tok, ex, layers, s_values, selections, pols, steps, solver,
                                        time_limit, threshold)
                rows += r
                steps_rows += st
                # written after every example: a long run leaves its finished examples behind
                fio.write_table_atomic(pa.Table.from_pylist(rows, schema=CEILING_SCHEMA), out / "ceiling.parquet")
                fio.write_table_atomic(pa.Table.from_pylist(steps_rows, schema=STEP_SCHEMA),
                                       out / "ceiling_steps.parquet")
                _record_part(out, "ceiling", inputs)
                bar.advance(task)
        note(f"wrote {out / 'ceiling.parquet'}")
    return write_report(out)


audit.__doc__ += "\n" + (_audit.__doc__ or "")


__all__ = ["CEILING_SCHEMA", "MEMORY_SCHEMA", "PARTS", "STEP_SCHEMA", "audit"]
