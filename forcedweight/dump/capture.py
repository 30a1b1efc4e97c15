"""``dump_rows``: capture attention rows from a model over texts into a resumable Parquet dump.

Layout of a dump directory::

    manifest.json                    model, dtype, package versions, options, completion
    texts.parquet                    text_id, text, token_ids (every row can be recomputed)
    rows-t{text:06d}-l{layer:03d}.parquet   rows of one text and layer (the row contract, docs/concepts.md)
    stats-t{text:06d}-l{layer:03d}.parquet  row_id, dropped_mass_s{S} (only with stats_s)

Row ids are a running count in a fixed order (text, layer, head, position), computed from the
plan before anything runs, so a resumed dump has exactly the ids of an uninterrupted one. Each
shard is written atomically (temporary file, then rename); the stats shard of a (text, layer)
is written before its rows shard, so an existing rows shard means the pair is complete.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight import models
from forcedweight import rows as rowsmod
from forcedweight.compat import text_config
from forcedweight.dump.hook import LayerCapture, LayerPlan, Recorder, run_capture
from forcedweight.errors import InputError, check_seed

FORMAT = "forcedweight-dump/1"
# A record batch holds at most this many value elements (keeps list offsets within int32, and the
# memory of one batch at ~64 MB of float32 values: batches are built and written one at a time).
_MAX_BATCH_VALUES = 1 << 24
_EXIT_AFTER_ENV = "FORCEDWEIGHT_DUMP_EXIT_AFTER_SHARDS"  # test hook: simulate kill -9
_MAX_PENDING_WRITES = 4


MAX_INDEX = 100_000  # the largest layer or head index a list may name (the model's own range is checked later)


def parse_index_list(spec: str | Sequence[int] | None, option: str) -> list[int] | None:
    """Parse ``"0,3,5-7"`` into ``[0, 3, 5, 6, 7]`` (sorted, unique); None stays None."""
    if spec is None:
        return None
    if not isinstance(spec, str):
        return sorted({int(x) for x in spec})
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise InputError(f"{option}: cannot parse {part!r} in {spec!r} (expected e.g. 0,3,5-7)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise InputError(f"{option}: empty range {part!r}")
        if hi > MAX_INDEX:  # checked before the range is built: "0-99999999999" filled the memory
            raise InputError(f"{option}: {part!r} reaches index {hi}; no model has more than {MAX_INDEX:,} layers or heads")
        out.update(range(lo, hi + 1))
    return sorted(out)


def sample_positions(seed: int, text_id: int, layer: int, head: int, n_tokens: int, k: int, all_positions: bool):
    """Query positions of one (text, layer, head): sorted, all >= 1 (position 0 sees one key).

    Sampled without replacement by a NumPy Generator seeded from (seed, text_id, layer, head),
    so the choice does not depend on run order or on which other rows are dumped.
    """
    if n_tokens < 2:
        return np.zeros(0, dtype=np.int64)
    candidates = np.arange(1, n_tokens, dtype=np.int64)
    if all_positions or k >= candidates.size:
        return candidates
    rng = np.random.default_rng([int(seed), int(text_id), int(layer), int(head)])
    return np.sort(rng.choice(candidates, size=k, replace=False))


def plan_text(text_id, n_tokens, layers, heads, positions, all_positions, seed) -> dict[int, LayerPlan]:
    """Row plan of one text: layer -> LayerPlan, rows ordered by (head, position)."""
    plans = {}
    for layer in layers:
        hs, ps = [], []
        for head in heads:
            pos = sample_positions(seed, text_id, layer, head, n_tokens, positions, all_positions)
            hs.append(np.full(pos.size, head, dtype=np.int64))
            ps.append(pos)
        h, p = np.concatenate(hs), np.concatenate(ps)
        if h.size:
            plans[layer] = LayerPlan(heads=h, positions=p)
    return plans


def rows_per_text(n_tokens: int, n_layers: int, n_heads: int, positions: int, all_positions: bool) -> int:
    per_head = max(0, n_tokens - 1) if all_positions else min(positions, max(0, n_tokens - 1))
    return n_layers * n_heads * per_head


def shard_name(kind: str, text_id: int, layer: int) -> str:
    return f"{kind}-t{text_id:06d}-l{layer:03d}.parquet"


def package_versions() -> dict[str, str]:
    out = {}
    for name in ("forcedweight", "numpy", "torch", "transformers", "tokenizers", "pyarrow", "triton", "gguf"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def capture_table(cap: LayerCapture, text_id: int, first_row_id: int, model_name: str, with_keys: bool):
    """The schema and the Arrow record batches (the row contract, docs/concepts.md) of one captured layer, cut to bound
    batch sizes; the batches come from a generator, built one at a time as they are consumed
    (a layer's rows hold R x N x d values, far more than the layer's own (H_kv, N, d) values)."""
    schema = rowsmod.row_schema(pa.float32(), with_keys=with_keys)
    r, t = cap.weights.shape
    d = cap.values.shape[-1]
    n = np.asarray(cap.n_keys, dtype=np.int64)
    k0 = np.asarray(cap.key_start, dtype=np.int64)  # first key of each row (sliding window: > 0)
    # Split the rows so that one batch holds at most _MAX_BATCH_VALUES value elements.
    bounds, acc, start = [], 0, 0
    for i in range(r):
        acc += int(n[i]) * d
        if acc > _MAX_BATCH_VALUES and i > start:
            bounds.append((start, i))
            start, acc = i, int(n[i]) * d
    bounds.append((start, r))
    return schema, _batches(cap, text_id, first_row_id, model_name, with_keys, schema, bounds, n, k0, t, d)


def _batches(cap, text_id, first_row_id, model_name, with_keys, schema, bounds, n, k0, t, d):
    """Yield one record batch per row range (a, b) of ``bounds``: rows a..b-1 of ``cap``, their
    values (and keys) gathered from the layer's (H_kv, T, d) arrays only while it is built."""
    for a, b in bounds:
        keep = np.arange(t)[None, :] < n[a:b, None]
        nn = n[a:b]
        offs = np.concatenate([[0], np.cumsum(nn)]).astype(np.int32)
        offs_d = (offs.astype(np.int64) * d).astype(np.int32)

        def lists(flat, offsets):
            return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.float32()))

        kv = cap.kv_heads[a:b]
        ss = k0[a:b]
        values = np.concatenate([cap.values[kv[i], ss[i] : ss[i] + nn[i]].ravel() for i in range(b - a)])
        cols = {
            "row_id": pa.array(np.arange(first_row_id + a, first_row_id + b, dtype=np.int64)),
            "weights": lists(cap.weights[a:b][keep], offs),
            "values": lists(values, offs_d),
            "value_dim": pa.array(np.full(b - a, d, dtype=np.int32)),
            "model": pa.array([model_name] * (b - a), pa.string()),
            "text_id": pa.array(np.full(b - a, text_id, dtype=np.int64)),
            "layer": pa.array(np.full(b - a, cap.layer, dtype=np.int32)),
            "head": pa.array(cap.heads[a:b].astype(np.int32)),
            "kv_head": pa.array(kv.astype(np.int32)),
            "query_pos": pa.array(cap.positions[a:b].astype(np.int32)),
            "n_keys": pa.array(nn.astype(np.int32)),
            "window": pa.array([cap.window] * (b - a), pa.int32()),
            "sink_mass": pa.nulls(b - a, pa.float64()) if cap.sink_mass is None
            else pa.array(np.asarray(cap.sink_mass[a:b], dtype=np.float64)),
        }
        if with_keys:
            keys = np.concatenate([cap.keys[kv[i], ss[i] : ss[i] + nn[i]].ravel() for i in range(b - a)])
            cols["logits"] = lists(cap.logits[a:b][keep], offs)
            cols["keys"] = lists(keys, offs_d)
            cols["query"] = lists(cap.queries[a:b].ravel(), (np.arange(b - a + 1) * d).astype(np.int32))
        yield pa.record_batch([cols[f.name] for f in schema], schema=schema)


