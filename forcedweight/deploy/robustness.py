"""The robustness study of paper 000 §7 in generation: sampled + corrected, sampled uncorrected and top-k
eviction for every proposal, over a task file, built on :func:`forcedweight.deploy.evaluate.evaluate` runs.

One ``evaluate`` run per setting, each in its own directory under ``OUT/runs/`` (each resumable as
``evaluate`` is; a finished one is read back, not recomputed):

- ``runs/topk``: ``none`` and ``topk-<p>`` for every proposal p (deterministic, one seed);
- ``runs/tau-<τ>-seed-<s>``: ``sampled-<p>`` with ``tau = τ`` (``inf`` = uncorrected) and seed s.

Outputs (``.csv`` and ``.parquet``; ``report.md`` with the command):

- ``results``: every result row, with ``method`` (``topk-h2o``, ``sampled-h2o τ=1``, ...), ``tau`` and ``run``;
- ``summary``: mean score per (task, compression ratio, method) over examples and seeds;
- ``ranks``: per (task, ratio) cell, each method's rank (1 = best; ties share the mean rank; for
  cross-entropy lower is better) and normalised rank ``(M - rank) / (M - 1)``;
- ``win_scores``: paper 000's win score, the mean normalised rank over the cells (tasks x ratios),
  overall and per ratio (``compression_ratio`` = NaN for overall), for the main comparison (top-k,
  τ = ∞ and the smallest τ of each proposal); ``win_scores_tau``: the same among the τ values of each
  proposal (paper 000 Figs. 7–8);
- ``table1``: target against effective compression measured on the cache after eviction (mean, std,
  min, max over examples and seeds), per sampled proposal and ratio (paper 000 Table 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from forcedweight import io as fio
from forcedweight.deploy.evaluate import evaluate
from forcedweight.deploy.policies.sampled import SAMPLED_PROPOSALS
from forcedweight.deploy.tasks import higher_is_better, read_tasks
from forcedweight.errors import InputError, check_seed
from forcedweight.models import loaded_model


@dataclass(frozen=True)
class RobustnessConfig:
    """Settings of the study; validated on construction (InputError naming the option)."""

    proposals: tuple = ("h2o", "snapkv", "knorm", "streaming", "minh")
    ratios: tuple = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    taus: tuple = (1.0, 2.0, 3.0, 4.0, 5.0)
    seeds: tuple = (0, 1, 2)
    uncorrected: bool = True
    topk: bool = True
    scope: str = "layer"
    max_examples: int | None = None
    policy_options: dict = field(default_factory=dict)

    def __post_init__(self):
        # a value given twice is one setting (--seeds 0,0 read the same run twice and doubled its rows)
        for name in ("proposals", "ratios", "taus", "seeds"):
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        for p in self.proposals:
            if p not in SAMPLED_PROPOSALS:
                raise InputError(f"--proposal: unknown {p!r} (choose from {', '.join(SAMPLED_PROPOSALS)})")
        if not self.proposals:
            raise InputError("--proposal: give at least one")
        for r in self.ratios:
            if not 0 < float(r) < 1:
                raise InputError(f"--ratios: {r} outside (0, 1)")
        for t in self.taus:
            if not float(t) > 0:
                raise InputError(f"--taus: {t} must be > 0 (inf = uncorrected)")
        if not self.taus and not self.uncorrected:  # no sampled run at all (it failed after the model load)
            raise InputError("--taus: give at least one τ, or keep the uncorrected runs (--uncorrected)")
        if not self.seeds:
            raise InputError("--seeds: give at least one seed")
        for s in self.seeds:
            check_seed(s, "--seeds")
        if self.scope not in ("layer", "model"):
            raise InputError(f"--scope: 'layer' or 'model', got {self.scope!r}")
        if self.max_examples is not None and self.max_examples < 1:
            raise InputError(f"--max-examples must be >= 1, got {self.max_examples}")

    def all_taus(self) -> list[float]:
        taus = [float(t) for t in self.taus]
        return list(dict.fromkeys(taus + ([math.inf] if self.uncorrected else [])))


def _tau_name(tau: float) -> str:
    return "inf" if math.isinf(tau) else f"{tau:g}"


def method_label(policy: str, tau: float | None) -> str:
    """``topk-h2o`` / ``none``, or ``sampled-h2o τ=<tau>`` (``inf`` uncorrected)."""
    return policy if tau is None else f"{policy} τ={_tau_name(tau)}"


def win_scores(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Ranks per (task, compression ratio) cell and the win score per method (paper 000 §7).

    Parameters
    ----------
    summary : DataFrame with columns task, compression_ratio, method, score (the mean of the cell),
        higher_is_better.

    Returns
    -------
    ranks : per (task, compression_ratio, method): rank (1 = best, ties the mean rank), n_methods and
        norm_rank = (M - rank) / (M - 1) (1 = best; 1 when M = 1).
    wins : per method: win_score = mean norm_rank over the cells, cells (how many).
    """
    rows = []
    for (task, ratio), cell in summary.groupby(["task", "compression_ratio"], sort=True):
        good = cell["score"] if bool(cell["higher_is_better"].iloc[0]) else -cell["score"]
        rank = good.rank(ascending=False, method="average")
        M = len(cell)
        for meth, rk in zip(cell["method"], rank):
            rows.append({"task": task, "compression_ratio": ratio, "method": meth, "rank": float(rk),
                         "n_methods": M, "norm_rank": 1.0 if M == 1 else (M - rk) / (M - 1)})
    ranks = pd.DataFrame(rows)
    wins = (ranks.groupby("method").agg(win_score=("norm_rank", "mean"), cells=("norm_rank", "size"))
            .reset_index().sort_values("win_score", ascending=False, kind="stable"))
    return ranks, wins


