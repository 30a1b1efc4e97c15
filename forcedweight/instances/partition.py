"""ZEROES rows from balanced partition (docs/instances.md): instances of ES = 0 with proved answers.

Integers ``a_1..a_m`` (m even) become one attention row with N = m keys, uniform masses 1/m,
1-D values ``a_i`` (exact float64 integers) and budget ``s = m/2``. Then
``E(S) = |2 sum_S a - T| / m``, so ES = 0 iff an equal-sum balanced split exists, and otherwise
``ES = min |2 sum_S a - T| / m`` exactly: at least 1/m when T is odd, 2/m when T is even.

Three kinds, every answer proved by :func:`forcedweight.instances.proofs.prove_balanced`:

- ``yes``: a planted equal-sum balanced split (the witness), positions shuffled;
- ``no``: uniform random ``bits``-bit integers (by default one moved by ±1 when T is odd, so
  T is even and parity gives nothing away), redrawn until the proof finds no equal split;
- ``near_miss``: a planted yes-instance with one integer moved by delta in {-2, +2} by default
  (T stays even), or in {-2, -1, +1, +2} with ``even_total=False`` (odd delta: T becomes odd),
  redrawn until the proof finds no equal split.

Default bits keep the float64 rounding bound of ``E`` below half the smallest gap 1/m
(``honest_bits``); explicit bits that would reach the gap are refused.

Instance i of a file is drawn from ``SeedSequence([seed, m, i])``: deterministic given the seed,
and independent of how many instances the file holds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa

from forcedweight.core import operator
from forcedweight.instances.proofs import MAX_M, prove_balanced, verify_witness
from forcedweight.errors import InputError, check_seed
from forcedweight.io import (atomic_path, check_output_dir, check_output_file, output_lock,
                             progress as progress_bar, write_table_atomic)

KINDS = ("yes", "no", "near_miss")
MAX_DRAWS = 10_000


def honest_bits(m: int) -> int:
    """The most bits per integer whose float64 rounding bound (``rounding_bound``) stays at or below
    half the smallest nonzero gap, ``1 / (2 m)``, so a certified ES is never confused with a gap.
    The bound is ``unit * (2**bits - 1)``, with ``unit`` its value for integers of magnitude 1."""
    unit = operator.forced_error_rounding(np.ones(m), m // 2)
    return int(math.floor(math.log2(1.0 / (2.0 * m * unit) + 1.0)))


def default_bits(m: int) -> int:
    """Bits per integer: ``min(ceil(log2 C(m, m/2)) - 1, honest_bits(m))`` (at least 8).

    The second term keeps the stated rounding bound below the 1/m gap at every m (it binds from
    m = 44 on: 38 bits at m = 44, 37 at m = 48).

    The ``C(m, m/2) / 2`` balanced splits then spread their imbalances (standard deviation about
    ``2**bits sqrt(m / 12)``) over a range wider than their number, so a random draw is a
    no-instance with high probability (about 90% at m = 40, 37 bits; the generator redraws the
    rest), near enough to the phase transition to be hard for CP-SAT, while the values stay
    small enough that float64 rounding in ``E`` (at most about ``2 (2 m + 4) eps 2**bits``,
    :func:`forcedweight.core.operator.forced_error_rounding`) stays well below the smallest gap 1/m.
    """
    return max(8, min(math.ceil(math.log2(math.comb(m, m // 2))) - 1, honest_bits(m)))


def check_parameters(m: int, bits: int | None) -> int:
    """Validate m and bits; return bits (the default when None). InputError names the option."""
    if m < 2 or m % 2:
        raise InputError(f"--m must be an even integer >= 2, got {m}")
    if m > MAX_M:
        raise InputError(f"--m {m} is beyond the meet-in-the-middle proof (at most {MAX_M})")
    bits = default_bits(m) if bits is None else int(bits)
    if bits < 2:
        raise InputError(f"--bits must be >= 2, got {bits}")
    if bits >= 53 or m * 2.0**bits >= 2.0**53:
        raise InputError(f"--bits {bits} with --m {m}: sums reach 2**53, not exact in float64")
    if rounding_bound(m, bits) >= 1.0 / m:
        raise InputError(f"--bits {bits} with --m {m}: the float64 rounding bound {rounding_bound(m, bits):.3g} "
                         f"reaches the smallest gap 1/m = {1.0 / m:.3g}; use --bits {honest_bits(m)} or fewer")
    return bits


def _plant_yes(m: int, bits: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Integers in [1, 2**bits) with a planted equal-sum balanced split; returns (a, witness)."""
    lo, hi = 1, 2**bits - 1
    half = m // 2
    for draw in range(MAX_DRAWS):
        x = rng.integers(lo, hi + 1, size=half, dtype=np.int64)
        y = rng.integers(lo, hi + 1, size=half, dtype=np.int64)
        diff = int(x.sum()) - int(y.sum())
        # spread the difference evenly over y, then settle the remainder greedily within range
        step, rem = divmod(diff, half)
        y = y + step
        y[: rem] += 1
        excess = 0
        for j in range(half):
            clipped = min(max(int(y[j]), lo), hi)
            excess += int(y[j]) - clipped
            y[j] = clipped
        for j in rng.permutation(half):
            if excess == 0:
                break
            room = (hi - int(y[j])) if excess > 0 else (lo - int(y[j]))
            move = min(excess, room) if excess > 0 else max(excess, room)
            y[j] += move
            excess -= move
        a = np.concatenate([x, y])
        if excess != 0 or (np.unique(a).size < m and draw < 100):  # prefer distinct integers
            continue
        perm = rng.permutation(m)  # a[perm[k]] = original k
        out = np.empty(m, dtype=np.int64)
        out[perm] = a
        witness = np.sort(perm[:half])
        return out, witness
    raise RuntimeError(f"could not plant a yes-instance at m={m}, bits={bits}")


