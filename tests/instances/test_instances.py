"""Hardness instances (issue 5): proved answers, exact solvers, the reductions' properties, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from forcedweight.core import operator as op
from forcedweight.cli import app
from forcedweight.certify.enumerate import brute_force_best, enumerate_best
from forcedweight.instances import (
    generate,
    kveviction_row,
    partition_row,
    prove_balanced,
    verify_witness,
    write_kveviction,
    write_partition,
)
from forcedweight.instances.partition import check_parameters, default_bits, expected_equal_splits
from forcedweight.errors import InputError
from forcedweight.rows import validate_row
from forcedweight.certify.solvers.cpsat import solve_cpsat
from forcedweight.certify.solvers.mitm import matches, solve_mitm


def exact_min_diff(a) -> int:
    """Plain itertools reference: min |2 sum_S a - T| over |S| = m/2 (Python ints)."""
    a = [int(x) for x in a]
    total = sum(a)
    return min(abs(2 * sum(a[i] for i in S) - total) for S in combinations(range(len(a)), len(a) // 2))


def row_arrays(row: dict):
    return validate_row(row["weights"], row["values"], row["value_dim"], row["row_id"])


# ---------------------------------------------------------------- proofs


def test_signed_sum_proof_matches_brute_force_on_random_integers():
    rng = np.random.default_rng(5)
    for m in range(2, 17, 2):
        for _ in range(12):
            bits = int(rng.integers(1, 10))
            a = rng.integers(-(2**bits), 2**bits, size=m)
            proof = prove_balanced(a)
            assert proof.min_diff == exact_min_diff(a)
            # the returned split attains it (exact integers)
            assert proof.split.size == m // 2
            assert abs(2 * int(a[proof.split].sum()) - int(a.sum())) == proof.min_diff


@pytest.mark.parametrize("m", [2, 4, 8, 12, 16])
def test_generated_answers_of_all_kinds_agree_with_brute_force(m):
    insts = generate(m, 9, seed=3)
    assert [i["kind"] for i in insts] == ["yes", "no", "near_miss"] * 3
    for inst in insts:
        a = inst["integers"]
        assert np.all((a >= 1) & (a < 2 ** inst["bits"]))
        brute = exact_min_diff(a)
        assert inst["answer"] == (brute == 0)
        assert inst["min_diff"] == brute
        assert inst["gap"] == brute / m  # exact ES of the row: |2 sum_S a - T| / m
        if inst["kind"] == "yes":
            assert verify_witness(a, inst["witness"])
        else:
            assert inst["witness"] is None and brute > 0
        if inst["kind"] == "near_miss" or int(a.sum()) % 2:
            assert brute >= 1
        if int(a.sum()) % 2 == 0 and not inst["answer"]:
            assert brute >= 2  # 2 sum_S - T is even when T is: the gap is at least 2/m


def test_generator_is_deterministic_and_independent_of_count():
    a = generate(12, 6, seed=11)
    b = generate(12, 3, seed=11)
    c = generate(12, 3, seed=12)
    for x, y in zip(a[:3], b):
        assert np.array_equal(x["integers"], y["integers"]) and x["kind"] == y["kind"]
    assert not all(np.array_equal(x["integers"], y["integers"]) for x, y in zip(b, c))


def test_parameters_are_checked():
    with pytest.raises(InputError, match="--m"):
        check_parameters(7, None)
    with pytest.raises(InputError, match="--bits"):
        check_parameters(40, 48)  # 40 * 2**48 >= 2**53: sums not exact in float64
    assert check_parameters(40, None) == default_bits(40) == 37
    with pytest.raises(InputError, match="--kinds"):
        generate(8, 2, 0, kinds="yes,maybe")
    with pytest.raises(InputError, match="--bits"):
        check_parameters(4, 1100)  # 2.0**1100 overflowed (a traceback)
    for seed in (-1, 2**63, 1.5):  # SeedSequence's ValueError / the int64 seed column's OverflowError
        with pytest.raises(InputError, match="--seed"):
            generate(4, 2, seed)
    with pytest.raises(InputError, match="--count"):
        generate(4, 0, 0)
    # where a draw is a no-instance with probability below 1 / MAX_DRAWS (m = 46, 48 at float64-honest bits),
    # no and near-miss instances are refused at once instead of after hours of proofs; yes-instances stay
    assert expected_equal_splits(40, 37) == pytest.approx(0.219, abs=0.005)  # e^-0.22 = 80 % no-instances
    for m in (46, 48):
        with pytest.raises(InputError, match="--kinds yes"):
            generate(m, 2, 0, kinds="yes,no")
    assert generate(48, 1, 0, kinds="yes")[0]["answer"]


def test_near_miss_integers_stay_in_range_at_two_bits():
    # a_j = 2 at bits = 2: both of 2 ± 2 leave [1, 4); the integer used to be moved anyway (to 0 or 4)
    insts = generate(2, 60, 0, bits=2, kinds="near_miss")
    assert all(1 <= x < 4 for inst in insts for x in inst["integers"])
    assert all(not inst["answer"] and inst["min_diff"] == exact_min_diff(inst["integers"]) for inst in insts)
    assert verify_witness([1, 1, 2, 2], [0, 2]) and not verify_witness([1, 1, 2, 2], [0.9, 2.5])  # no truncation
    with pytest.raises(ValueError, match="2\\*\\*62"):  # a uint64 beyond int64 used to wrap (min_diff 4)
        prove_balanced(np.array([2**64 - 3, 1], dtype=np.uint64))


def test_a_manifest_that_cannot_be_written_leaves_no_parquet(tmp_path):
    (tmp_path / "partition-m4.json").mkdir()
    with pytest.raises(InputError, match="partition-m4.json"):
        write_partition(tmp_path, 4, 2, seed=0)
    assert not (tmp_path / "partition-m4.parquet").exists()


# ---------------------------------------------------------------- meet-in-the-middle solver


def test_matches_recognises_the_structure():
    p = np.full(6, 1 / 6)
    V = np.array([3.0, -1.0, 4.0, 1.0, -5.0, 9.0])[:, None]
    assert matches(p, V)
    assert not matches(p, V + 0.5)  # not integers
    assert not matches(np.array([0.2, 0.2, 0.2, 0.2, 0.1, 0.1]), V)  # masses not uniform
    assert not matches(p, np.hstack([V, V]))  # 2-D values
    assert not matches(p, np.full((6, 1), 2.0**51))  # N * max|a| >= 2**53


def test_mitm_matches_brute_force_for_every_s():
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 8, 11, 14):
        for _ in range(3):
            a = rng.integers(-(2**20), 2**20, size=n)
            p, V = np.full(n, 1 / n), a.astype(np.float64)[:, None]
            for s in range(1, n + 1):
                res = solve_mitm(p, V, s)
                value, _ = brute_force_best(p, V, s)
                exact = min(abs(n * int(a[list(S)].sum()) - s * int(a.sum())) for S in combinations(range(n), s))
                assert res.proved and res.solver == "mitm"
                assert res.info["numerator"] == exact  # exact integer optimum
                assert res.best_set.size == s
                # value is operator.forced_error of the set, so it equals the float reference
                # up to float64 rounding of E (op.forced_error_rounding bounds it)
                assert res.value == op.forced_error(p, V, res.best_set)
                assert abs(res.value - value) <= res.tolerance
                assert abs(res.value - exact / (n * s)) <= res.tolerance


def test_mitm_time_limit_returns_an_unproved_set():
    a = np.random.default_rng(0).integers(0, 2**30, size=40)
    res = solve_mitm(np.full(40, 1 / 40), a.astype(np.float64)[:, None], 20, time_limit=0.0)
    assert not res.proved and res.lower_bound == 0.0 and res.best_set.size == 20


# ---------------------------------------------------------------- solvers against the answers


@pytest.mark.parametrize("m", [8, 16, 24, 40])
def test_mitm_decides_generated_instances(m):
    for inst in generate(m, 3, seed=m):
        row = partition_row(inst)
        p, V = row_arrays(row)
        assert matches(p, V)
        res = solve_mitm(p, V, row["s"])
        assert res.proved
        # N sum_S a - s T = (m/2)(2 sum_S a - T)
        assert res.info["numerator"] == (m // 2) * inst["min_diff"]
        # ES = 0 iff yes; otherwise ES = gap, up to float64 rounding of E
        assert abs(res.value - row["gap"]) <= res.tolerance
        # the worst-case rounding bound stays below half the smallest nonzero gap 1/m: yes and no separate
        assert res.tolerance < 0.5 / m


@pytest.mark.parametrize("m,bits", [(8, None), (16, None), (20, None), (24, 14)])
def test_cpsat_enumeration_and_brute_force_agree_with_answers(m, bits):
    # 14 bits at m = 24 are too few for even-total no-instances (nearly every draw splits evenly)
    for inst in generate(m, 3, seed=1, bits=bits, even_total=bits is None):
        row = partition_row(inst)
        p, V = row_arrays(row)
        s = row["s"]
        res = solve_cpsat(p, V, s, time_limit=30.0)
        assert res.proved and res.solver == "cpsat"
        assert res.info["numerator"] == (m // 2) * inst["min_diff"]
        assert abs(res.value - row["gap"]) <= res.tolerance
        value, best = enumerate_best(p, V, np.arange(m), s)
        tol = op.forced_error_rounding(inst["integers"], s)  # float64 rounding of E at these magnitudes
        assert abs(value - row["gap"]) <= tol
        assert (abs(2 * int(inst["integers"][best].sum()) - int(inst["integers"].sum())) == inst["min_diff"])
        if m <= 16:
            bf_value, _ = brute_force_best(p, V, s)
            assert abs(bf_value - row["gap"]) <= tol


@pytest.mark.parametrize("m", [8, 12])
def test_scip_agrees_with_answers(m):
    from forcedweight.certify.solvers.scip import solve_scip

    for inst in generate(m, 3, seed=2):  # yes, no, near_miss
        row = partition_row(inst)
        p, V = row_arrays(row)
        res = solve_scip(p, V, row["s"], time_limit=30.0)
        assert res.proved and res.solver == "scip"
        # SCIP's proof is relative (res.tolerance); E itself carries float64 rounding
        assert abs(res.value - row["gap"]) <= res.tolerance + op.forced_error_rounding(inst["integers"], row["s"])
        a = inst["integers"]
        assert abs(2 * int(a[res.best_set].sum()) - int(a.sum())) == inst["min_diff"]


def test_cpsat_hint_bound_and_refusal():
    inst = generate(12, 2, seed=4)[1]  # a no-instance
    row = partition_row(inst)
    p, V = row_arrays(row)
    witness = prove_balanced(inst["integers"]).split
    res = solve_cpsat(p, V, 6, incumbent=witness)
    assert res.proved and res.lower_bound == res.value
    assert abs(res.value - inst["gap"]) <= res.tolerance
    with pytest.raises(ValueError, match="not all integers"):
        solve_cpsat(p, V + 0.25, 6)
    with pytest.raises(ValueError, match="not uniform"):
        solve_cpsat(np.linspace(1, 2, 12) / np.linspace(1, 2, 12).sum(), V, 6)


def test_cpsat_time_limit_reports_a_valid_lower_bound():
    inst = generate(40, 2, seed=0)[1]  # a 37-bit no-instance: CP-SAT cannot prove it in 0.5 s
    row = partition_row(inst)
    p, V = row_arrays(row)
    res = solve_cpsat(p, V, 20, time_limit=0.5)
    assert not res.proved and res.info["status"] in ("FEASIBLE", "UNKNOWN")
    assert 0.0 <= res.lower_bound <= row["gap"] <= res.value + res.tolerance  # a bound, not a claim
    assert res.best_set.size == 20


# ---------------------------------------------------------------- KVEVICTION


def test_kveviction_rows_realise_the_reduction():
    for inst in generate(10, 6, seed=2):
        row = kveviction_row(inst)
        n = len(row["integers"])
        K = np.asarray(row["keys"]).reshape(n, -1)
        q = np.asarray(row["query"])
        v = np.asarray(row["values"])
        logits = K @ q / np.sqrt(q.size)
        assert np.array_equal(logits, np.asarray(row["logits"]))
        attn = np.exp(logits - logits.max())
        attn /= attn.sum()
        assert np.allclose(attn, row["weights"], rtol=0, atol=1e-15)  # softmax of equal logits = 1/n

        def attention_error(kept):
            w = attn[list(kept)] / attn[list(kept)].sum()
            return abs(w @ v[list(kept)] - attn @ v)

        keep = round((1 - row["r"]) * n)
        assert keep == row["s"] == n // 2
        best = min(attention_error(I) for I in combinations(range(n), keep))
        # yes iff some kept half meets epsilon = 0; otherwise the best error is the stated gap
        # (float64 rounding of a 10-term mean of 8-bit integers is below 1e-12)
        assert (best <= row["epsilon"] + 1e-12) == row["answer"]
        assert abs(best - row["gap"]) <= 1e-12
        if row["answer"]:
            assert attention_error(row["witness"]) <= 1e-12


# ---------------------------------------------------------------- files and CLI


def test_write_partition_file_and_manifest(tmp_path):
    path = write_partition(tmp_path, 12, 5, seed=9, kinds="no,near_miss")
    assert path == tmp_path / "partition-m12.parquet"
    table = pq.read_table(path)
    assert str(table.schema.field("values").type) == "list<element: double>"
    assert str(table.schema.field("integers").type) == "list<element: int64>"
    rows = table.to_pylist()
    assert [r["kind"] for r in rows] == ["no", "near_miss", "no", "near_miss", "no"]
    for r in rows:
        assert r["values"] == [float(x) for x in r["integers"]] and r["value_dim"] == 1
        assert r["weights"] == [1 / 12] * 12 and r["s"] == 6 and r["witness"] is None
        assert r["gap"] == exact_min_diff(r["integers"]) / 12
    manifest = json.loads((tmp_path / "partition-m12.json").read_text())
    assert manifest["count_by_kind"] == {"no": 3, "near_miss": 2}
    assert manifest["bits"] == default_bits(12)
    a_max = np.array([2 ** manifest["bits"] - 1] * 12)
    assert manifest["e_rounding_bound"] == op.forced_error_rounding(a_max, 6) < 1 / 12


def test_cli_writes_both_constructions(tmp_path):
    runner = CliRunner()
    args = ["--m", "8", "--count", "3", "--seed", "1", "--out", str(tmp_path)]
    res = runner.invoke(app, ["instances", "kveviction", *args])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(tmp_path / "kveviction-m8.parquet").to_pylist()
    assert [r["answer"] for r in rows] == [True, False, False]
    assert rows[0]["keys"] == [1.0] * 8 and rows[0]["query"] == [1.0] and rows[0]["epsilon"] == 0.0
    assert rows == [kveviction_row(i) for i in generate(8, 3, 1)]  # the CLI writes the library's rows
    args = ["--m", "8", "--count", "2", "--bits", "10", "--out", str(tmp_path)]
    res = runner.invoke(app, ["instances", "partition", *args])
    assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "partition-m8.parquet").column("bits").to_pylist() == [10, 10]


def test_cli_bad_option_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", "from forcedweight.cli import main; main()", "instances", "partition",
         "--m", "9", "--count", "2", "--out", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --m must be an even integer >= 2, got 9"
    assert not out.exists()


# ---------------------------------------------------------------- certify agrees with the answers


@pytest.mark.parametrize("construction,solver", [("partition", "cpsat"), ("kveviction", "auto")])
def test_certify_agrees_with_the_proved_answers(tmp_path, construction, solver):
    from forcedweight.certify import CertifyOptions, certify_file

    # m = 28: the candidate pool (24 keys) is not every key, so the solver over all N keys decides (a
    # yes-instance only when the pool holds no witness);
    # 16-bit integers keep CP-SAT fast (too few bits for even-total no-instances: any total)
    write = write_partition if construction == "partition" else write_kveviction
    path = write(tmp_path, 28, 3, seed=5, bits=16, even_total=False)
    out = certify_file(path, tmp_path / "cert.parquet", [14], CertifyOptions(solver=solver, time_limit=30.0),
                       progress=False)
    recs = pq.read_table(out).to_pylist()
    assert [r["kind"] for r in recs] == ["yes", "no", "near_miss"]
    for r in recs:
        a = np.asarray(r["integers"], dtype=np.int64)
        tol = op.forced_error_rounding(a, 14)  # float64 rounding of E at these magnitudes
        assert r["proved"] and r["status"] == "optimal"
        want = "cpsat" if solver == "cpsat" else "mitm"
        # a yes-instance whose witness already lies in the pool has E = 0 there: optimal with no search
        # ("zero"; which of the numerically tied witnesses the pool search returns depends on its key order)
        assert r["pool_size"] < 28 and r["solver"] in ((want, "zero") if r["answer"] else (want,))
        best = np.asarray(r["best_set"])
        assert abs(2 * int(a[best].sum()) - int(a.sum())) == r["min_diff"]  # exact optimum in integers
        if r["answer"]:
            assert r["es_best"] <= tol  # ES = 0 with a witness
        else:
            assert r["es_best"] >= r["gap"] - tol and abs(r["es_best"] - r["gap"]) <= tol


def test_default_bits_keep_the_rounding_bound_below_the_gap_at_every_m():
    from forcedweight.instances.partition import honest_bits, rounding_bound

    for m in range(2, 49, 2):
        bits = default_bits(m)
        assert rounding_bound(m, bits) <= 0.5 / m  # half the smallest nonzero gap 1/m
        assert rounding_bound(m, honest_bits(m) + 1) > 0.5 / m  # honest_bits is the largest such
    assert default_bits(44) == 38 and default_bits(48) == 37  # the bound binds here (was 40 and 44)
    with pytest.raises(InputError, match="rounding bound"):
        check_parameters(44, 42)


def test_no_and_near_miss_instances_have_even_totals_by_default():
    insts = generate(12, 24, seed=3, kinds="no,near_miss")
    assert all(int(np.sum(i["integers"])) % 2 == 0 for i in insts)
    # even T: the smallest imbalance |2 sum_S a - T| is even, so the gap is at least 2/m
    assert all(i["min_diff"] % 2 == 0 and i["gap"] >= 2 / 12 for i in insts)
    for i in insts:  # brute force: no balanced split has equal sums
        a = np.asarray(i["integers"])
        T = int(a.sum())
        best = min(abs(2 * sum(a[list(S)]) - T) for S in __import__("itertools").combinations(range(12), 6))
        assert best == i["min_diff"] > 0
    with pytest.raises(InputError, match="--any-total"):  # too few bits for even-total no-instances
        generate(24, 3, seed=1, bits=8, kinds="no")
    odd = generate(12, 40, seed=3, kinds="no,near_miss", even_total=False)
    assert any(int(np.sum(i["integers"])) % 2 for i in odd)  # the old behaviour, on request