def _runs(cfg: RobustnessConfig) -> list[dict]:
    """The evaluate runs of the study: name, policies, options, seed, tau."""
    runs = []
    if cfg.topk:
        runs.append({"run": "topk", "policies": ["none"] + [f"topk-{p}" for p in cfg.proposals], "seed": 0,
                     "tau": None, "options": {f"topk-{p}": dict(cfg.policy_options.get(p, {})) for p in cfg.proposals}})
    for s in cfg.seeds:  # seed-major: a partial study has every tau of the first seeds
        for tau in cfg.all_taus():
            opts = {f"sampled-{p}": {**cfg.policy_options.get(p, {}), "tau": tau, "scope": cfg.scope}
                    for p in cfg.proposals}
            runs.append({"run": f"tau-{_tau_name(tau)}-seed-{s}", "policies": [f"sampled-{p}" for p in cfg.proposals],
                         "seed": int(s), "tau": tau, "options": opts})
    return runs


def run_robustness(model, tasks, out, cfg: RobustnessConfig, command: str = "", progress: bool = True,
                   quiet: bool = False, device: str = "cpu") -> Path:
    """Run (or resume) every evaluate run of the study and write the tables; return ``out/report.md``."""
    out = fio.check_output_dir(out)
    with fio.output_lock(out, "probabilistic robustness"):
        read_tasks(tasks, cfg.max_examples)  # a bad task file fails before the model loads and any directory is made
        return _run_robustness(model, tasks, out, cfg, command, progress, quiet, device)


def _run_robustness(model, tasks, out: Path, cfg: RobustnessConfig, command: str, progress: bool, quiet: bool,
                    device: str) -> Path:
    loaded = loaded_model(model, "the robustness study", device=device,
                          note=(lambda m: None) if quiet else (lambda m: print(m, flush=True)))
    frames = []
    for spec in _runs(cfg):
        # every run through evaluate, which resumes it, reuses a finished run of the same inputs (task
        # file, model, seed, options) and keeps exactly the examples and settings asked for, so a rerun
        # with other tasks, --max-examples or --scope never reads an old run's rows
        res = evaluate(loaded, tasks, out / "runs" / spec["run"], spec["policies"],
                       compression_ratios=list(cfg.ratios), max_examples=cfg.max_examples, seed=spec["seed"],
                       policy_options=spec["options"], progress=progress, report=False, quiet=quiet, device=device)
        df = pq.read_table(res).to_pandas()
        df["run"] = spec["run"]
        df["tau"] = np.nan if spec["tau"] is None else spec["tau"]
        df["method"] = [method_label(p, None if spec["tau"] is None else spec["tau"]) for p in df["policy"]]
        frames.append(df)
    return write_tables(pd.concat(frames, ignore_index=True), out, cfg, command)


def _write(df: pd.DataFrame, out: Path, name: str) -> None:
    fio.write_table_atomic(pa.Table.from_pandas(df, preserve_index=False), out / f"{name}.parquet")
    with fio.atomic_path(out / f"{name}.csv") as tmp:
        df.to_csv(tmp, index=False)


TABLES = ("results", "summary", "ranks", "win_scores", "win_scores_tau", "table1")
OUTPUTS = tuple(f"{t}.{x}" for t in TABLES for x in ("parquet", "csv")) + ("report.md",)


def write_tables(results: pd.DataFrame, out: Path, cfg: RobustnessConfig, command: str = "") -> Path:
    """Summary, ranks, win scores, Table 1 and report.md from the gathered result rows; staged
    (``io.staged_outputs``): the previous tables are replaced all at once, the runs under ``runs/`` kept."""
    with fio.staged_outputs(out, owned=OUTPUTS, keep=("runs",)) as stage:
        _write_tables(results, stage, cfg, command)
    return out / "report.md"


