"""Input and output at the edges: atomic writes, Parquet listing, progress bars, the command line.

- Writes are atomic: a temporary file in the destination directory, renamed over the target on
  success (``atomic_path``, ``write_table_atomic``); ``check_output_file`` fails before any work.
- ``list_parquet_files`` lists the row files of a file or directory, skipping hidden work files and
  a dump's sidecar tables; ``open_parquet`` opens one with an error that names it.
- ``progress`` is the one progress bar of every long step (rich, on stderr).
- ``command_line`` is the one way a report records the command that produced it.
- ``check_dump_complete`` refuses a dump whose ``manifest.json`` says ``complete: false``, or whose row
  shards hold another number of rows than it says (a damaged dump).
- ``die_with_parent`` makes a worker process exit when its parent dies (Linux ``prctl``).
- ``staged_outputs`` writes a command's whole output set into a hidden staging directory and
  moves it into place only on success, replacing the previous run's outputs (never a mix).
- ``output_lock`` holds an exclusive lock (``fcntl.flock`` on ``.<name>.lock`` beside the output)
  for the whole of a run, so that a second run on the same output is refused, naming the holder; the
  directories it had to make are removed again, when empty, if the run fails (no empty output left).
- ``file_digest`` is the content identity of an input file in a resumable run's fingerprint.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight.errors import InputError


# Files a dump directory holds beside its row shards; never read as rows.
SIDECAR_PATTERNS = ("texts.parquet", "stats-*.parquet")


def is_sidecar(path: Path) -> bool:
    return any(path.match(pattern) for pattern in SIDECAR_PATTERNS)


def list_parquet_files(path: str | os.PathLike) -> list[Path]:
    """The row Parquet files of a file or a directory (sorted, recursive), or an InputError.

    In a directory, hidden files (work in progress) and a dump's sidecar tables
    (``texts.parquet``, ``stats-*.parquet``) are skipped.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    files = sorted(
        p
        for p in path.rglob("*.parquet")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts) and not is_sidecar(p)
    )
    if not files:
        raise InputError(f"{path}: directory holds no .parquet files")
    return files


def open_parquet(path: Path) -> pq.ParquetFile:
    """Open a Parquet file or raise an InputError naming it."""
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a readable Parquet file ({first})") from None


@contextlib.contextmanager
def read_guard(path: str | os.PathLike):
    """Turn a failed read of ``path`` (corrupt pages under an intact footer, a truncated file, an
    I/O error) into one InputError naming it; used around every read of an input's data."""
    import polars as pl

    try:
        yield
    except InputError:
        raise
    except (OSError, pa.ArrowException, pl.exceptions.PolarsError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"{path}: unreadable Parquet data ({first})") from None


def find_manifest(path: str | os.PathLike) -> Path | None:
    """The ``manifest.json`` of the dump that ``path`` (a rows file or directory) belongs to, if any.

    Looked for in the directory itself (or a file's directory) and in its parent (a dump whose
    rows live in a ``rows/`` subdirectory).
    """
    path = Path(path)
    base = path if path.is_dir() else path.parent
    for d in (base, base.parent):
        if (d / "manifest.json").is_file():
            return d / "manifest.json"
    return None


