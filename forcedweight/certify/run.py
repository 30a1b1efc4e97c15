"""Streaming, parallel, resumable certification of a rows file (docs/concepts.md, docs/certify.md).

``run_certify`` (behind ``certify.certify_file`` and ``forcedweight certify``):

1. **Validation pass.** The input is streamed once, one row group at a time, reading only the
   array columns, and every row and budget is checked (vectorised over Arrow offsets; the exact
   message comes from ``rows.validate_row``). Without ``skip_invalid`` the first bad row stops
   the run before any work, with a ``RowError`` naming the row and file, and nothing is written.
2. **Shards.** The input is streamed again; every row group is cut into chunks of at most
   ``chunk_rows`` rows, one shard each, named by the global position of its first row.
3. **Execution.** In process (``workers=1``), a local process pool (``workers=N``; forked from a
   clean fork server that preloads the modules, each with ``max(1, cores // N)`` Numba and BLAS
   threads; the fork server keeps the thread environment of the first pool), or a Dask cluster
   (``scheduler=ADDRESS``; ``distributed.Client(address)``; Numba threads left to the workers).
   Local workers and the fork server exit when their parent dies (``io.die_with_parent``).
   At most 2 shards per worker process (or per Dask worker thread) are in flight, so memory
   stays bounded.
4. **Resume.** Each finished shard is written atomically (fsync'd, then renamed) as
   ``part-<position>.parquet`` in the hidden work directory ``.<OUT name>.parts/`` beside the
   output, with ``state.json`` holding a fingerprint of the input files (path, size, mtime), the
   budgets and the options, and each finished part's record count. A rerun with the same
   fingerprint reuses the parts that read back whole with the recorded count (``part_problem``)
   and certifies the others again (a note names each); with a different one the directory is cleared and the
   run starts over (a note goes to stderr). A run stopped by an error mid-way leaves no output
   file, but its parts stay for the next run.
5. **Assembly.** The parts are concatenated, sorted by ``(row_id, s)``, written atomically to
   ``out``, and the work directory is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight import rows
from forcedweight import __version__
from forcedweight.certify.options import CertifyOptions
from forcedweight.certify.record import invalid_record, output_schema, records_to_table
from forcedweight.certify.row import certify_row, mass_span_problem, needs_solver
from forcedweight.certify.warmup import warm_up
from forcedweight.errors import InputError, RowError
from forcedweight.rows import InvalidRow, check_columns, keys_query_problem

STATE_VERSION = 1
#: test hook: SIGKILL this process after writing this many parts (simulates a crash)
KILL_HOOK = "FORCEDWEIGHT_TEST_KILL_AFTER_PARTS"

def parts_dir_for(out: str | os.PathLike) -> Path:
    """The hidden work directory of an output file: ``.<name>.parts`` beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.parts"


# ------------------------------------------------------------------------------------------
# validation pass