def make_instance(kind: str, m: int, bits: int, rng: np.random.Generator, even_total: bool = True) -> dict:
    """One balanced-partition instance with its proved answer.

    With ``even_total`` (default) ``no`` and ``near_miss`` instances have an even total T, so
    parity alone never decides them (an odd T has no equal split): a ``no`` draw with an odd T
    moves one integer by ±1, a near miss moves one integer by ±2.

    Returns
    -------
    dict with ``integers`` (m,) int64, ``answer`` bool, ``kind``, ``witness`` ((m/2,) int64 or None),
    ``min_diff`` (int: ``min |2 sum_S a - T|``), ``gap`` (float: ``min_diff / m``), ``draws`` (int).
    """
    if kind not in KINDS:
        raise InputError(f"unknown instance kind {kind!r} (choose from {', '.join(KINDS)})")
    for draw in range(1, MAX_DRAWS + 1):
        if kind == "yes":
            a, witness = _plant_yes(m, bits, rng)
            if not verify_witness(a, witness):  # the witness is the proof
                raise AssertionError("planted witness does not balance")
            return dict(integers=a, answer=True, kind=kind, witness=witness, min_diff=0, gap=0.0, draws=draw)
        if kind == "no":
            a = rng.integers(1, 2**bits, size=m, dtype=np.int64)
            if even_total and int(a.sum()) % 2:
                j = int(rng.integers(m))
                a[j] += 1 if a[j] == 1 else -1
        else:
            a, _ = _plant_yes(m, bits, rng)
            j = int(rng.integers(m))
            delta = int(rng.choice([-2, 2] if even_total else [-2, -1, 1, 2]))
            if not 1 <= a[j] + delta < 2**bits:
                delta = -delta
            if not 1 <= a[j] + delta < 2**bits:  # (bits = 2, a_j = 2: both of ±2 leave [1, 4)) redraw
                continue
            a[j] += delta
        proof = prove_balanced(a)
        if proof.exists:
            continue
        return dict(integers=a, answer=False, kind=kind, witness=None, min_diff=proof.min_diff,
                    gap=proof.gap, draws=draw)
    parity = "even-total " if even_total else ""
    raise InputError(f"--bits {bits} with --m {m}: no {parity}{kind} instance in {MAX_DRAWS} draws (nearly every "
                     f"draw splits evenly); use more --bits (default {default_bits(m)})"
                     + (" or --any-total" if even_total else ""))