def check_dump_complete(path: str | os.PathLike, allow_incomplete: bool = False) -> dict | None:
    """Refuse rows of a dump that did not finish (``manifest.json`` says ``complete: false``).

    Returns the manifest (None when ``path`` has none: rows made by other tools are taken as
    they are). Raises InputError naming the dump and how to resume it, unless
    ``allow_incomplete`` (then the rows written so far are used).
    """
    manifest_path = find_manifest(path)
    if manifest_path is None:
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{manifest_path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise InputError(f"{manifest_path}: unreadable manifest (not a JSON object)")
    if manifest.get("complete") is False and not allow_incomplete:
        expected = manifest.get("n_rows")
        of = f" of {expected} rows" if expected is not None else ""
        raise InputError(
            f"{manifest_path.parent}: incomplete dump (manifest.json says complete: false; a killed or running "
            f"`forcedweight dump`{of}); resume it by rerunning the same `forcedweight dump ... --out "
            f"{manifest_path.parent}` command, or pass --allow-incomplete to use the rows written so far"
        )
    expected = manifest.get("n_rows")
    if manifest.get("complete") is True and isinstance(expected, int) and Path(path).is_dir() \
            and Path(path).resolve() == manifest_path.parent.resolve():  # the whole dump: every shard there
        files = list_parquet_files(path) if expected else []
        held = sum(open_parquet(f).metadata.num_rows for f in files)
        if held != expected:
            raise InputError(f"{manifest_path.parent}: damaged dump: manifest.json says {expected} rows, its row shards "
                             f"hold {held} (a shard deleted or replaced); dump again into a new --out directory")
    return manifest


_KINDS = {
    "text": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t),
    "numbers": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t),
    "lists of numbers": lambda t: (pa.types.is_list(t) or pa.types.is_large_list(t))
    and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)),
}
_KINDS["integers"] = _KINDS["numbers"]  # a float column may hold integers: a fraction is refused with its row


def check_column_types(path, schema: pa.Schema, kinds: dict[str, str], hint: str = "") -> None:
    """InputError ``"{path}: column {name} holds {type}, not {kind}{hint}"`` for the first column of ``kinds``
    (name -> "text", "numbers", "integers" or "lists of numbers") whose Arrow type is not of its kind; absent
    columns are skipped, and dictionary-encoded text (a polars Categorical) is text. One line where a cast
    deep in polars or NumPy would raise."""
    for name, kind in kinds.items():
        if name not in schema.names:
            continue
        t = schema.field(name).type
        if kind == "text" and pa.types.is_dictionary(t):
            t = t.value_type
        if not _KINDS[kind](t):
            raise InputError(f"{path}: column {name} holds {t}, not {kind}{hint}")