def _lengths(col: pa.Array) -> np.ndarray:
    """List lengths, -1 for a null list."""
    return pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _flat(col: pa.Array, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flattened float64 values (nulls -> NaN) and the row index of each."""
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float64)
    return flat, np.repeat(np.arange(lens.size), np.maximum(lens, 0))


def check_batch(batch: pa.RecordBatch, start: int, source: Path, s_values: Sequence[int],
                options: CertifyOptions | None = None):
    """Validate one batch of rows and budgets; yields ``(row_id, s or None, reason)`` per bad one.

    Vectorised over the Arrow offsets; a row flagged here is re-checked by
    ``rows.validate_row`` so that the message is the contract's own. Beyond the contract: the weight
    span and the pool search's and solver's memory that ``certify_row`` refuses (``row.mass_span_problem``,
    ``CertifyOptions.memory_problem``), so that a run stops before its first row, not at that one.
    """
    n = batch.num_rows
    names = batch.schema.names
    check_columns(source, batch.schema, ())  # the columns' types (rows.check_columns)
    ids = batch_ids(batch, start)
    w = batch.column("weights")
    wl = _lengths(w)
    wf, wr = _flat(w, wl)
    vcol = batch.column("values")
    vl = _lengths(vcol)
    vf, vr = _flat(vcol, vl)
    vd_raw = pc.fill_null(batch.column("value_dim").cast(pa.float64()), 0).to_numpy(zero_copy_only=False)  # (null-typed too)
    vd = np.where(np.isfinite(vd_raw), vd_raw, 0).astype(np.int64)
    frac = np.isfinite(vd_raw) & (vd_raw != np.floor(vd_raw))
    vd[frac] = 0  # 2.5 is not a dimension: refused below, never truncated
    fin_w = np.isfinite(wf)
    bad = (wl <= 0) | (vl < 0) | (vd < 1) | (vl != wl * vd)
    bad |= np.bincount(wr[~fin_w], minlength=n) > 0
    bad |= np.bincount(wr[fin_w & (wf < 0)], minlength=n) > 0
    total = np.bincount(wr, weights=np.where(fin_w, wf, 0.0), minlength=n)
    bad |= ~(total > 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # subnormal masses (a loose screen:
        share = wf / total[wr]  # validate_row decides)
    bad |= np.bincount(wr[fin_w & (wf > 0) & (share < 4 * np.finfo(np.float64).tiny)], minlength=n) > 0
    bad |= np.bincount(vr[~np.isfinite(vf)], minlength=n) > 0
    with np.errstate(invalid="ignore"):
        bad |= np.bincount(vr[np.abs(vf) > rows.MAX_VALUE], minlength=n) > 0
    w_end = np.cumsum(np.maximum(wl, 0))  # each row's weights are wf[w_end[i] - wl[i]:w_end[i]]
    key_reason: dict[int, str] = {}
    if "keys" in names:
        kl = _lengths(batch.column("keys"))
        ql = _lengths(batch.column("query")) if "query" in names else np.full(n, -1)
        for i in np.flatnonzero(kl >= 0):
            if wl[i] <= 0:
                continue
            reason = keys_query_problem(int(wl[i]), int(kl[i]), int(ql[i]) if ql[i] >= 0 else None)
            if reason is not None:
                key_reason[i] = reason
    for i in range(n):
        rid = int(ids[i])
        if frac[i]:
            yield rid, None, f"value_dim {vd_raw[i]:g} is not an integer"
            continue
        if bad[i]:
            row = batch.slice(i, 1).to_pydict()
            try:
                rows.validate_row(row["weights"][0], row["values"][0], row["value_dim"][0], rid)
            except RowError as exc:  # (a row the screen flagged that the contract accepts goes on below)
                yield rid, None, exc.reason
                continue
        if i in key_reason:
            yield rid, None, key_reason[i]
            continue
        span = mass_span_problem(wf[w_end[i] - wl[i]:w_end[i]])  # what certify_row refuses, before any row
        if span is not None:
            yield rid, None, span
            continue
        for s in s_values:
            if s > wl[i]:
                yield rid, s, f"budget s={s} exceeds N={wl[i]}"
            elif options is not None:
                memory = options.memory_problem(int(wl[i]), int(vd[i]), s, needs_solver(int(wl[i]), s, options))
                if memory is not None:
                    yield rid, s, memory


def _isnull(arr: np.ndarray) -> np.ndarray:
    """Null mask of an Arrow-converted numeric array (nulls come back as NaN or None)."""
    if arr.dtype == object:
        return np.array([x is None for x in arr], dtype=bool)
    if np.issubdtype(arr.dtype, np.floating):
        return np.isnan(arr)
    return np.zeros(arr.shape, dtype=bool)


_CHECK_COLUMNS = ("row_id", "weights", "values", "value_dim", "keys", "query")


def validate_input(path, s_values: Sequence[int], skip_invalid: bool,
                   options: CertifyOptions | None = None) -> tuple[int, int]:
    """Stream the input once and check every row and budget.

    Returns ``(rows, bad (row, s) pairs)``. Without ``skip_invalid`` the first bad row raises
    ``RowError`` (naming row and file); missing/unreadable files raise ``InputError``.
    """
    total = bad = 0
    seen: list[np.ndarray] = []
    files: list[tuple[int, Path]] = []
    for file, start, batch in rows.iter_batches(path, columns=_CHECK_COLUMNS):
        total += batch.num_rows
        seen.append(batch_ids(batch, start))
        files.append((start, file))
        for rid, s, reason in check_batch(batch, start, file, s_values, options):
            if not skip_invalid:
                raise RowError(rid, reason, str(file))
            bad += len(s_values) if s is None else 1
    check_unique_ids(seen, files)
    return total, bad


def batch_ids(batch: pa.RecordBatch, start: int) -> np.ndarray:
    """The row ids of a batch, shape (n,) int64: ``row_id``, or the global position where it is null/absent."""
    n = batch.num_rows
    if "row_id" not in batch.schema.names:
        return np.arange(start, start + n, dtype=np.int64)
    ids = batch.column("row_id").to_numpy(zero_copy_only=False)
    ids = np.where(_isnull(ids), np.arange(start, start + n), ids)
    if ids.dtype.kind == "f" and not np.all(ids == np.round(ids)):  # (astype would truncate 2.5 to 2)
        i = int(np.flatnonzero(ids != np.round(ids))[0])
        raise InputError(f"row {start + i}: row_id {ids[i]!r} is not an integer")
    return ids.astype(np.int64)


def check_unique_ids(seen: list[np.ndarray], files: list[tuple[int, Path]]) -> None:
    """Refuse an input where two rows share a row id (outputs are keyed by (row_id, s)).

    ``seen`` holds each batch's ids, ``files`` each batch's (first position, file). A null ``row_id``
    stands for the row's position, so it collides with an explicit id equal to that position.
    """
    if not seen:
        return
    ids = np.concatenate(seen)
    order = np.argsort(ids, kind="stable")
    dup = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if dup.size == 0:
        return
    first, second = int(order[dup[0]]), int(order[dup[0] + 1])
    starts = np.array([s for s, _ in files])

    def where(pos: int) -> str:
        return f"{files[int(np.searchsorted(starts, pos, side='right')) - 1][1]} position {pos}"

    raise InputError(f"row_id {int(ids[first])} appears more than once ({where(first)} and {where(second)}; "
                     "a null row_id stands for its position); give every row a distinct row_id")


# ------------------------------------------------------------------------------------------
# shards and the work on one shard


@dataclass(frozen=True)
class Shard:
    """A chunk of consecutive input rows: global position of its first row, and its size."""

    start: int
    length: int
    source: str

    @property
    def name(self) -> str:
        return f"part-{self.start:012d}.parquet"


def iter_shards(path, chunk_rows: int) -> Iterator[tuple[Shard, pa.RecordBatch]]:
    """Stream the input as shards: each row group cut into chunks of at most ``chunk_rows``."""
    for file, start, batch in rows.iter_batches(path):
        for off in range(0, batch.num_rows, chunk_rows):
            part = batch.slice(off, chunk_rows)
            yield Shard(start + off, part.num_rows, str(file)), part


def certify_batch(batch: pa.RecordBatch, start: int, source: str, s_values: Sequence[int],
                  options: CertifyOptions, skip_invalid: bool) -> pa.Table:
    """Certify every row of a batch at every budget; one output table (records in input order).

    The kernels are compiled first (``warm_up``, once per process), outside every row's clock.
    """
    warm_up()
    records = []
    for row in rows.rows_from_batch(batch, start, source=source, skip_invalid=True):
        if isinstance(row, InvalidRow):
            if not skip_invalid:
                raise RowError(row.row_id, row.reason, source)
            records += [invalid_record(row.row_id, s, row.reason, row.extra) for s in s_values]
            continue
        for s in s_values:
            try:
                records.append(certify_row(row, s, options))
            except RowError as exc:
                if not skip_invalid:
                    raise RowError(exc.row_id, exc.reason, source) from None
                records.append(invalid_record(row.row_id, s, exc.reason, row.extra, row.n_keys))
    return records_to_table(records, batch.schema)


def _shard_task(batch, start, source, s_values, options, skip_invalid):
    """Worker entry: ``("ok", table)`` or ``("row_error", row_id, reason, source)``.

    RowError does not survive pickling (its constructor takes three arguments), so it travels
    back as a tuple and is re-raised in the parent.
    """
    try:
        return ("ok", certify_batch(batch, start, source, s_values, options, skip_invalid))
    except RowError as exc:
        return ("row_error", exc.row_id, exc.reason, exc.source)


def _init_worker(threads: int, parent: int | None = None) -> None:
    """Worker start: die with the parent (the fork server, or the caller under spawn), and set the
    Numba threads. ``parent`` is the caller's pid: a worker that starts after it died exits."""
    import numba

    fio.die_with_parent()
    if parent is not None and not _alive(parent):
        os._exit(1)

    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------------------------------
# resume state


def fingerprint(path, s_values, options: CertifyOptions, skip_invalid: bool, chunk_rows: int) -> dict:
    files = []
    for f in fio.list_parquet_files(path):
        st = f.stat()
        files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return {"version": STATE_VERSION, "input": files, "s_values": list(s_values),
            "options": options.to_dict(), "skip_invalid": bool(skip_invalid), "chunk_rows": chunk_rows}


def part_problem(file: Path, expected_rows: int, recorded_rows: int | None) -> str | None:
    """Why a finished part cannot be trusted on resume (None when it can).

    A part is trusted when ``state.json`` records it, its footer and data read back, and it holds
    the recorded number of records, which is one per (row, s) of its shard.
    """
    if recorded_rows is None:
        return "not recorded as finished"
    try:
        n = pq.read_table(file).num_rows
    except (OSError, pa.ArrowException) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"unreadable ({first})"
    if n != recorded_rows or n != expected_rows:
        return f"holds {n} records, state.json records {recorded_rows}, the shard needs {expected_rows}"
    return None


# ------------------------------------------------------------------------------------------
# the run


@contextmanager
def _progress(enabled: bool, total: int):
    """``advance(n)``: the shared ``io.progress("certify")`` bar over the input rows."""
    with fio.progress("certify", enabled=enabled) as bar:
        task = bar.add_task("rows", total=total)
        yield lambda n: bar.advance(task, n)


def _check_paths(path, out: Path) -> None:
    src = Path(path)
    if out.exists() and out.is_dir():
        raise InputError(f"{out}: output path is a directory")
    if src.exists():
        src_r, out_r = src.resolve(), out.resolve()
        if src.is_dir() and (out_r.parent == src_r or src_r in out_r.parents):
            raise InputError(f"{out}: output inside the input directory {src} would be read as input")
        if src.is_file() and out_r == src_r:
            raise InputError(f"{out}: output would overwrite the input")
    fio.check_output_file(out)  # an unwritable destination fails now, not after the work


#: the largest --s accepted: more keys than any row can hold in memory
MAX_BUDGET = 2**40


def run_certify(path, out, s_values: Sequence[int], options: CertifyOptions, workers: int = 1,
                scheduler: str | None = None, skip_invalid: bool = False, progress: bool = True,
                chunk_rows: int = 64, allow_incomplete: bool = False, force: bool = False) -> Path:
    """Certify every (row, s) of a Parquet file/directory into ``out`` (see the module doc).

    A finished ``out`` whose recorded fingerprint (``results_fingerprint``: the input files' paths,
    sizes and mtimes, the budgets, the options, ``skip_invalid``, the package version; kept in the
    output's Parquet metadata) matches this run is kept as it is (a note says so); ``force`` redoes it.

    The rows of an unfinished dump (``manifest.json``: ``complete: false``) are refused unless
    ``allow_incomplete`` (``io.check_dump_complete``).

    The whole run holds ``io.output_lock(out)``: a second run on the same ``out`` is refused
    (InputError naming the holder's pid) instead of mixing its parts with this one's.

    Raises
    ------
    InputError
        Missing path, not Parquet, missing columns, bad options (naming file or option).
    RowError
        A bad row or budget without ``skip_invalid`` (naming row and file); no output written.
    """
    out = Path(out)
    s_values = sorted({int(s) for s in s_values})
    if not s_values:
        raise InputError("--s: give at least one budget")
    if s_values[0] < 1:
        raise InputError(f"--s {s_values[0]}: a budget must be >= 1")
    if s_values[-1] > MAX_BUDGET:  # no row has 2^40 keys; beyond int64 the budget cannot even be stored
        raise InputError(f"--s {s_values[-1]}: a budget must be <= {MAX_BUDGET} (no row has more keys)")
    if workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}")
    if chunk_rows < 1:
        raise InputError(f"--chunk-rows must be >= 1, got {chunk_rows}")
    manifest = fio.check_dump_complete(path, allow_incomplete)
    provenance = {"command": fio.command_line(), "dump": dump_summary(manifest)}
    with fio.output_lock(out, "certify"):
        current = results_fingerprint(path, s_values, options, skip_invalid)
        if not force and recorded_fingerprint(out) == current:
            print(f"note: {out} is up to date (same input and options); --force to certify again",
                  file=sys.stderr)
            return out
        return _run_locked(path, out, s_values, options, workers, scheduler, skip_invalid, progress,
                           chunk_rows, current, provenance)


