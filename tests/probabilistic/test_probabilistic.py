"""Probabilistic eviction with importance-sampling correction (issue 7, SPEC §8, paper 000)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
import torch

from forcedweight.probabilistic import (
    corrected_output,
    correction_bias,
    expected_unique,
    global_sample_count,
    gqa_mixture,
    make_proposal,
    proposal_from_scores,
    sample,
    sample_count,
    streaming_proposal,
    two_interval_output,
    validate_proposal,
)
from forcedweight.probabilistic.proposals import h2o_scores, snapkv_scores
from forcedweight.probabilistic.study import StudyConfig, load_trajectories, run_study, topk_set
from forcedweight.errors import InputError
from forcedweight.io import write_table_atomic
from forcedweight.rows import make_row_table, row_schema


def _row(rng, n, n_post, d, q=1):
    logits = rng.normal(0, 2, (q, n))
    post = rng.normal(0, 2, (q, n_post))
    return logits, rng.normal(size=(n, d)), post, rng.normal(size=(n_post, d))


# ------------------------------------------------------------------------------------- the estimator
@pytest.mark.parametrize("tau", [1.0, 2.5, np.inf])
def test_corrected_estimator_equals_two_interval_formula(tau):
    rng = np.random.default_rng(1)
    for trial in range(30):
        n, n_post, d, q = rng.integers(2, 40), rng.integers(0, 10), rng.integers(1, 9), 4
        logits, V, post, Vp = _row(rng, n, n_post, d, q)
        pi = rng.dirichlet(np.ones(n))
        m = int(rng.integers(1, 3 * n))
        kept, counts = sample(pi, m, rng)
        b = correction_bias(counts, pi[kept], m, tau)
        got = corrected_output(logits, V, kept, b, post, Vp)
        for r in range(q):
            want = two_interval_output(logits[r], V, kept, counts, pi[kept], m, post[r], Vp, tau)
            # both in float64; they differ only in the order of the same O(n) operations
            np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-12)


def test_uncorrected_is_renormalisation_and_full_keep_is_dense():
    rng = np.random.default_rng(2)
    logits, V, post, Vp = _row(rng, 12, 3, 4)
    kept = np.array([0, 3, 7])
    z = np.concatenate([logits[0, kept], post[0]])
    w = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    want = w @ np.vstack([V[kept], Vp])
    np.testing.assert_allclose(corrected_output(logits[0], V, kept, None, post[0], Vp), want, atol=1e-13)
    all_ = np.arange(12)
    p = np.exp(np.concatenate([logits[0], post[0]]))
    dense = (p / p.sum()) @ np.vstack([V, Vp])
    np.testing.assert_allclose(corrected_output(logits[0], V, all_, np.zeros(12), post[0], Vp), dense, atol=1e-13)
    # a kept set that wraps (-1), repeats an entry or leaves the row, a non-finite bias, nothing to attend to
    for bad, match in (((np.array([0, -1]), None), "kept"), ((np.array([3, 3]), None), "kept"),
                       ((np.array([12]), None), "kept"), ((kept, np.array([0.0, np.nan, 0])), "bias"),
                       ((kept, np.array([0.0, np.inf, 0])), "bias")):
        with pytest.raises(InputError, match=match):
            corrected_output(logits[0], V, bad[0], bad[1], post[0], Vp)
    with pytest.raises(InputError, match="nothing to attend to"):
        corrected_output(logits[0], V, np.array([], dtype=np.int64), None)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
def test_bias_through_ragged_decode_equals_formula(dtype, tol):
    """Segment of KV head h = kept pre-eviction entries (bias b_i) then post-eviction entries (bias 0)."""
    from forcedweight.kernels import ragged_decode

    rng = np.random.default_rng(3)
    B, Hkv, G, D = 2, 3, 3, 64
    q = rng.normal(size=(B, Hkv * G, D))
    ks, vs, bs, ptr, expect = [], [], [], [0], np.zeros((B, Hkv * G, D))
    for b in range(B):
        for h in range(Hkv):
            n, n_post = int(rng.integers(5, 60)), int(rng.integers(0, 20))
            K, V = rng.normal(size=(n, D)), rng.normal(size=(n, D))
            Kp, Vp = rng.normal(size=(n_post, D)), rng.normal(size=(n_post, D))
            pi = 0.5 * rng.dirichlet(np.ones(n)) + 0.5 / n
            m = sample_count(pi, 0.5 * n)
            kept, counts = sample(pi, m, rng)
            bias = correction_bias(counts, pi[kept], m, 1.0)
            ks += [K[kept], Kp]
            vs += [V[kept], Vp]
            bs += [bias, np.zeros(n_post)]
            ptr.append(ptr[-1] + kept.size + n_post)
            for g in range(G):
                j = h * G + g
                s, sp = K @ q[b, j] / np.sqrt(D), Kp @ q[b, j] / np.sqrt(D)
                expect[b, j] = two_interval_output(s, V, kept, counts, pi[kept], m, sp, Vp, 1.0)
    t = lambda a: torch.tensor(np.concatenate(a) if isinstance(a, list) else a, dtype=dtype)  # noqa: E731
    out, lse = ragged_decode(t(q), t(ks), t(vs), torch.tensor(ptr, dtype=torch.int64),
                             bias=torch.tensor(np.concatenate(bs), dtype=torch.float32))
    # float32: the bias itself is float32 (rel. 6e-8 on |b| <~ 5) and softmax/accumulation over <= 80
    # entries of O(1) values in float32: errors ~1e-6; 2e-5 leaves margin. float64 inputs: the bias
    # still passes through float32, so equality is to float32 rounding of b only when it is cast;
    # we compare against the formula evaluated with that same float32 bias below.
    if dtype == torch.float64:
        b32 = np.concatenate(bs).astype(np.float32).astype(np.float64)
        kk, vv = np.concatenate(ks), np.concatenate(vs)
        for b in range(B):
            for h in range(Hkv):
                s0, s1 = ptr[b * Hkv + h], ptr[b * Hkv + h + 1]
                for g in range(G):
                    z = kk[s0:s1] @ q[b, h * G + g] / np.sqrt(D) + b32[s0:s1]
                    w = np.exp(z - z.max())
                    expect[b, h * G + g] = w @ vv[s0:s1] / w.sum()
    np.testing.assert_allclose(out.double().numpy(), expect, rtol=0, atol=tol)


def test_corrected_error_shrinks_like_one_over_m():
    """MSE of the self-normalised IS estimate of one row's output is ~ C/m (paper 000, §5 / App. J)."""
    rng = np.random.default_rng(4)
    n, d = 120, 8
    logits = rng.normal(0, 1.5, n)
    V = rng.normal(size=(n, d))
    p = np.exp(logits - logits.max())
    p /= p.sum()
    dense = p @ V
    pi = 0.5 * p + 0.5 / n  # a proposal that covers every entry, not equal to p
    ms = np.array([32, 64, 128, 256, 512])
    reps = 1500
    mse = []
    for m in ms:
        errs = np.empty(reps)
        for r in range(reps):
            kept, counts = sample(pi, int(m), rng)
            o = corrected_output(logits, V, kept, correction_bias(counts, pi[kept], int(m)))
            errs[r] = np.sum((o - dense) ** 2)
        mse.append(errs.mean())
    slope = np.polyfit(np.log(ms), np.log(mse), 1)[0]
    # O(1/m): slope -1. With 1500 repetitions the MSE estimates carry ~5-8% noise and the O(1/m^2)
    # terms bend the curve slightly at m = 32, so the fitted slope lies within 0.15 of -1.
    assert abs(slope + 1.0) < 0.15, (slope, mse)
    # and the ratio of errors at m and 4m is about 4 (same noise argument: within [3, 5.3])
    assert 3.0 < mse[0] / mse[2] < 5.3 and 3.0 < mse[2] / mse[4] < 5.3, mse