def _write_tables(results: pd.DataFrame, out: Path, cfg: RobustnessConfig, command: str) -> Path:
    res = results[results["policy"] != "none"].copy()
    res["higher_is_better"] = [higher_is_better(m) for m in res["metric"]]
    # continuation: rank on the CE increase over the full cache (the same ranking as CE itself)
    res["value"] = np.where(res["metric"] == "ce_nats", res["ce_delta"], res["score"])
    summary = (res.groupby(["task", "compression_ratio", "method", "higher_is_better"], sort=True)
               .agg(score=("value", "mean"), n=("value", "size"),
                    effective_compression=("effective_compression", "mean"),
                    physical_bytes=("physical_bytes", "mean")).reset_index())
    taus = cfg.all_taus()
    main_taus = {method_label(f"sampled-{p}", t) for p in cfg.proposals for t in (min(taus), math.inf) if t in taus}
    is_main = summary["method"].str.startswith("topk-") | summary["method"].isin(main_taus)
    ranks, wins = win_scores(summary[is_main])
    per_ratio = [w.assign(compression_ratio=r) for r, g in summary[is_main].groupby("compression_ratio")
                 for w in [win_scores(g)[1]]]
    wins_all = pd.concat([wins.assign(compression_ratio=np.nan)] + per_ratio, ignore_index=True)
    tau_wins = []
    for p in cfg.proposals:
        sub = summary[summary["method"].str.startswith(f"sampled-{p} τ=")]
        if sub["method"].nunique() > 1:
            tau_wins.append(win_scores(sub)[1].assign(proposal=p))
    wins_tau = pd.concat(tau_wins, ignore_index=True) if tau_wins else pd.DataFrame(
        columns=["method", "win_score", "cells", "proposal"])
    sampled = res[res["policy"].str.startswith("sampled-")]
    one_tau = sampled[sampled["tau"] == sampled["tau"].max()]  # the draws do not depend on tau: one tau
    table1 = (one_tau.groupby(["policy", "compression_ratio"]).agg(
        effective_mean=("effective_compression", "mean"), effective_std=("effective_compression", "std"),
        effective_min=("effective_compression", "min"), effective_max=("effective_compression", "max"),
        n=("effective_compression", "size")).reset_index().rename(columns={"compression_ratio": "target"}))
    table1["error"] = table1["effective_mean"] - table1["target"]
    for name, df in zip(TABLES, (results, summary, ranks, wins_all, wins_tau, table1)):
        _write(df, out, name)
    return _report(out, summary, ranks, wins_all, wins_tau, table1, command)


def _md(df: pd.DataFrame, floatfmt: str = "{:.3f}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = [floatfmt.format(v) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _report(out: Path, summary, ranks, wins, wins_tau, table1, command: str) -> Path:
    overall = wins[wins["compression_ratio"].isna()][["method", "win_score", "cells"]]
    by_ratio = wins[wins["compression_ratio"].notna()].pivot(index="method", columns="compression_ratio",
                                                               values="win_score")
    by_ratio.columns = [f"r={c:g}" for c in by_ratio.columns]
    task_rank = ranks.groupby(["method", "task"])["rank"].mean().unstack("task")
    score_tab = summary.pivot_table(index="method", columns=["task", "compression_ratio"], values="score")
    score_tab.columns = [f"{t} r={r:g}" for t, r in score_tab.columns]
    parts = ["# Robustness study (paper 000 §7) in generation", "",
             f"Command: `{command}`" if command else "", "",
             "## Win scores (mean normalised rank over tasks x ratios; 1 = always best)", "", _md(overall), "",
             "### Per compression ratio", "", _md(by_ratio.reset_index()), "",
             "## Mean rank per task (over the ratios; 1 = best)", "", _md(task_rank.reset_index()), "",
             "## Table 1: effective vs target compression (measured on the cache after eviction)", "",
             _md(table1, "{:.4f}"), "",
             "## Win scores among τ per proposal", "", _md(wins_tau) if len(wins_tau) else "(one τ only)", "",
             "## Mean score per task and ratio (continuation: CE increase in nats, lower is better)", "",
             _md(score_tab.reset_index()), ""]
    path = out / "report.md"
    with fio.atomic_path(path) as tmp:
        Path(tmp).write_text("\n".join(parts))
    return path


def parse_taus(values: Sequence[str]) -> tuple[float, ...]:
    """τ values from strings (``inf`` allowed)."""
    out = []
    for v in values:
        try:
            out.append(float(v))
        except ValueError:
            raise InputError(f"--taus: {v!r} is not a number") from None
    return tuple(out)