#: the keys of the results fingerprint and of the provenance record (the command line and the
#: dump manifest's model, options and command) in the output's Parquet (schema) metadata
FINGERPRINT_KEY = b"forcedweight.certify.fingerprint"
PROVENANCE_KEY = b"forcedweight.certify.provenance"


def dump_summary(manifest: dict | None) -> dict | None:
    """The parts of a dump manifest a results file records (model, options, versions, command)."""
    if not manifest:
        return None
    keep = ("model", "model_source", "dtype", "options", "texts", "versions", "command", "n_rows", "complete")
    return {k: manifest[k] for k in keep if k in manifest}


def results_fingerprint(path, s_values, options: CertifyOptions, skip_invalid: bool) -> dict:
    """What a finished output depends on: input files (path, size, mtime), budgets, options, version."""
    fp = fingerprint(path, s_values, options, skip_invalid, 0)
    fp.pop("chunk_rows")
    fp["package_version"] = __version__
    return fp


def recorded_fingerprint(out: Path) -> dict | None:
    """The fingerprint stored in an existing output (None: no output, or none recorded/readable)."""
    return fio.parquet_json_metadata(out, FINGERPRINT_KEY)


def _run_locked(path, out: Path, s_values: list[int], options: CertifyOptions, workers: int,
                scheduler: str | None, skip_invalid: bool, progress: bool, chunk_rows: int,
                results_fp: dict | None = None, provenance: dict | None = None) -> Path:
    """``run_certify`` once the output lock is held."""
    _check_paths(path, out)

    note = fio.stderr_notes()

    total, _ = validate_input(path, s_values, skip_invalid, options)
    parts = parts_dir_for(out)
    kill_after = int(os.environ.get(KILL_HOOK, "0") or 0)
    written = 0
    shards: list[Shard] = []
    schema_seen: pa.Schema | None = None

    def finish(shard: Shard, result) -> None:
        nonlocal written
        if result[0] == "row_error":
            raise RowError(result[1], result[2], result[3])
        fio.write_table_atomic(result[1], parts / shard.name)
        done[shard.name] = result[1].num_rows
        fio.write_work_state(parts, state, done)
        written += 1
        if kill_after and written >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    executor, owned, slots = _executor(workers, scheduler)  # connect first: a bad address leaves nothing
    ok = False
    try:
        state = fingerprint(path, s_values, options, skip_invalid, chunk_rows)
        done = fio.prepare_work_dir(parts, state, note)
        with _progress(progress, total) as advance:
            pending: dict = {}

            def drain() -> None:
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in finished:
                    shard = pending.pop(fut)
                    finish(shard, fut.result())
                    advance(shard.length)

            for shard, batch in iter_shards(path, chunk_rows):
                shards.append(shard)
                schema_seen = schema_seen or batch.schema
                part = parts / shard.name
                if part.exists() or shard.name in done:
                    problem = part_problem(part, shard.length * len(s_values), done.get(shard.name))
                    if problem is None:
                        advance(shard.length)
                        continue
                    note(f"note: {part}: {problem}; certifying its rows again")
                    done.pop(shard.name, None)
                    part.unlink(missing_ok=True)
                args = (batch, shard.start, shard.source, s_values, options, skip_invalid)
                if executor is None:
                    finish(shard, _shard_task(*args))
                    advance(shard.length)
                    continue
                pending[executor.submit(_shard_task, *args)] = shard
                while len(pending) >= 2 * slots:
                    drain()
            while pending:
                drain()
        ok = True
    finally:
        if isinstance(executor, ProcessPoolExecutor):
            # on success the idle workers exit in the background (their teardown takes seconds)
            executor.shutdown(wait=not ok, cancel_futures=True)
        elif executor is not None:
            executor.shutdown(wait=False)
        for closer in owned:
            closer()

    tables = [pq.read_table(parts / sh.name) for sh in shards]
    if tables:
        table = pa.concat_tables(tables, promote_options="permissive")
    else:
        table = output_schema(schema_seen).empty_table()
    table = table.sort_by([("row_id", "ascending"), ("s", "ascending")])
    if results_fp is not None:
        meta = dict(table.schema.metadata or {})
        meta[FINGERPRINT_KEY] = json.dumps(results_fp).encode()
        if provenance is not None:
            meta[PROVENANCE_KEY] = json.dumps(provenance).encode()
        table = table.replace_schema_metadata(meta)
    fio.write_table_atomic(table, out)
    shutil.rmtree(parts, ignore_errors=True)
    return out