# ------------------------------------------------------------------------------------- Algorithm 2
def _scan(pi, j, limit=20000):
    ms = np.arange(1, limit + 1)
    e = np.abs(expected_unique(pi, ms) - j)
    return int(ms[np.flatnonzero(e <= e.min() + 1e-12)[0]]), e


def test_sample_count_is_the_smallest_error_m():
    rng = np.random.default_rng(5)
    checked = 0
    for trial in range(120):
        n = int(rng.integers(2, 30))
        pi = 0.85 * rng.dirichlet(np.full(n, rng.choice([0.3, 1.0, 5.0]))) + 0.15 / n
        if trial % 4 == 0:  # some proposals with zero-probability entries
            zero = rng.choice(n, size=int(rng.integers(0, n // 2 + 1)), replace=False)
            pi[zero] = 0
            pi /= pi.sum()
        support = np.count_nonzero(pi)
        j = float(rng.uniform(0.5, support - 0.5)) if support > 1 else 0.5
        m = sample_count(pi, j)
        best, e = _scan(pi, j)
        assert abs(expected_unique(pi, m) - j) <= 0.5 + 1e-12
        assert m == best, (trial, m, best)
        checked += 1
    assert checked == 120


def test_sample_count_at_the_support_takes_the_first_m_within_half():
    pi = np.array([0.5, 0.3, 0.2])
    m = sample_count(pi, 3.0)
    e = expected_unique(pi, np.arange(1, m + 1))
    assert e[-1] >= 2.5 and np.all(e[:-1] < 2.5)


def test_expected_unique_is_stable_and_matches_monte_carlo():
    tiny = np.array([1e-18, 1 - 1e-18])
    # 1 - (1 - 1e-18)^m == m * 1e-18 to relative 1e-12 here; the naive power gives 0
    assert expected_unique(tiny, 10**6) == pytest.approx(1.0 + 1e-12, rel=1e-15, abs=1e-15)
    assert expected_unique(tiny, 10**6) - 1.0 == pytest.approx(1e-12, rel=1e-6)
    rng = np.random.default_rng(6)
    pi = rng.dirichlet(np.ones(20))
    sims = [sample(pi, 15, rng)[0].size for _ in range(4000)]
    # Monte Carlo mean over 4000 draws: standard error ~ 0.03; 5 standard errors
    assert np.mean(sims) == pytest.approx(expected_unique(pi, 15), abs=0.15)


def test_global_sample_count_meets_the_average_ratio():
    rng = np.random.default_rng(7)
    pis = [rng.dirichlet(np.full(40, a)) * 0.9 + 0.1 / 40 for a in (0.2, 1.0, 5.0)]
    for r in (0.2, 0.5, 0.8):
        m = global_sample_count(pis, r)
        f = lambda mm: 1 - np.mean([expected_unique(p, mm) / 40 for p in pis])  # noqa: E731
        scan = np.array([abs(f(mm) - r) for mm in range(1, 2000)])
        assert abs(f(m) - r) <= scan.min() + 1e-12
        # consecutive m change the mean kept count by <= 1 entry, i.e. the ratio by <= 1/40
        assert abs(f(m) - r) <= 0.5 / 40 + 1e-12


def test_sampling_counts_and_determinism():
    pi = np.random.default_rng(8).dirichlet(np.ones(50))
    a = sample(pi, 77, np.random.default_rng(123))
    b = sample(pi, 77, np.random.default_rng(123))
    c = sample(pi, 77, np.random.default_rng(124))
    assert a[1].sum() == 77 and np.all(a[1] >= 1)
    assert np.all(np.diff(a[0]) > 0)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not (a[0].size == c[0].size and np.array_equal(a[1], c[1]) and np.array_equal(a[0], c[0]))


# ------------------------------------------------------------------------------------- proposals
def test_proposals_from_scores():
    rng = np.random.default_rng(9)
    attn = np.tril(rng.random((10, 10)))
    attn /= attn.sum(1, keepdims=True)
    np.testing.assert_allclose(make_proposal("h2o", attn), attn.sum(0) / attn.sum(), atol=1e-15)
    col = attn[-4:].sum(0)
    pooled = np.array([col[max(0, i - 1) : i + 2].max() for i in range(10)])  # kernel 3, edges clamped
    np.testing.assert_allclose(snapkv_scores(attn, window=4, kernel=3), pooled, atol=1e-15)
    K = rng.normal(size=(10, 4))
    e = np.exp(-np.linalg.norm(K, axis=1))
    np.testing.assert_allclose(make_proposal("knorm", attn, K), e / e.sum(), atol=1e-15)
    # temperature flattens, mixing with uniform at 1 is uniform, T keeps the modes
    s = h2o_scores(attn)
    hot = proposal_from_scores(s, temperature=3.0)
    base = proposal_from_scores(s)
    ent = lambda p: -np.sum(p * np.log(p))  # noqa: E731
    assert ent(hot) > ent(base)
    assert np.argmax(hot) == np.argmax(base)
    np.testing.assert_allclose(proposal_from_scores(s, mix=1.0), np.full(10, 0.1), atol=1e-15)
    # GQA: the shared proposal is the mean of the heads' proposals
    pis = rng.dirichlet(np.ones(10), size=3)
    np.testing.assert_allclose(gqa_mixture(pis), pis.mean(0), atol=1e-15)
    # StreamingLLM: sinks and recent entries are the modes; top-k = sinks + recent
    st = streaming_proposal(20, sinks=4, recent=6, floor=0.01)
    np.testing.assert_array_equal(topk_set(st, 10), np.r_[0:4, 14:20])


def test_zero_floor_streaming_never_keeps_the_middle_and_refuses_unreachable_targets():
    st = streaming_proposal(20, sinks=4, recent=6, floor=0.0)
    kept, _ = sample(st, 500, np.random.default_rng(0))
    assert set(kept) <= set(range(4)) | set(range(14, 20))
    with pytest.raises(InputError, match="only 10 of 20 entries"):
        sample_count(st, 12)


def test_bad_inputs_raise_clear_errors():
    pi = np.array([0.5, 0.5, 0.0])
    with pytest.raises(InputError, match="does not cover entry 2"):
        validate_proposal(pi, must_keep=[0, 2])
    for bad in (0, -1, 3.5, np.nan):
        with pytest.raises(InputError, match="outside"):
            sample_count(np.full(3, 1 / 3), bad)
    with pytest.raises(InputError, match="non-finite"):
        proposal_from_scores(np.array([1.0, np.nan]))
    with pytest.raises(InputError, match="non-finite"):
        make_proposal("knorm", np.eye(2), np.array([[1.0, np.inf], [0.0, 1.0]]))
    with pytest.raises(InputError, match="negative"):
        proposal_from_scores(np.array([1.0, -0.1]))
    peaked = proposal_from_scores(np.array([0.0, -60.0, -60.0, -60.0]), kind="softmax")
    with pytest.raises(InputError, match="too peaked"):
        sample_count(peaked, 3.0, max_samples=10**6)
    with pytest.raises(InputError, match="does not cover"):
        correction_bias(np.array([1, 2]), np.array([0.5, 0.0]), 3)
    with pytest.raises(InputError, match="sum to"):
        validate_proposal(np.array([0.2, 0.2]))
    with pytest.raises(InputError, match="cannot be reached"):
        global_sample_count([np.array([1.0, 0, 0, 0])], 0.5)


# ------------------------------------------------------------------------------------- the study
def _tiny_dump(out, texts=2, length=18, layers=2, heads=4, kv_heads=2, hd=8, drop=None):
    """An all-positions dump with keys of a tiny random Llama, built directly (eager attention)."""
    from forcedweight.models import tiny_llama

    model = tiny_llama(0, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=hd)
    model.config._attn_implementation = "eager"
    G, rows = heads // kv_heads, []
    gen = torch.Generator().manual_seed(0)
    for t in range(texts):
        ids = torch.randint(3, 300, (1, length), generator=gen)
        with torch.no_grad():
            o = model(ids, output_attentions=True, use_cache=True)
        cache = getattr(o, "past_key_values", None)
        for layer in range(layers):
            A = o.attentions[layer][0].double().numpy()
            K = cache.layers[layer].keys[0].double().numpy()
            V = cache.layers[layer].values[0].double().numpy()
            for h in range(heads):
                for pos in range(1, length):  # like dump: positions >= 1
                    if drop == (t, layer, h, pos):
                        continue
                    rows.append(dict(row_id=len(rows), weights=A[h, pos, : pos + 1],
                                     values=V[h // G, : pos + 1].ravel(), value_dim=hd, text_id=t, layer=layer,
                                     head=h, kv_head=h // G, query_pos=pos, n_keys=pos + 1,
                                     keys=K[h // G, : pos + 1].ravel()))
    out.mkdir(parents=True, exist_ok=True)
    write_table_atomic(make_row_table(rows, row_schema(pa.float64(), with_keys=True)), out / "rows-0.parquet")
    return out


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory):
    """``dump_rows --all-positions --with-keys`` of a tiny random GQA Llama (4 query heads, 2 KV heads)."""
    from forcedweight.dump import dump_rows
    from forcedweight.models import save_tiny_model

    base = tmp_path_factory.mktemp("probdump")
    model = save_tiny_model(base / "model", layers=2, heads=4, kv_heads=2, head_dim=8)
    texts = ["a tiny text for the study", "another one, somewhat longer text"]
    return dump_rows(str(model), texts, base / "rows", all_positions=True, with_keys=True, progress=False)


def test_study_end_to_end_tables_figures_and_an_independent_recheck(tiny_rows, tmp_path):
    import polars as pl

    cfg = StudyConfig(compression_ratios=(0.3, 0.7), taus=(1.0, 3.0), seeds=3, proposals=("h2o", "knorm", "streaming"))
    out = run_study(tiny_rows, tmp_path / "study", cfg, command="test", progress=False)
    for stem in ("records", "summary", "compression", "compression_draws"):
        assert (out / f"{stem}.parquet").stat().st_size > 0 and (out / f"{stem}.csv").stat().st_size > 0
    for fig in ("error_vs_ratio", "error_vs_tau", "bias_variance_vs_tau", "effective_compression"):
        assert (out / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / f"{fig}.pdf").read_bytes()[:4] == b"%PDF"
    report = (out / "report.md").read_text()
    assert "Command: `test`" in report and "corrected_beats_topk" in report
    rec = pl.read_parquet(out / "records.parquet")
    # 2 texts x 2 layers x 4 heads x 3 proposals x 2 ratios x (topk + sampled + 2 taus)
    assert rec.height == 2 * 2 * 4 * 3 * 2 * 4
    # independent recheck of one top-k record: text 1, layer 0, head 3, h2o, r = 0.7
    trajs = {(t.text_id, t.layer, t.kv_head): t for t in load_trajectories(tiny_rows)}
    tr = trajs[(1, 0, 1)]
    L = tr.length
    t = int(0.5 * L)
    n = t + 1
    score = sum(tr.attn[g, : t + 1, :n].sum(0) / tr.attn[g, : t + 1, :n].sum() for g in range(2)) / 2
    k = int(round(0.3 * n))
    kept = sorted(np.argsort(-score, kind="stable")[:k])
    errs = []
    for tp in range(t + 1, L):
        p = tr.attn[1, tp, : tp + 1]
        idx = list(kept) + list(range(n, tp + 1))
        q = p[idx] / p[idx].sum()
        errs.append(np.linalg.norm(q @ tr.values[idx] - p @ tr.values[: tp + 1]))
    row = rec.filter((pl.col("text_id") == 1) & (pl.col("layer") == 0) & (pl.col("head") == 3)
                     & (pl.col("proposal") == "h2o") & (pl.col("ratio") == 0.7) & (pl.col("method") == "topk"))
    assert row.height == 1
    assert row["error"][0] == pytest.approx(np.mean(errs), rel=1e-9)  # float64 both ways
    # bias-variance split: mse = bias2 + variance exactly, top-k has zero variance
    ok = rec.filter(pl.col("status") == "ok")
    np.testing.assert_allclose(ok["mse"], ok["bias2"] + ok["variance"], rtol=1e-9, atol=1e-15)
    assert ok.filter(pl.col("method") == "topk")["variance"].max() == 0
    # Table 1. The global m puts the expected mean kept count within 1/2 entry of the target (one more
    # draw adds at most one expected entry per group): |expected - target| <= 0.5 / n.
    comp = pl.read_parquet(out / "compression.parquet")
    draws = pl.read_parquet(out / "compression_draws.parquet").filter(pl.col("status") == "ok")
    assert ((draws["expected_ratio"] - draws["target_ratio"]).abs() <= 0.5 / draws["n_pre"] + 1e-12).all()
    # The drawn ratio scatters around it: per group the unique count has std <= sqrt(n/4) entries
    # (<= 0.14 of n = 13); the mean over 4 groups x 3 seeds has std <= 0.04, so 0.15 is > 3 std + 0.04.
    assert (comp["effective_mean"] - comp["target_ratio"]).abs().max() < 0.15


def test_a_study_of_one_seed_writes_its_figures(tiny_rows, tmp_path):
    # one seed: bias² and variance are NaN, and the log-scaled bias-variance panel raised
    # "Data cannot be log-scaled because all values are <= 0" after the dump and the tables
    import polars as pl

    cfg = StudyConfig(compression_ratios=(0.5,), taus=(1.0,), seeds=1, proposals=("h2o",))
    out = run_study(tiny_rows, tmp_path / "one", cfg, command="test", progress=False)
    assert (out / "bias_variance_vs_tau.png").read_bytes()[:4] == b"\x89PNG"
    assert pl.read_parquet(out / "summary.parquet").filter(pl.col("method") == "corrected")["variance"].is_nan().all()


def test_study_is_deterministic_given_the_seed(tiny_rows):
    from forcedweight.probabilistic.study import study_trajectory

    tr = load_trajectories(tiny_rows)[0]
    cfg = StudyConfig(compression_ratios=(0.5,), taus=(1.0,), seeds=2, proposals=("h2o",))
    a, b = study_trajectory(tr, cfg), study_trajectory(tr, cfg)
    assert a == b
    cfg = dataclasses.replace(cfg, seed=1)
    assert [r["error"] for r in study_trajectory(tr, cfg)] != [r["error"] for r in a]
    # a setting's draws do not depend on the other ratios and proposals of the study (they were seeded by
    # their positions in the lists), and heads studied one by one draw apart (they shared one stream)
    cfg0 = dataclasses.replace(cfg, seed=0)
    wide = dataclasses.replace(cfg0, compression_ratios=(0.3, 0.5), proposals=("uniform", "h2o"))

    def sampled(recs):
        return [(r["head"], r["kept"], r["error"]) for r in recs
                if r["method"] == "sampled" and r["proposal"] == "h2o" and r["ratio"] == 0.5]

    assert sampled(study_trajectory(tr, wide)) == sampled(a) and sampled(a)
    from forcedweight.probabilistic.study import draw_rng, split_heads

    one, two = split_heads(tr)[:2]  # (share_gqa=False studies these: the first head is in the seed)
    assert len({draw_rng(cfg0, 0, (t.text_id, t.layer, t.kv_head, t.heads[0], 5), 0.5, "h2o").random()
                for t in (one, two)}) == 2


def test_study_rejects_a_dump_without_all_positions(tmp_path):
    rows = _tiny_dump(tmp_path / "d", texts=1, layers=1, length=8, drop=(0, 0, 1, 5))
    with pytest.raises(InputError, match="all-positions"):
        load_trajectories(rows)


def _cli(monkeypatch, args):
    """Run ``forcedweight ARGS`` in-process through the console entry point; return its exit code."""
    import sys

    from forcedweight.cli import main

    monkeypatch.setattr(sys, "argv", ["forcedweight", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code or 0


def test_cli_study_and_bad_option(tiny_rows, tmp_path, monkeypatch, capsys):
    args = ["probabilistic", "study", str(tiny_rows), "--out", str(tmp_path / "o"), "--ratios", "0.5",
            "--taus", "1", "--seeds", "2", "--proposal", "uniform", "--no-progress"]
    assert _cli(monkeypatch, args) == 0
    assert (tmp_path / "o" / "report.md").exists()
    assert "--proposal uniform" in (tmp_path / "o" / "report.md").read_text()  # the command is recorded
    capsys.readouterr()
    bad = ["probabilistic", "study", str(tiny_rows), "--out", str(tmp_path / "o2"), "--ratios", "0.5,1.5"]
    assert _cli(monkeypatch, bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --ratios")
    assert not (tmp_path / "o2").exists()  # nothing written on bad input
    assert _cli(monkeypatch, ["probabilistic", "study", str(tmp_path / "missing"), "--out", str(tmp_path / "o3")]) == 2
    assert "missing" in capsys.readouterr().err


@pytest.mark.parametrize("option, value", [("--temperature", "0"), ("--temperature", "-1"), ("--mix", "2"), ("--mix", "-0.5")])
def test_cli_bad_temperature_or_mix_named_before_reading_rows(tmp_path, monkeypatch, capsys, option, value):
    # the rows do not exist: the option must be refused first, by name, in one line
    args = ["probabilistic", "study", str(tmp_path / "missing"), "--out", str(tmp_path / "o"), option, value]
    assert _cli(monkeypatch, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {option}"), err
    assert not (tmp_path / "o").exists()


def test_bias2_is_unbiased_over_seeds():
    """Synthetic outputs dense + b + noise (σ per coordinate, d coordinates): E[bias2] = ‖b‖² and
    E[variance] = dσ², while the plain ‖mean − dense‖² is ‖b‖² + dσ²/S (what bias2 used to be)."""
    from forcedweight.probabilistic.study import _stats

    rng = np.random.default_rng(7)
    S, Q, d, sigma = 4, 20_000, 3, 0.5
    dense = rng.normal(size=(Q, d))
    b = np.array([0.3, -0.1, 0.2])  # known bias, ‖b‖² = 0.14
    outs = dense + b + sigma * rng.normal(size=(S, Q, d))
    st_ = _stats(outs, dense)
    # averages over Q = 20,000 rows: standard errors ≈ 0.004 (bias2) and 0.004 (variance); 0.02 is 5σ
    assert st_["bias2"] == pytest.approx(float(b @ b), abs=0.02)
    assert st_["variance"] == pytest.approx(d * sigma**2, abs=0.02)
    plug = np.mean(np.sum((outs.mean(axis=0) - dense) ** 2, axis=-1))
    assert plug == pytest.approx(float(b @ b) + d * sigma**2 / S, abs=0.02)  # the old definition, biased
    assert abs(plug - st_["bias2"]) > 0.15  # d σ² / S = 0.1875 apart: the test tells them apart
    mse = np.mean(np.sum((outs - dense) ** 2, axis=-1))
    assert st_["mse"] == pytest.approx(mse, rel=1e-12)
    assert st_["bias2"] + st_["variance"] == pytest.approx(st_["mse"], rel=1e-12)
    # a deterministic output has variance 0 and its squared error as bias; one random seed: NaN
    one = _stats(outs[:1], dense, deterministic=True)
    assert one["variance"] == 0 and one["bias2"] == pytest.approx(one["mse"], rel=1e-12)
    assert np.isnan(_stats(outs[:1], dense)["bias2"])


@pytest.mark.parametrize("extra", [["--taus", "inf"], ["--taus", "1,1,inf"], ["--ratios", "0.5,0.5"],
                                   ["--proposal", "uniform", "--proposal", "uniform"]])
def test_cli_study_repeated_or_infinite_options(tiny_rows, tmp_path, monkeypatch, capsys, extra):
    import polars as pl

    base = ["probabilistic", "study", str(tiny_rows), "--out", str(tmp_path / "o"), "--seeds", "2", "--no-progress"]
    opts = {"--ratios": "0.5", "--taus": "1", "--proposal": "uniform"}
    for k, v in opts.items():
        if k not in extra:
            base += [k, v]
    assert _cli(monkeypatch, base + extra) == 0, capsys.readouterr().err
    rec = pl.read_parquet(tmp_path / "o" / "records.parquet")
    # one record per (text, layer, head, proposal, ratio, method, tau): a repeated option repeats nothing
    keys = ["text_id", "layer", "head", "evict_pos", "proposal", "ratio", "method", "tau"]
    assert rec.height == rec.unique(subset=keys).height
    taus = set(rec.filter(pl.col("method") == "corrected")["tau"].to_list())
    assert taus == (set() if extra == ["--taus", "inf"] else {1.0})
    assert set(rec["method"]) == ({"topk", "sampled"} if extra == ["--taus", "inf"] else {"topk", "sampled", "corrected"})
    assert (tmp_path / "o" / "report.md").exists()


def test_study_rerun_replaces_the_whole_output_and_a_failed_run_changes_nothing(tiny_rows, tmp_path, monkeypatch):
    from forcedweight.probabilistic import study_outputs as so

    out = tmp_path / "study"
    cfg = StudyConfig(compression_ratios=(0.5,), taus=(1.0,), seeds=2, proposals=("h2o",))
    run_study(tiny_rows, out, cfg, command="first", progress=False)
    (out / "user-notes.txt").write_text("mine")  # not the study's: kept
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    # a run that fails after writing its tables (the figures raise) leaves every file as it was
    def boom(*a, **k):
        raise RuntimeError("figures failed")

    monkeypatch.setattr(so, "figures", boom)
    with pytest.raises(RuntimeError):
        run_study(tiny_rows, out, dataclasses.replace(cfg, seeds=3), command="second", progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".staging-")]
    monkeypatch.undo()
    # a rerun whose outputs differ: the old report is replaced, a stale table of the old run removed
    (out / "compression.csv").write_text("stale")
    monkeypatch.setattr(so, "compression_summary", lambda comp: comp.head(0))  # no compression table now
    run_study(tiny_rows, out, cfg, command="third", progress=False)
    assert "Command: `third`" in (out / "report.md").read_text()
    assert not (out / "compression.csv").exists() and not (out / "compression.parquet").exists()
    assert (out / "user-notes.txt").read_text() == "mine"


def test_disk_full_inside_a_staged_write_is_one_line(tiny_rows, tmp_path, monkeypatch):
    import errno

    import forcedweight.probabilistic.study_outputs as so

    def full(df, out, stem):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / f"{stem}.parquet"))

    monkeypatch.setattr(so, "write_frame", full)
    cfg = StudyConfig(compression_ratios=(0.5,), taus=(1.0,), seeds=2, proposals=("h2o",))
    with pytest.raises(InputError, match="no space left on device"):
        run_study(tiny_rows, tmp_path / "o", cfg, progress=False)
    assert [p.name for p in (tmp_path / "o").iterdir()] == []