def instance_kinds(kinds: Iterable[str] | str) -> tuple[str, ...]:
    """Parse ``"yes,no,near_miss"`` (or a sequence) into a tuple, InputError on an unknown kind."""
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise InputError(f"--kinds: unknown or empty kind(s) {bad} (choose from {', '.join(KINDS)})")
    return kinds


def expected_equal_splits(m: int, bits: int) -> float:
    """About how many of the ``C(m, m/2) / 2`` balanced splits of a random draw (uniform ``bits``-bit
    integers, even total) split it evenly: their imbalances ``2 sum_S a - T`` are about normal with
    standard deviation ``sigma = 2**bits sqrt(m / 12)`` on even values, so each is 0 with probability
    about ``2 / (sqrt(2 pi) sigma)``. A draw is a no-instance with probability about ``exp(-lambda)``
    (about 0.8 at m = 40 and 37 bits, 0.2 at m = 44 and 38 bits, 5e-6 at m = 46 and 37 bits)."""
    sigma = 2.0**bits * math.sqrt(m / 12.0)
    return math.comb(m, m // 2) / (math.sqrt(2 * math.pi) * sigma)  # (C / 2 splits) x (2 / (sqrt(2 pi) sigma))


def check_request(m: int, count: int, seed, bits: int | None, kinds,
                  even_total: bool = True) -> tuple[int, tuple[str, ...], int]:
    """Every option of a generation checked before any work: ``(bits, kinds, seed)``, InputError naming
    the option. With ``even_total``, no and near-miss instances are refused where a draw is a
    no-instance with probability below ``1 / MAX_DRAWS`` (``expected_equal_splits`` above
    ``log(MAX_DRAWS)``): the redraws would take hours and then fail."""
    bits = check_parameters(m, bits)
    kinds = instance_kinds(kinds)
    seed = check_seed(seed)
    if int(count) != count or count < 1:
        raise InputError(f"--count must be an integer >= 1, got {count}")
    lam = expected_equal_splits(m, bits)
    if even_total and lam > math.log(MAX_DRAWS) and any(k != "yes" for k in kinds):
        more = f"more --bits (at most {honest_bits(m)}), " if bits < honest_bits(m) else ""
        raise InputError(
            f"--m {m} --bits {bits}: about exp(-{lam:.0f}) of even-total random draws are no-instances, fewer than "
            f"1 in the {MAX_DRAWS} draws allowed; use {more}--any-total, --kinds yes or a smaller --m")
    return bits, kinds, seed


def generate(m: int, count: int, seed: int, bits: int | None = None,
             kinds: Iterable[str] | str = KINDS, progress: bool = False, even_total: bool = True) -> list[dict]:
    """``count`` instances, kinds assigned round-robin; instance i from ``SeedSequence([seed, m, i])``.

    ``progress`` shows the package's progress bar (``io.progress``) (each no/near-miss proof takes ~0.3 s at m = 40).
    """
    bits, kinds, seed = check_request(m, count, seed, bits, kinds, even_total)
    out = []
    with progress_bar("instances", enabled=progress, transient=True) as bar:
        task = bar.add_task(f"m={m}", total=count)
        for i in range(count):
            rng = np.random.default_rng(np.random.SeedSequence([seed, m, i]))
            inst = make_instance(kinds[i % len(kinds)], m, bits, rng, even_total)
            inst.update(row_id=i, bits=bits, seed=seed)
            out.append(inst)
            bar.advance(task)
    return out


def partition_row(inst: dict) -> dict:
    """The ZEROES row of an instance: the row contract plus s, answer, kind, integers, witness, gap."""
    a = np.asarray(inst["integers"], dtype=np.int64)
    m = a.size
    return {
        "row_id": int(inst["row_id"]),
        "weights": [1.0 / m] * m,
        "values": [float(x) for x in a],  # exact: |a| < 2**53
        "value_dim": 1,
        "s": m // 2,
        "answer": bool(inst["answer"]),
        "kind": inst["kind"],
        "integers": [int(x) for x in a],
        "witness": None if inst["witness"] is None else [int(x) for x in inst["witness"]],
        "gap": float(inst["gap"]),
        "min_diff": int(inst["min_diff"]),
        "bits": int(inst["bits"]),
        "seed": int(inst["seed"]),
    }


PARTITION_FIELDS = [
    pa.field("row_id", pa.int64()),
    pa.field("weights", pa.list_(pa.float64())),
    pa.field("values", pa.list_(pa.float64())),
    pa.field("value_dim", pa.int32()),
    pa.field("s", pa.int64()),
    pa.field("answer", pa.bool_()),
    pa.field("kind", pa.string()),
    pa.field("integers", pa.list_(pa.int64())),
    pa.field("witness", pa.list_(pa.int64())),
    pa.field("gap", pa.float64()),
    pa.field("min_diff", pa.int64()),
    pa.field("bits", pa.int32()),
    pa.field("seed", pa.int64()),
]


def rows_table(rows: list[dict], fields: list[pa.Field]) -> pa.Table:
    """Arrow table of instance rows with an explicit schema (float64 lists, int64 integers)."""
    schema = pa.schema(fields)
    return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in schema}, schema=schema)