def _executor(workers: int, scheduler: str | None):
    """``(executor or None, [closers], slots)``: None = run in this process; slots = parallel tasks."""
    if scheduler:
        try:
            from distributed import Client
        except ImportError as exc:  # pragma: no cover
            raise InputError(f"--scheduler needs dask.distributed ({exc})") from None
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"--scheduler {scheduler}: cannot connect ({exc})") from None
        slots = max(1, sum(client.nthreads().values()))
        return client.get_executor(pure=False), [client.close], slots
    if workers == 1:
        return None, [], 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // workers)
    # new worker processes read these when NumPy/Numba load: no oversubscription of the cores
    saved = {k: os.environ.get(k) for k in _THREAD_VARS}
    os.environ.update({k: str(threads) for k in _THREAD_VARS})

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    ex = ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context(),
                             initializer=_init_worker, initargs=(threads, os.getpid()))
    return ex, [restore], workers


#: imported once by the fork server, so that workers start without re-importing them
PRELOAD = ("forcedweight.certify.worker_guard", "forcedweight.certify.run", "forcedweight.certify.enumerate", "forcedweight.certify.solvers.bnb",
           "forcedweight.certify.solvers.mitm")


def _mp_context():
    """A fork server (a clean process, never the caller's threads or torch state) with the
    certification modules preloaded; plain spawn where fork servers do not exist.

    The fork server imports ``worker_guard`` first, which ties it to the caller
    (``io.die_with_parent``); each worker ties itself to the fork server in ``_init_worker``. So a
    killed caller (kill -9 included) takes the fork server, then its workers, with it; the
    resource tracker exits when their pipes close."""
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ctx
    return mp.get_context("spawn")


_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def certify_file(
    input: str | Path,
    out: str | Path,
    s_values: Sequence[int],
    options: CertifyOptions | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    skip_invalid: bool = False,
    progress: bool = True,
    chunk_rows: int = 64,
    allow_incomplete: bool = False,
    force: bool = False,
) -> Path:
    """Certify every row of a Parquet file/directory at every budget; write RESULTS atomically.

    See ``run_certify`` for streaming, workers, Dask, resume and bad input.
    """
    return run_certify(input, out, s_values, options or CertifyOptions(), workers=workers,
                       scheduler=scheduler, skip_invalid=skip_invalid, progress=progress,
                       chunk_rows=chunk_rows, allow_incomplete=allow_incomplete, force=force)