def _fingerprint(manifest: dict) -> dict:
    return {k: manifest.get(k) for k in ("format", "model", "model_source", "dtype", "options", "texts")}


def _prepare_out_dir(out_dir: Path) -> None:
    # (a file at out_dir was refused by dump_rows before it took the lock)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out: {out_dir}: cannot create the output directory ({exc.strerror or exc})") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise InputError(f"--out: {out_dir}: the output directory is not writable")


def _write_json_atomic(obj: dict, target: Path) -> None:
    with fio.atomic_path(target) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _tokenize(loaded, texts: Sequence[str], max_positions: int | None) -> list[list[int]]:
    tok = loaded.tokenizer
    if tok is None:
        raise InputError(f"--model: {loaded.source}: the model has no tokenizer")
    ids = []
    for i, text in enumerate(texts):
        token_ids = list(tok(text)["input_ids"])
        if max_positions is not None and len(token_ids) > max_positions:
            preview = text[:40].replace("\n", " ")
            raise InputError(
                f"text {i} ({preview!r}...): {len(token_ids)} tokens exceeds the model's context of "
                f"{max_positions} (max_position_embeddings)"
            )
        ids.append(token_ids)
    return ids


def _check_range(values: list[int] | None, total: int, option: str, what: str) -> list[int]:
    if values is None:
        return list(range(total))
    if not values:
        raise InputError(f"{option}: no {what}s selected")
    bad = [v for v in values if not 0 <= v < total]
    if bad:
        raise InputError(f"{option}: {what} {bad[0]} out of range (the model has {total} {what}s: 0..{total - 1})")
    return values


