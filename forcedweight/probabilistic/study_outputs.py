"""Tables, figures and ``report.md`` of the probabilistic-eviction study (all writes atomic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from forcedweight.io import atomic_path, write_table_atomic

METHOD_ORDER = ("topk", "sampled", "corrected")


def write_frame(df: pl.DataFrame, out: Path, stem: str) -> None:
    """``stem.parquet`` and ``stem.csv`` in ``out``, each written atomically."""
    write_table_atomic(df.to_arrow(), out / f"{stem}.parquet")
    with atomic_path(out / f"{stem}.csv") as tmp:
        df.write_csv(tmp)


def summarise(records: pl.DataFrame) -> pl.DataFrame:
    """Mean error, relative error, mse, bias², variance per (proposal, method, tau, ratio) over every
    (text, layer, head, eviction position); rows with status != ok are counted apart."""
    ok = records.filter(pl.col("status") == "ok")
    return (
        ok.group_by(["proposal", "method", "tau", "ratio"])
        .agg(
            pl.col("error").mean().alias("error_mean"),
            pl.col("error").median().alias("error_median"),
            pl.col("rel_error").mean().alias("rel_error_mean"),
            pl.col("mse").mean().alias("mse"),
            pl.col("bias2").mean().alias("bias2"),
            pl.col("variance").mean().alias("variance"),
            pl.col("kept").mean().alias("kept_mean"),
            pl.col("n_pre").mean().alias("n_pre_mean"),
            pl.len().alias("trajectories"),
        )
        .sort(["proposal", "method", "tau", "ratio"], nulls_last=False)
    )


def compression_summary(comp: pl.DataFrame) -> pl.DataFrame:
    """Paper 000 Table 1: per (proposal, target ratio), the effective ratio's mean and std over texts and
    seeds, the expected ratio of the chosen global m, and the spread over groups."""
    ok = comp.filter(pl.col("status") == "ok")
    if ok.height == 0:
        return pl.DataFrame()
    return (
        ok.group_by(["proposal", "target_ratio"])
        .agg(
            pl.col("m").mean().alias("m_mean"),
            pl.col("expected_ratio").mean().alias("expected_ratio"),
            pl.col("effective_ratio").mean().alias("effective_mean"),
            pl.col("effective_ratio").std().alias("effective_std"),
            (pl.col("effective_ratio") - pl.col("target_ratio")).abs().mean().alias("abs_error"),
            pl.col("group_ratio_min").min().alias("group_ratio_min"),
            pl.col("group_ratio_max").max().alias("group_ratio_max"),
            pl.len().alias("draws"),
        )
        .sort(["proposal", "target_ratio"])
    )


def _save(fig, out: Path, stem: str) -> list[Path]:
    paths = []
    for ext in ("png", "pdf"):
        target = out / f"{stem}.{ext}"
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=ext, dpi=130, bbox_inches="tight")
        paths.append(target)
    return paths


def _legend(axes, **kwargs) -> None:
    """A legend on the first of ``axes`` with labelled lines (none, and no warning, when no panel has data)."""
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(**kwargs)
            return


def _log_y(ax, empty_note: str = "nothing to plot") -> None:
    """A log y axis where the panel plots a finite positive value; otherwise linear, with a note (one
    seed gives NaN bias² and variance: matplotlib cannot log-scale a panel without positive data)."""
    ys = [np.asarray(line.get_ydata(), dtype=np.float64) for line in ax.get_lines()]
    if any(np.any(np.isfinite(y) & (y > 0)) for y in ys):
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, empty_note, transform=ax.transAxes, ha="center", va="center", fontsize=7)


def figures(summary: pl.DataFrame, comp: pl.DataFrame, out: Path) -> list[Path]:
    """error_vs_ratio (three methods, one panel per proposal), error_vs_tau, bias_variance_vs_tau,
    effective_compression; PNG and PDF each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    proposals = summary["proposal"].unique(maintain_order=True).to_list()
    paths: list[Path] = []
    if not proposals:
        return paths
    w = len(proposals)

    fig, axes = plt.subplots(1, w, figsize=(3.2 * w, 3.0), squeeze=False, sharey=True)
    for ax, prop in zip(axes[0], proposals):
        d = summary.filter(pl.col("proposal") == prop)
        for method, style in (("topk", "s-"), ("sampled", "o--"), ("corrected", "^-")):
            sel = d.filter(pl.col("method") == method)
            if method == "corrected":
                sel = sel.filter(pl.col("tau") == 1.0)
            if sel.height:
                label = "corrected (τ=1)" if method == "corrected" else method
                ax.plot(sel["ratio"], sel["error_mean"], style, label=label, ms=4)
        ax.set_title(prop)
        ax.set_xlabel("compression ratio r")
        _log_y(ax)
    axes[0][0].set_ylabel("mean ||o_evicted − o_dense||")
    _legend(axes[0], fontsize=7)
    paths += _save(fig, out, "error_vs_ratio")
    plt.close(fig)

    fig, axes = plt.subplots(1, w, figsize=(3.2 * w, 3.0), squeeze=False, sharey=True)
    ratios = sorted(summary["ratio"].unique().to_list())
    cmap = plt.get_cmap("viridis")
    for ax, prop in zip(axes[0], proposals):
        d = summary.filter((pl.col("proposal") == prop) & (pl.col("method") == "corrected"))
        for i, r in enumerate(ratios):
            sel = d.filter(pl.col("ratio") == r).sort("tau")
            if sel.height:
                c = cmap(i / max(1, len(ratios) - 1))
                ax.plot(sel["tau"], sel["error_mean"], "o-", color=c, ms=3, label=f"r={r:g}")
                und = summary.filter((pl.col("proposal") == prop) & (pl.col("method") == "sampled")
                                     & (pl.col("ratio") == r))
                if und.height:
                    ax.axhline(und["error_mean"][0], color=c, ls=":", lw=0.8)
        ax.set_title(f"{prop} (dotted: τ=∞)")
        ax.set_xlabel("τ")
        _log_y(ax)
    axes[0][0].set_ylabel("mean error, corrected")
    _legend(axes[0], fontsize=6, ncol=2)
    paths += _save(fig, out, "error_vs_tau")
    plt.close(fig)

    fig, axes = plt.subplots(1, w, figsize=(3.2 * w, 3.0), squeeze=False, sharey=True)
    for ax, prop in zip(axes[0], proposals):
        d = summary.filter(pl.col("proposal") == prop)
        cor = d.filter(pl.col("method") == "corrected").group_by("tau").agg(
            pl.col("bias2").mean(), pl.col("variance").mean()).sort("tau")
        und = d.filter(pl.col("method") == "sampled")
        taus = cor["tau"].to_list()
        if taus:
            xs = taus + [max(taus) + 1.5]
            b = cor["bias2"].to_list() + ([und["bias2"].mean()] if und.height else [np.nan])
            v = cor["variance"].to_list() + ([und["variance"].mean()] if und.height else [np.nan])
            ax.plot(xs, b, "o-", label="bias²", ms=3)
            ax.plot(xs, v, "s-", label="variance", ms=3)
            ax.set_xticks(xs, [f"{x:g}" for x in taus] + ["∞"])
        ax.set_title(prop)
        ax.set_xlabel("τ")
        _log_y(ax, "bias² and variance need 2 or more seeds")
    axes[0][0].set_ylabel("mean over ratios")
    _legend(axes[0], fontsize=7)
    paths += _save(fig, out, "bias_variance_vs_tau")
    plt.close(fig)

    if comp.height:
        fig, ax = plt.subplots(figsize=(3.6, 3.4))
        for prop in comp["proposal"].unique(maintain_order=True).to_list():
            d = comp.filter(pl.col("proposal") == prop)
            ax.errorbar(d["target_ratio"], d["effective_mean"], yerr=d["effective_std"].fill_null(0),
                        fmt="o-", ms=3, capsize=2, label=prop)
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set_xlabel("target ratio r*")
        ax.set_ylabel("effective ratio (global m)")
        ax.legend(fontsize=7)
        paths += _save(fig, out, "effective_compression")
        plt.close(fig)
    return paths