def write_instances(table: pa.Table, out_dir: str | Path, name: str, manifest: dict) -> Path:
    """Write ``out_dir/name.parquet`` and ``out_dir/name.json`` atomically; return the Parquet path.

    Both targets are checked before either is written (``instance_targets``), and the manifest is
    renamed into place last, so a failure leaves neither file changed."""
    parquet, manifest_path = instance_targets(out_dir, name)
    with atomic_path(manifest_path) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        path = write_table_atomic(table, parquet)
    return path


def instance_targets(out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """``(out_dir/name.parquet, out_dir/name.json)``, each checked writable (InputError naming it)."""
    out_dir = check_output_dir(out_dir)
    return check_output_file(out_dir / f"{name}.parquet"), check_output_file(out_dir / f"{name}.json")


def _manifest(construction: str, m: int, count: int, seed: int, bits: int, kinds, rows: list[dict]) -> dict:
    return {
        "construction": construction,
        "m": m, "count": count, "seed": seed, "bits": bits, "kinds": list(kinds), "s": m // 2,
        "count_by_kind": {k: sum(1 for r in rows if r["kind"] == k) for k in kinds},
        "gap": "min over |S| = m/2 of |2 sum_S a - T| / m (exact ES; 0 for yes-instances)",
        "proof": "forcedweight.instances.proofs.prove_balanced (signed-sum meet-in-the-middle, int64)",
        "e_rounding_bound": rounding_bound(m, bits),
    }


def rounding_bound(m: int, bits: int) -> float:
    """Bound on the float64 rounding of ``E`` for these rows (``core.operator.forced_error_rounding``).

    Compare a certified ES with ``gap`` within this bound; at the default bits it stays at or
    below half the smallest nonzero gap 1/m at every m (``honest_bits``).
    """
    return operator.forced_error_rounding(np.full(m, 2.0**bits - 1), m // 2)


def write_partition(out_dir: str | Path, m: int, count: int, seed: int, bits: int | None = None,
                    kinds: Iterable[str] | str = KINDS, progress: bool = False, even_total: bool = True) -> Path:
    """Generate and write ``out_dir/partition-m{m}.parquet`` plus a JSON manifest beside it."""
    bits, kinds, seed = check_request(m, count, seed, bits, kinds, even_total)
    parquet, _ = instance_targets(out_dir, f"partition-m{m}")  # before any work
    with output_lock(parquet, "instances"):
        rows = [partition_row(inst) for inst in generate(m, count, seed, bits, kinds, progress, even_total)]
        manifest = _manifest("zeroes-from-balanced-partition", m, count, seed, bits, kinds, rows)
        manifest["even_total"] = bool(even_total)
        return write_instances(rows_table(rows, PARTITION_FIELDS), out_dir, f"partition-m{m}", manifest)