def check_output_dir(target: str | os.PathLike, option: str = "--out") -> Path:
    """``target`` as a Path, after failing early when it exists and is not a directory (InputError naming
    ``option`` and the path). Creates nothing: the command makes the directory once its inputs are good."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise InputError(f"{option}: {target}: exists and is not a directory")
    return target


def check_output_file(target: str | os.PathLike) -> Path:
    """Fail early, before any work, when ``target`` cannot be written as a file; creates nothing.

    The directory is probed with a temporary file; a missing one (which ``atomic_path`` creates at the
    first write) by its nearest existing ancestor, which must be a writable directory. Raises InputError
    naming ``target`` when it is an existing directory, or a file stands in its path, or its directory
    cannot be written.
    """
    target = Path(target)
    if target.is_dir():
        raise InputError(f"--out: {target}: output path is a directory")
    parent = target.parent if str(target.parent) else Path(".")
    _, ancestor = _nearest_dir(target, parent)
    if ancestor != parent:
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise InputError(f"--out: {target}: cannot write output ({ancestor} is not writable)")
        return target
    try:
        with tempfile.TemporaryFile(prefix=f".{target.name}.", dir=parent):
            pass
    except OSError as exc:
        raise InputError(f"--out: {target}: cannot write output ({exc.strerror or exc})") from None
    return target


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = ""):
    """Yield a temporary path beside ``target``; rename it over ``target`` only on success.

    On an exception the temporary file is removed and ``target`` is left as it was.
    An unwritable destination raises InputError naming it.
    """
    target = Path(target)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise InputError(f"{target}: output path is a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix + ".tmp", dir=parent)
    except OSError as exc:
        raise InputError(f"{target}: cannot write output ({exc.strerror or exc})") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
    try:
        yield Path(tmp)
        fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC: disk full, one line naming the target
            raise InputError(f"{target}: no space left on device") from None
        raise


OUTPUTS_RECORD = ".forcedweight-outputs.json"


@contextlib.contextmanager
def staged_outputs(out: str | os.PathLike, owned: tuple[str, ...] = (), keep: tuple[str, ...] = ()):
    """Yield a hidden staging directory inside ``out``; on success its entries replace the last run's.

    Everything a command writes goes to the staging directory. On success the outputs of the
    previous run (the names listed in ``out/.forcedweight-outputs.json``, plus the names in
    ``owned``, which a run from before that record may have left; never those in ``keep``) are
    removed, and the staged entries are renamed into ``out`` (a rename per entry, no copy). On an
    exception the staging directory is removed and ``out`` is left exactly as it was, so a rerun never
    leaves an old ``report.md`` beside new tables and a failed run never leaves half its tables.
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    except OSError as exc:
        raise InputError(f"{out}: cannot write output ({exc.strerror or exc})") from None
    try:
        yield stage
        new = sorted(p.name for p in stage.iterdir())
        record = out / OUTPUTS_RECORD
        old: set[str] = set(owned)
        with contextlib.suppress(OSError, ValueError, TypeError):
            old |= set(json.loads(record.read_text()))
        for name in sorted(old - set(keep)):
            if "/" in name or name in ("", ".", "..") or name.startswith(".staging-"):
                continue
            victim = out / name
            if victim.is_dir() and not victim.is_symlink():
                shutil.rmtree(victim)
            else:
                with contextlib.suppress(FileNotFoundError):
                    victim.unlink()
        for name in new:
            fsync_file(stage / name)
            os.replace(stage / name, out / name)
        with atomic_path(record) as tmp:
            tmp.write_text(json.dumps(new))
        fsync_dir(out)
    except OSError as exc:
        raise os_error(exc, out) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def os_error(exc: OSError, where: str | os.PathLike | None = None) -> InputError:
    """An OSError of a write or read as a one-line InputError naming the path (disk full included)."""
    import errno as _errno

    path = exc.filename or where or "output"
    if exc.errno == _errno.ENOSPC:
        return InputError(f"{path}: no space left on device")
    return InputError(f"{path}: {exc.strerror or exc}")


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file to disk (so that a rename after it never exposes an empty file)."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry (a rename into it) to disk; ignored where unsupported."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = 9) -> bool:
    """Ask the kernel to send ``sig`` (default SIGKILL) to this process when its parent dies.

    Linux ``prctl(PR_SET_PDEATHSIG)`` through ctypes; returns False where unavailable (other
    systems). The parent is the thread that forked this process. When the parent is already gone
    (re-parented to init) the process exits at once.
    """
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        try:  # glibc by its name: find_library runs ldconfig in a subprocess in every worker
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:
        os._exit(1)
    return True


def stderr_notes(quiet: bool = False):
    """A ``note(msg)`` for long runs' one-line messages (model loaded, file written): to stderr, or nowhere
    when ``quiet``, so stdout keeps only a command's result."""
    def note(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr)

    return note


