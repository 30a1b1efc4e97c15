"""Sampled eviction inside generation (issue 14): the bias the cache holds after eviction (the formula on
every kept entry, 0 on entries written later), decode through the cache against the two-interval
estimator written independently (float64), effective compression against Algorithm 2's target in
expectation, seeds, the harness rows, and the robustness study's win scores against a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from forcedweight.deploy.attention import use_ragged_attention
from forcedweight.deploy.evaluate import evaluate
from forcedweight.deploy.evaluate_protocol import prompt_ids
from forcedweight.deploy.policies import POLICIES, make_policy
from forcedweight.deploy.policies.sampled import SAMPLED_PROPOSALS
from forcedweight.deploy.prefill import prefill_context
from forcedweight.deploy.robustness import method_label, win_scores
from forcedweight.deploy.tasks import continuation, make_tasks, read_tasks, write_tasks
from forcedweight.errors import InputError
from forcedweight.models import LoadedModel, byte_tokenizer, tiny_llama
from forcedweight.probabilistic import expected_unique, global_sample_count, two_interval_output

N_CTX = 96
WINDOW = 1024


@pytest.fixture(scope="module")
def model():
    return use_ragged_attention(tiny_llama(1, layers=2, heads=4, kv_heads=2, max_positions=WINDOW))


@pytest.fixture(scope="module")
def prefill(model):
    ids = torch.randint(3, 300, (1, N_CTX), generator=torch.Generator().manual_seed(5))
    return prefill_context(model, None, ids)


def _draws(pi, m, seed, r, layer, h):
    """The documented stream of draw (layer, h), re-drawn here: multinomial counts over the N entries."""
    return np.random.default_rng([seed, int(round(1e6 * r)), layer, h]).multinomial(m, pi)


def test_registry_has_every_proposal():
    for p in SAMPLED_PROPOSALS:
        assert POLICIES[f"sampled-{p}"].selects and POLICIES[f"sampled-{p}"].proposal == p
        assert not getattr(POLICIES[f"topk-{p}"], "selects", False)
    with pytest.raises(InputError, match="tau"):
        make_policy("sampled-h2o", tau=0)
    with pytest.raises(InputError, match="scope"):
        make_policy("sampled-h2o", scope="head")


def test_a_ratio_the_sinks_and_recent_window_swallow_is_refused_before_any_work(prefill, tmp_path):
    pol = make_policy("sampled-uniform", sinks=2, recent=2)
    assert pol.check_ratio(8, 0.0) is None and pol.check_ratio(4, 0.5) is None  # r = 0, or every entry forced
    assert pol.check_ratio(8, 0.25) == 2.0 and pol.check_ratio(8, 0.4) == pytest.approx(0.8)  # 6 / 4.8 kept
    for r in (0.5, 0.45):  # 4.0 and 4.4 kept: under half an entry beyond the forced 4
        with pytest.raises(InputError, match="sinks \\+ recent window \\(4\\)"):
            pol.check_ratio(8, r)
    with pytest.raises(InputError, match="compression ratio 0.5 keeps"):  # select raises the same
        make_policy("sampled-uniform", sinks=N_CTX // 2, recent=0).select(prefill, 0.5)
    for bad in ({"floor": -1.0}, {"floor": math.nan}, {"min_mass": 1.5}):  # at construction, not mid-run
        with pytest.raises(InputError, match=next(iter(bad))):
            make_policy("sampled-minh", **bad)
    # evaluate checks every example before it creates anything (the top-k policy's budget check passes)
    tok = byte_tokenizer(WINDOW)
    tasks = write_tasks([continuation(8, tok, 0, 0, continuation_tokens=4)], tmp_path / "tasks.jsonl")
    lm = LoadedModel(tiny_llama(0, layers=1, heads=2, kv_heads=1, max_positions=WINDOW), tok, "tiny", "python")
    n = prompt_ids(tok, read_tasks(tasks)[0], False).n_context
    r = 1 - 4.3 / n  # keeps 4.3 entries: int(4.3) = 4 = sinks + recent, 0.3 drawn beyond them
    opts = {"sampled-uniform": dict(sinks=2, recent=2)}
    with pytest.raises(InputError, match="example .*sampled-uniform.*keeps 4.3 of"):
        evaluate(lm, tasks, tmp_path / "out", ["sampled-uniform"], compression_ratios=[r], policy_options=opts,
                 progress=False, report=False, quiet=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["sampled-h2o", "sampled-snapkv", "sampled-knorm", "sampled-streaming",
                                  "sampled-minh", "sampled-uniform"])
def test_bias_in_cache_is_the_formula_and_zero_after(model, prefill, name):
    tau, r, seed = 2.0, 0.6, 7
    pol = make_policy(name, tau=tau, temperature=1.5 if name == "sampled-h2o" else 1.0,
                      mix=0.1 if name == "sampled-snapkv" else 0.0)
    keep, bias, info = pol.select(prefill, r, seed)
    cache = prefill.ragged_cache()
    for layer in range(prefill.n_layers):
        cache.evict(layer, keep[layer], bias[layer])
    new = torch.randint(3, 300, (1, 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # entries written after eviction: a 2-token feed, then one decode step
        model(new[:, :2], cache=cache, position_ids=torch.arange(N_CTX, N_CTX + 2)[None], use_cache=True)
        model(new[:, 2:], cache=cache, position_ids=torch.tensor([[N_CTX + 2]]), use_cache=True)
    for layer in range(prefill.n_layers):
        m = info["m"][layer]
        keys = prefill.keys(layer)
        for h in range(prefill.n_kv_heads):
            pi = info["pi"][layer][h]
            c = _draws(pi, m, seed, r, layer, h)
            kept = np.flatnonzero(c)
            np.testing.assert_array_equal(keep[layer][h], kept)
            want = (np.log(c[kept]) - math.log(m) - np.log(pi[kept])) / tau  # b_i = log(c_i / (m pi_i)) / tau
            got = cache.layers[layer].segment_bias(0, h).double().numpy()
            assert got.shape == (kept.size + 3,)
            np.testing.assert_allclose(got[:kept.size], want, rtol=1e-6, atol=1e-6)  # float32 storage
            assert (got[kept.size:] == 0).all()  # appended entries: bias exactly 0
            k_seg, _ = cache.layers[layer].segment(0, h)
            torch.testing.assert_close(k_seg[:kept.size], keys[h, kept].to(k_seg.dtype), rtol=0, atol=0)


def test_uncorrected_stores_no_bias_same_kept_set(prefill):
    a = make_policy("sampled-h2o", tau="inf").select(prefill, 0.5, 3)
    b = make_policy("sampled-h2o", tau=1).select(prefill, 0.5, 3)
    assert a[1] is None and b[1] is not None
    for x, y in zip(a[0], b[0]):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def test_decode_equals_two_interval_estimator(model, prefill):
    """One decode step after eviction + a 2-token feed: layer 0's attention output through the ragged
    cache equals the estimator of probabilistic.correction.two_interval_output written from the
    prefill's keys/values and the new tokens' projections in float64 (rtol 1e-4, atol 1e-5: float32 path)."""
    tau, r, seed = 1.0, 0.5, 11
    keep, bias, info = make_policy("sampled-h2o", tau=tau).select(prefill, r, seed)
    cache = prefill.ragged_cache()
    for layer in range(prefill.n_layers):
        cache.evict(layer, keep[layer], bias[layer])
    attn = model.model.layers[0].self_attn
    seen = []

    def hook(mod, args, kwargs, out):
        seen.append((kwargs["hidden_states"].detach().double(), [t.double() for t in kwargs["position_embeddings"]],
                     out[0].detach().double()))

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    new = torch.randint(3, 300, (1, 3), generator=torch.Generator().manual_seed(2))
    try:
        with torch.no_grad():
            model(new[:, :2], cache=cache, position_ids=torch.arange(N_CTX, N_CTX + 2)[None], use_cache=True)
            model(new[:, 2:], cache=cache, position_ids=torch.tensor([[N_CTX + 2]]), use_cache=True)
    finally:
        handle.remove()
    hq, hkv, d = prefill.n_heads, prefill.n_kv_heads, prefill.head_dim
    W = {k: getattr(attn, k).weight.detach().double() for k in ("q_proj", "k_proj", "v_proj", "o_proj")}
    hs = torch.cat([seen[0][0], seen[1][0]], dim=1)[0]  # (3, D) the three new tokens' layer-0 inputs
    cos = torch.cat([seen[0][1][0], seen[1][1][0]], dim=1)[0]
    sin = torch.cat([seen[0][1][1], seen[1][1][1]], dim=1)[0]
    q = _rope((hs[2:] @ W["q_proj"].T).view(1, hq, d).transpose(0, 1), cos[2:], sin[2:])[:, 0]  # (hq, d)
    k_new = _rope((hs @ W["k_proj"].T).view(3, hkv, d).transpose(0, 1), cos, sin)  # (hkv, 3, d)
    v_new = (hs @ W["v_proj"].T).view(3, hkv, d).transpose(0, 1)
    K, V = prefill.keys(0).double(), prefill.values(0).double()
    m = info["m"][0]
    heads = []
    for h in range(hq):
        j = h // prefill.group_size
        pi = info["pi"][0][j]
        c = _draws(pi, m, seed, r, 0, j)
        kept = np.flatnonzero(c)
        s = (K[j] @ q[h]).numpy() * prefill.scaling
        t = (k_new[j] @ q[h]).numpy() * prefill.scaling
        heads.append(two_interval_output(s, V[j].numpy(), kept, c[kept], pi[kept], m, t, v_new[j].numpy(), tau))
    want = torch.from_numpy(np.concatenate(heads)) @ W["o_proj"].T
    torch.testing.assert_close(seen[1][2][0, 0], want, rtol=1e-4, atol=1e-5)
    # and the uncorrected estimator differs (the correction is on the path, not a no-op)
    s_plain = two_interval_output(s, V[j].numpy(), kept, c[kept], pi[kept], m, t, v_new[j].numpy(), math.inf)
    assert np.abs(s_plain - heads[-1]).max() > 1e-4


def test_effective_compression_meets_algorithm2_in_expectation(prefill):
    """Mean kept entries per KV head, over S = 300 seeds, against Algorithm 2's target j* = (1 - r) N:
    |mean - j*| <= 0.5 + 4 standard errors (the 1/2 is Algorithm 2's guarantee for the expected count,
    the 4 SE the sampling noise of the mean; a false failure has probability < 1e-4)."""
    r, S = 0.7, 300
    pol = make_policy("sampled-h2o", tau=1)
    target = (1 - r) * N_CTX
    for scope in ("layer", "model"):
        pol.scope = scope
        per_seed = np.array([[np.mean([k.size for k in layer]) for layer in pol.select(prefill, r, s)[0]]
                             for s in range(S)])  # (S, L)
        pis = pol.proposals(prefill, r)
        for layer in range(prefill.n_layers):
            m = pol.select(prefill, r, 0)[2]["m"][layer]
            exp = np.mean([expected_unique(p, m) for p in pis[layer]])
            if scope == "layer":
                assert abs(exp - target) <= 0.5
            se = per_seed[:, layer].std(ddof=1) / math.sqrt(S)
            assert abs(per_seed[:, layer].mean() - exp) <= 4 * se + 1e-9
        whole = per_seed.mean(axis=1)  # mean over all heads of the model
        assert abs(whole.mean() - target) <= 0.5 + 4 * whole.std(ddof=1) / math.sqrt(S)
    m_model = global_sample_count([p for layer in pis for p in layer], r)
    assert pol.select(prefill, r, 0)[2]["m"] == [m_model] * prefill.n_layers


def test_seed_reproduces_kept_set(prefill):
    a = make_policy("sampled-snapkv").select(prefill, 0.5, 4)[0]
    b = make_policy("sampled-snapkv").select(prefill, 0.5, 4)[0]
    c = make_policy("sampled-snapkv").select(prefill, 0.5, 5)[0]
    assert all(np.array_equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))
    assert not all(np.array_equal(x, y) for la, lc in zip(a, c) for x, y in zip(la, lc))


def test_sinks_recent_kept_exactly(prefill):
    keep, bias, info = make_policy("sampled-h2o", sinks=2, recent=3).select(prefill, 0.6, 0)
    for layer in range(prefill.n_layers):
        for k, b in zip(keep[layer], bias[layer]):
            assert {0, 1, N_CTX - 3, N_CTX - 2, N_CTX - 1} <= set(k.tolist())
            pos = np.searchsorted(k, [0, 1, N_CTX - 3, N_CTX - 2, N_CTX - 1])
            assert (b[pos] == 0).all()


def test_topk_version_keeps_top_of_pi(prefill):
    pol = make_policy("topk-h2o")
    pis = make_policy("sampled-h2o").proposals(prefill)
    for a, b in zip(pol.score(prefill), pis):
        np.testing.assert_array_equal(a, b)


def test_evaluate_rows_record_sampled_and_effective_compression(tmp_path):
    tok = byte_tokenizer(WINDOW)
    ex = make_tasks(tok, ["niah_single_1"], 600, 2, seed=0, max_new_tokens=4)
    ex.append(continuation(500, tok, 0, 0, continuation_tokens=20))
    tasks = write_tasks(ex, tmp_path / "tasks.jsonl")
    lm = LoadedModel(tiny_llama(0, max_positions=WINDOW), tok, "tiny", "python")
    rows = {}
    for tau in (1.0, math.inf):
        out = evaluate(lm, tasks, tmp_path / f"run-{tau}", ["none", "sampled-h2o", "topk-h2o"],
                       compression_ratios=[0.5], seed=3, policy_options={"sampled-h2o": {"tau": tau}},
                       progress=False, report=False, quiet=True)
        rows[tau] = pq.read_table(out).to_pylist()
    for r in rows[1.0]:
        assert r["effective_compression"] == pytest.approx(1 - r["kept_entries"] / (r["context_tokens"] * 2 * 2))
        if r["policy"] == "sampled-h2o":
            assert r["allocator"] == "sampled" and 0.3 < r["effective_compression"] < 0.7
        elif r["policy"] == "topk-h2o":
            assert r["allocator"] == "uniform" and r["effective_compression"] == pytest.approx(
                1 - int(r["context_tokens"] * 0.5) / r["context_tokens"])
    s1 = [r for r in rows[1.0] if r["policy"] == "sampled-h2o"]
    si = [r for r in rows[math.inf] if r["policy"] == "sampled-h2o"]
    assert [r["kept_entries"] for r in s1] == [r["kept_entries"] for r in si]  # same seed, same draws
    assert all(a["physical_bytes"] > b["physical_bytes"] for a, b in zip(s1, si))  # the bias is stored
    assert any(a["score"] != b["score"] for a, b in zip(s1, si) if a["task"] == "continuation")


def test_win_scores_by_hand():
    """Three methods, two tasks (one lower-is-better): ranks by hand, ties share the mean rank,
    normalised rank = (M - rank) / (M - 1), win score = mean over tasks."""
    import pandas as pd

    summary = pd.DataFrame([
        {"task": "a", "compression_ratio": 0.5, "method": "x", "score": 0.9, "higher_is_better": True},
        {"task": "a", "compression_ratio": 0.5, "method": "y", "score": 0.5, "higher_is_better": True},
        {"task": "a", "compression_ratio": 0.5, "method": "z", "score": 0.5, "higher_is_better": True},
        {"task": "b", "compression_ratio": 0.5, "method": "x", "score": 3.0, "higher_is_better": False},
        {"task": "b", "compression_ratio": 0.5, "method": "y", "score": 1.0, "higher_is_better": False},
        {"task": "b", "compression_ratio": 0.5, "method": "z", "score": 2.0, "higher_is_better": False},
    ])
    ranks, wins = win_scores(summary)
    # task a: x rank 1, y and z tie at 2.5; task b: y 1, z 2, x 3
    want = {"x": ((3 - 1) / 2 + (3 - 3) / 2) / 2, "y": ((3 - 2.5) / 2 + (3 - 1) / 2) / 2,
            "z": ((3 - 2.5) / 2 + (3 - 2) / 2) / 2}
    got = wins.set_index("method")["win_score"].to_dict()
    assert got == pytest.approx(want)
    assert ranks.set_index(["task", "method"]).loc[("a", "y"), "rank"] == 2.5
    assert method_label("sampled-h2o", math.inf) == "sampled-h2o τ=inf" and method_label("topk-h2o", None) == "topk-h2o"


def test_robustness_study_end_to_end_and_resume(tmp_path):
    """The study on a tiny model: every run's rows gathered, Table 1 from the cache's kept entries,
    win scores in [0, 1] over exactly the main methods, and a rerun reuses the finished runs."""
    from forcedweight.deploy.robustness import RobustnessConfig, run_robustness

    tok = byte_tokenizer(WINDOW)
    ex = make_tasks(tok, ["niah_single_1"], 600, 1, seed=0, max_new_tokens=4)
    ex.append(continuation(500, tok, 0, 0, continuation_tokens=20))
    tasks = write_tasks(ex, tmp_path / "tasks.jsonl")
    lm = LoadedModel(tiny_llama(0, max_positions=WINDOW), tok, "tiny", "python")
    cfg = RobustnessConfig(proposals=("h2o", "minh"), ratios=(0.25, 0.75), taus=(1.0, 2.0), seeds=(0, 1))
    report = run_robustness(lm, tasks, tmp_path / "study", cfg, command="test", progress=False, quiet=True)
    out = report.parent
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == sorted(["topk"] + [f"tau-{t}-seed-{s}" for t in ("1", "2", "inf") for s in (0, 1)])
    res = pq.read_table(out / "results.parquet").to_pandas()
    assert len(res) == 2 * (1 + 2 * 2) + 6 * 2 * 2 * 2  # topk run (none + 2 x 2 ratios) + 6 sampled runs
    t1 = pq.read_table(out / "table1.parquet").to_pandas()
    samp = res[(res["policy"] == "sampled-h2o") & (res["compression_ratio"] == 0.75) & (res["tau"] == np.inf)]
    eff = 1 - samp["kept_entries"] / (samp["context_tokens"] * 2 * 2)
    row = t1[(t1["policy"] == "sampled-h2o") & (t1["target"] == 0.75)].iloc[0]
    assert row["effective_mean"] == pytest.approx(eff.mean()) and row["n"] == 4
    wins = pq.read_table(out / "win_scores.parquet").to_pandas()
    overall = wins[wins["compression_ratio"].isna()]
    assert set(overall["method"]) == {"topk-h2o", "topk-minh", "sampled-h2o τ=1", "sampled-h2o τ=inf",
                                      "sampled-minh τ=1", "sampled-minh τ=inf"}
    assert ((overall["win_score"] >= 0) & (overall["win_score"] <= 1)).all()
    assert overall["win_score"].mean() == pytest.approx(0.5)  # normalised ranks of M methods average 1/2
    stamp = (out / "runs" / "topk" / "results.parquet").stat().st_mtime_ns
    run_robustness(lm, tasks, tmp_path / "study", cfg, command="test", progress=False, quiet=True)
    assert (out / "runs" / "topk" / "results.parquet").stat().st_mtime_ns == stamp
    assert RobustnessConfig(seeds=(0, 0, 1), ratios=(0.5, 0.5)).seeds == (0, 1)  # a repeated value: one setting
    with pytest.raises(InputError, match="--taus: give at least one"):
        RobustnessConfig(taus=(), uncorrected=False)
    # other settings or examples: the runs are resumed / redone, never read for rows they do not hold
    # (a finished run used to be reused whatever the task file, --max-examples or --scope)
    other = RobustnessConfig(proposals=("h2o",), ratios=(0.25, 0.5), taus=(1.0,), seeds=(0,), max_examples=1)
    run_robustness(lm, tasks, tmp_path / "study", other, progress=False, quiet=True)
    res = pq.read_table(out / "results.parquet").to_pandas()
    assert set(res.loc[res["policy"] != "none", "compression_ratio"]) == {0.25, 0.5}
    assert set(res["id"]) == {ex[0]["id"]}


def test_cli_evaluate_tau_and_bad_inputs(tmp_path):
    from typer.testing import CliRunner

    from forcedweight.cli import app
    from forcedweight.models import save_tiny_model

    tok = byte_tokenizer(WINDOW)
    tasks = write_tasks([continuation(500, tok, 0, 0, continuation_tokens=20)], tmp_path / "tasks.jsonl")
    mdir = save_tiny_model(tmp_path / "tiny", max_positions=WINDOW)
    runner = CliRunner()
    base = ["evaluate", "--model", str(mdir), "--tasks", str(tasks), "--policy", "sampled-h2o",
            "--compression-ratio", "0.5", "--no-progress", "--no-report"]
    res = {}
    for tau in ("1", "inf"):
        r = runner.invoke(app, base + ["--tau", tau, "--out", str(tmp_path / f"o-{tau}")])
        assert r.exit_code == 0, r.output
        res[tau] = pq.read_table(tmp_path / f"o-{tau}" / "results.parquet").to_pylist()[0]
    assert res["1"]["allocator"] == res["inf"]["allocator"] == "sampled"
    assert res["1"]["kept_entries"] == res["inf"]["kept_entries"] and res["1"]["score"] != res["inf"]["score"]
    r = runner.invoke(app, base + ["--tau", "0", "--out", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "--tau" in r.output and not (tmp_path / "bad").exists()
    r = runner.invoke(app, ["probabilistic", "robustness", "--tasks", str(tasks), "--out", str(tmp_path / "bad2"),
                            "--model", str(mdir), "--proposal", "nope"])
    assert r.exit_code == 2 and "--proposal" in r.output and not (tmp_path / "bad2").exists()
    # an option or task file found bad only by evaluate used to leave an empty runs/ directory
    (tmp_path / "empty.jsonl").write_text("")
    for extra, msg in ((["--max-examples", "0"], "--max-examples"), (["--tasks", str(tmp_path / "empty.jsonl")],
                                                                        "no examples")):
        r = runner.invoke(app, ["probabilistic", "robustness", "--tasks", str(tasks), "--out", str(tmp_path / "bad3"),
                                "--model", str(mdir), *extra])
        assert r.exit_code == 2 and msg in r.output and not (tmp_path / "bad3").exists(), r.output