def _dump_rows(
    model,
    texts: Sequence[str],
    out_dir: str | os.PathLike,
    layers: str | Sequence[int] | None = None,
    heads: str | Sequence[int] | None = None,
    positions: int = 4,
    all_positions: bool = False,
    seed: int = 0,
    with_keys: bool = False,
    stats_s: Sequence[int] = (),
    progress: bool = True,
    dtype: str = "float32",
    device: str | None = None,
    backend: str = "auto",
) -> Path:
    """Capture attention rows of ``model`` over ``texts`` into ``out_dir``; resumable.

    Parameters
    ----------
    model : a ``models.LoadedModel`` or a spec for ``models.load_model`` (None / "smollm2" for
        the embedded SmolLM2, a HF directory, a ``.gguf`` file).
    texts : the texts; text_id is the index.
    layers, heads : indices (or ``"0,3,5-7"``); None = all. Heads are query heads.
    positions : query positions sampled per (text, layer, head), from positions >= 1.
    all_positions : take every position >= 1 instead.
    seed : seed of the position sampling.
    with_keys : also store post-RoPE ``keys`` (N*d), ``query`` (d) and scaled ``logits`` (N).
    stats_s : budgets s; writes ``stats-*.parquet`` with ``dropped_mass_s{S}`` per row.
    dtype, device : used when ``model`` is a spec (device None: CUDA when available).
    backend : rows/statistics path in captured layers: "auto" (Triton on CUDA), "torch", "triton".

    Returns
    -------
    Path of ``out_dir``. Rerunning with the same arguments resumes (completed shards are
    skipped); a directory holding a dump made with other options is refused.
    """
    import torch

    out_dir = Path(out_dir)
    texts = list(texts)
    if not texts:
        raise InputError("no texts to dump")
    if positions < 1 and not all_positions:
        raise InputError(f"--positions: must be >= 1, got {positions}")
    stats_s = sorted({int(s) for s in stats_s})
    if any(s < 1 for s in stats_s):
        raise InputError(f"--stats-s: budgets must be >= 1, got {stats_s[0]}")
    if backend not in ("auto", "torch", "triton"):
        raise InputError(f"backend: unknown {backend!r} (auto, torch, triton)")
    check_seed(seed)
    # a malformed or out-of-range list fails now, not after the model load (ranges from the model's
    # metadata when it can be read without loading the weights)
    wanted_layers, wanted_heads = parse_index_list(layers, "--layers"), parse_index_list(heads, "--heads")
    if (wanted_layers or wanted_heads) and not isinstance(model, models.LoadedModel):
        shape = models.peek_architecture(model)
        if shape is not None:
            _check_range(wanted_layers, shape[0], "--layers", "layer")
            _check_range(wanted_heads, shape[1], "--heads", "head")
    if not isinstance(model, models.LoadedModel):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise InputError(f"--device: {device}: CUDA is not available on this machine")
        if not (str(device) == "cpu" or str(device).startswith("cuda")):
            raise InputError(f"--device: unknown device {device!r} (cpu, cuda, cuda:N)")
        model = models.load_model(model, dtype=dtype, device=device, progress=progress)
    net = model.model
    config = text_config(net.config)  # (a multimodal model's language shape: Gemma 3's text_config)
    param = next(net.parameters())
    dtype = str(param.dtype).removeprefix("torch.")
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    layers = _check_range(parse_index_list(layers, "--layers"), n_layers, "--layers", "layer")
    heads = _check_range(parse_index_list(heads, "--heads"), n_heads, "--heads", "head")
    token_ids = _tokenize(model, texts, getattr(config, "max_position_embeddings", None))

    options = dict(
        layers=layers, heads=heads, positions=int(positions), all_positions=bool(all_positions),
        seed=int(seed), with_keys=bool(with_keys), stats_s=stats_s,
    )
    digest = hashlib.sha256(json.dumps([texts, token_ids]).encode("utf-8")).hexdigest()
    counts = [rows_per_text(len(t), len(layers), len(heads), positions, all_positions) for t in token_ids]
    if not sum(counts):  # a row is a query position >= 1: an empty dump is refused before anything is written
        raise InputError(f"no text has 2 or more tokens ({len(texts)} texts): the dump would hold no rows")
    manifest = dict(
        format=FORMAT, model=model.name, model_source=str(model.source), dtype=dtype, options=options,
        texts=dict(count=len(texts), sha256=digest),
        architecture=dict(layers=n_layers, heads=n_heads, kv_heads=n_kv,
                          head_dim=getattr(config, "head_dim", None) or config.hidden_size // n_heads),
        versions=package_versions(), device=str(param.device), backend=backend,
        n_rows=int(sum(counts)), complete=False, command=fio.command_line(),
    )
    _prepare_out_dir(out_dir)
    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        try:
            old = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"--out: {manifest_path}: unreadable manifest ({exc})") from None
        if _fingerprint(old) != _fingerprint(manifest):
            diff = [k for k in _fingerprint(manifest) if old.get(k) != manifest.get(k)]
            raise InputError(
                f"--out: {out_dir} holds a dump made with different {', '.join(diff)}; use another --out directory"
            )
    elif any(out_dir.glob("rows-*.parquet")):
        raise InputError(f"--out: {out_dir} holds row shards but no manifest.json; use another --out directory")
    for stale in out_dir.glob(".*.tmp"):  # temporary files of a killed run (never renamed into place)
        if stale.name.startswith((".rows-", ".stats-", ".texts.parquet.", ".manifest.json.")):
            stale.unlink(missing_ok=True)
    _write_json_atomic(manifest, manifest_path)
    texts_path = out_dir / "texts.parquet"
    if not texts_path.exists():
        table = pa.table({
            "text_id": pa.array(np.arange(len(texts), dtype=np.int64)),
            "text": pa.array(texts, pa.string()),
            "token_ids": pa.array(token_ids, pa.list_(pa.int64())),
        })
        fio.write_table_atomic(table, texts_path)

    exit_after = int(os.environ.get(_EXIT_AFTER_ENV, "0") or 0)
    written = [0]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def write(cap: LayerCapture, text_id: int, first_row_id: int) -> None:
        _write_layer(out_dir, cap, text_id, first_row_id, model.name, with_keys, stats_s)
        written[0] += 1
        if exit_after and written[0] >= exit_after:
            os._exit(137)  # test hook: die like kill -9, right after a shard landed

    # Shards are written by one background thread while the model runs the next layers (pyarrow
    # releases the GIL); at most a few captured layers wait in memory.
    pending: list = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="forcedweight-dump") as pool, fio.progress("dump", enabled=progress) as bar:
        task = bar.add_task("dump", total=len(texts))
        for text_id, ids in enumerate(token_ids):
            bar.update(task, description=f"text {text_id} ({len(ids)} tokens)")
            plans = plan_text(text_id, len(ids), layers, heads, positions, all_positions, seed)
            first_ids, acc = {}, int(offsets[text_id])
            for layer in layers:
                if layer in plans:
                    first_ids[layer] = acc
                    acc += len(plans[layer].heads)
            todo = {l: p for l, p in plans.items() if not (out_dir / shard_name("rows", text_id, l)).exists()}

            def sink(cap: LayerCapture, text_id=text_id, first_ids=first_ids):
                while len(pending) >= _MAX_PENDING_WRITES or (pending and pending[0].done()):
                    pending.pop(0).result()  # re-raises a failed write
                pending.append(pool.submit(write, cap, text_id, first_ids[cap.layer]))

            if todo:
                recorder = Recorder(plans=todo, sink=sink, with_keys=with_keys, stats_s=stats_s, backend=backend)
                run_capture(net, torch.tensor(ids, dtype=torch.long, device=param.device), recorder)
            bar.advance(task)
        for future in pending:
            future.result()
    manifest["complete"] = True
    _write_json_atomic(manifest, manifest_path)
    return out_dir