def _md_table(df: pl.DataFrame, floats: str = "{:.4g}") -> str:
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.iter_rows():
        cells = [floats.format(x) if isinstance(x, float) else ("" if x is None else str(x)) for x in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline(records: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per proposal and ratio, mean error of topk, sampled and corrected (τ=1); and per proposal the share
    of paired settings (same text, layer, head, position, ratio) where corrected (τ=1) beats each other."""
    ok = records.filter(pl.col("status") == "ok")
    ok = ok.filter((pl.col("method") != "corrected") | (pl.col("tau") == 1.0))
    wide = ok.pivot(on="method", index=["proposal", "text_id", "layer", "head", "evict_pos", "ratio"],
                    values="error")
    for m in METHOD_ORDER:
        if m not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(m))
    by_ratio = wide.group_by(["proposal", "ratio"]).agg(
        [pl.col(m).mean() for m in METHOD_ORDER]).sort(["proposal", "ratio"])
    paired = wide.drop_nulls(list(METHOD_ORDER))
    wins = paired.group_by("proposal").agg(
        (pl.col("corrected") < pl.col("topk")).mean().alias("corrected_beats_topk"),
        (pl.col("corrected") < pl.col("sampled")).mean().alias("corrected_beats_sampled"),
        (pl.col("sampled") < pl.col("topk")).mean().alias("sampled_beats_topk"),
        (pl.col("corrected") / pl.col("topk")).median().alias("median_corrected_over_topk"),
        pl.len().alias("pairs"),
    ).sort("proposal")
    return by_ratio, wins


def write_report(out: Path, records: pl.DataFrame, comp_summary: pl.DataFrame, command: str,
                 n_traj: int, config_text: str) -> Path:
    """``report.md``: the headline comparison (corrected vs uncorrected vs top-k), Table 1, the command."""
    by_ratio, wins = headline(records)
    unreachable = records.filter(pl.col("status") != "ok").height
    parts = [
        "# Probabilistic eviction: bias–variance study",
        "",
        f"Command: `{command}`",
        "",
        f"{n_traj} trajectories (text, layer, KV group); {config_text}",
        "",
        "Error = ||o_evicted − o_dense||₂ of every later query row, averaged over rows, seeds and query heads.",
        "",
        "## Headline: share of paired settings won (lower error), corrected at τ = 1",
        "",
        _md_table(wins),
        "",
        "## Mean error by compression ratio",
        "",
        _md_table(by_ratio),
        "",
        "## Effective versus target compression with one global m (paper 000, Table 1)",
        "",
        _md_table(comp_summary) if comp_summary.height else "(no reachable setting)",
        "",
        "Figures: `error_vs_ratio`, `error_vs_tau`, `bias_variance_vs_tau`, `effective_compression` (.png/.pdf).",
        "Tables: `records`, `summary`, `compression`, `compression_draws` (.parquet/.csv).",
    ]
    if unreachable:
        parts += ["", f"{unreachable} sampled settings were unreachable by Algorithm 2 (see `status`)."]
    target = out / "report.md"
    with atomic_path(target) as tmp:
        tmp.write_text("\n".join(parts) + "\n")
    return target