def lock_path_for(out: str | os.PathLike) -> Path:
    """The lock file of an output (file or directory): ``.<name>.lock`` beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


#: locks this process holds (resolved lock path -> depth); a nested ``output_lock`` re-enters
_HELD: dict[str, int] = {}


@contextlib.contextmanager
def output_lock(out: str | os.PathLike, command: str = "run"):
    """Hold an exclusive lock on ``out``'s work (a file or a directory) for the ``with`` block.

    The lock is ``fcntl.flock`` on ``.<name>.lock`` beside ``out``, holding the holder's pid. A
    second holder in another process gets an InputError naming the holder's pid; the
    kernel drops the lock when the holder dies, so a crash never leaves a stale lock. The lock file
    is removed on exit (while still locked; a waiter that opened the removed file retries). Nested
    use in the holding process re-enters.
    """
    lock = lock_path_for(out)
    key = str(lock.resolve())
    if key in _HELD:  # re-entered by this process (e.g. a pipeline step inside a locked pipeline)
        _HELD[key] += 1
        try:
            yield lock
        finally:
            _HELD[key] -= 1
        return
    parent = lock.parent
    created, _ = _nearest_dir(out, parent)  # removed again, when still empty, if the command fails
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out: {out}: cannot write output ({exc.strerror or exc})") from None
    with _remove_if_empty_on_error(created):
        yield from _locked(out, command, lock, key)


def _nearest_dir(out, parent: Path) -> tuple[list[Path], Path]:
    """``(missing_dirs(parent), the nearest existing ancestor of parent)``; InputError naming ``out`` when
    that ancestor is not a directory (a file stands in the output's path)."""
    missing = missing_dirs(parent)
    ancestor = missing[-1].parent if missing else parent
    if not ancestor.is_dir():
        raise InputError(f"--out: {out}: cannot write output ({ancestor} is not a directory)")
    return missing, ancestor


def missing_dirs(path: Path) -> list[Path]:
    """The directories of ``path`` (itself included) that do not exist yet, deepest first."""
    out = []
    path = Path(path)
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


@contextlib.contextmanager
def _remove_if_empty_on_error(dirs: list[Path]):
    """On an exception, remove those of ``dirs`` (deepest first) that the failed command left empty: a bad
    input found after the lock was taken leaves no empty output directory behind."""
    try:
        yield
    except BaseException:
        for d in dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _locked(out, command: str, lock: Path, key: str):
    """The body of ``output_lock`` once ``lock``'s directory exists (a generator: yields once, locked)."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise InputError(f"{out}: cannot create the lock file {lock} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise InputError(f"{out}: another {command} is already writing it (pid {holder}; lock {lock}); "
                             "wait for it to finish or stop it") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: take the new one
    _HELD[key] = 1
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock
    finally:
        del _HELD[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def write_table_atomic(table: pa.Table, target: str | os.PathLike, row_group_size: int | None = None) -> Path:
    """Write a Parquet file atomically (temporary file in the same directory, then rename)."""
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_size)
    return Path(target)


def command_line(argv: list[str] | None = None, program: str = "forcedweight") -> str:
    """The command that is running, shell-quoted, as reports record it.

    Under the ``forcedweight`` entry point (or ``python -m forcedweight``) the program name is
    written as ``forcedweight``; from Python (no CLI arguments) it names the calling script.
    """
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return f"{program} (from Python)"
    head = Path(argv[0]).name
    if head in (program, "__main__.py") or head.startswith(program):
        argv = [program, *argv[1:]]
    return shlex.join(argv)


def progress(label: str, enabled: bool = True, transient: bool = False):
    """The progress bar of every long step: ``label``, bar, done/total, elapsed, remaining (stderr).

    Use as ``with progress("certify") as bar: task = bar.add_task("rows", total=n); bar.advance(task)``.
    ``enabled=False`` gives a silent bar with the same interface.
    """
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(
        TextColumn(f"[bold]{label}[/bold] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=transient,
    )


def prepare_work_dir(parts: Path, state: dict, note) -> dict[str, int]:
    """The hidden work directory of a resumable run: reuse it when its ``state.json`` matches ``state``.

    Returns the parts recorded there as finished (name -> record count; empty for a new directory).
    A directory left by a run with another fingerprint is cleared (``note`` says so) and started
    over. Used by ``certify`` (shards) and ``evaluate`` (examples).
    """
    state_file = parts / "state.json"
    if parts.exists():
        try:
            old = json.loads(state_file.read_text())
        except (OSError, ValueError):
            old = None
        recorded = old.pop("parts", {}) if isinstance(old, dict) else {}
        if old == state and isinstance(recorded, dict):
            return {str(k): int(v) for k, v in recorded.items()}
        note(f"note: {parts} holds parts of a run with other input or options; starting over")
        shutil.rmtree(parts)
    parts.mkdir(parents=True)
    write_work_state(parts, state, {})
    return {}


def write_work_state(parts: Path, state: dict, done: dict[str, int]) -> None:
    """``state.json`` of a work directory: the run's fingerprint and its finished parts (atomic)."""
    with atomic_path(parts / "state.json") as tmp:
        tmp.write_text(json.dumps({**state, "parts": done}, indent=1))


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's content (hex): the identity of an input such as a task file in a resumable run's
    fingerprint (a copy elsewhere is the same input; an edit in place is another)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parquet_json_metadata(path: str | os.PathLike, key: bytes) -> dict | None:
    """The JSON record stored under ``key`` in a Parquet file's schema metadata (None when absent,
    unreadable, or the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[key])
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