def _write_layer(out_dir: Path, cap: LayerCapture, text_id: int, first_row_id: int, model_name: str,
                 with_keys: bool, stats_s: Sequence[int]) -> None:
    """Write the stats shard (if any), then the rows shard, each atomically."""
    r = len(cap.heads)
    if stats_s:
        cols = {"row_id": pa.array(np.arange(first_row_id, first_row_id + r, dtype=np.int64))}
        for j, s in enumerate(stats_s):
            cols[f"dropped_mass_s{s}"] = pa.array(cap.dropped[:, j].astype(np.float64))
        fio.write_table_atomic(pa.table(cols), out_dir / shard_name("stats", text_id, cap.layer))
    schema, batches = capture_table(cap, text_id, first_row_id, model_name, with_keys)
    with fio.atomic_path(out_dir / shard_name("rows", text_id, cap.layer)) as tmp:
        # zstd: rows of one KV head repeat the same value prefixes, so shards shrink ~4x over snappy;
        # dictionary encoding only where it pays (the model name), not on the float lists.
        with pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=["model"]) as writer:
            for batch in batches:
                writer.write_batch(batch)


def dump_rows(model, texts: Sequence[str], out_dir: str | os.PathLike, *args, **kwargs) -> Path:
    """Capture attention rows into ``out_dir`` (see ``_dump_rows`` for every option).

    The whole run holds ``io.output_lock(out_dir)``: a second dump into the same directory while
    this one runs is refused with one line naming the holder.
    """
    out = fio.check_output_dir(out_dir)
    with fio.output_lock(out, "dump"):  # (its lock file lives beside the output directory)
        return _dump_rows(model, texts, out_dir, *args, **kwargs)


dump_rows.__doc__ += "\n" + (_dump_rows.__doc__ or "")
