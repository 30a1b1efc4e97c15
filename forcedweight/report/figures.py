"""Figures for the report, sized for one paper column (3.3 in wide), matplotlib Agg backend.

Each ``*_figure`` function builds and returns a ``matplotlib.figure.Figure`` (so tests and
notebooks can inspect it); ``save_figure`` writes it as PNG (300 dpi) and PDF atomically;
``write_all`` makes every figure of a report. Figures are per model where rows of several
models would overlap: the file names then end in the model's slug.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from forcedweight.core import stats as st  # noqa: E402
from forcedweight.io import atomic_path  # noqa: E402
from forcedweight.report.metrics import hard_row_auc, row_metrics  # noqa: E402

SELECTOR_LABELS = {"top": "top-mass", "balance": "balancing"}
COLUMN_WIDTH = 3.3  # inches
HEIGHT = 2.4
STYLE = {
    "font.size": 8, "axes.labelsize": 8, "axes.titlesize": 8, "legend.fontsize": 6.5,
    "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.2, "axes.grid": True,
    "grid.alpha": 0.3, "pdf.fonttype": 42,
}


def _fig(height: float = HEIGHT) -> tuple[Figure, object]:
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH, height), layout="constrained")
        ax = fig.add_subplot()
    return fig, ax


def slug(name: str) -> str:
    """A file-name-safe form of a model name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "model"


def save_figure(fig: Figure, base: Path) -> list[Path]:
    """Write ``base.png`` (300 dpi) and ``base.pdf`` atomically; returns both paths."""
    paths = []
    for ext in ("png", "pdf"):
        target = base.with_suffix("." + ext)
        with matplotlib.rc_context(STYLE), atomic_path(target) as tmp:
            fig.savefig(tmp, format=ext, dpi=300)
        paths.append(target)
    return paths


def cdf_figure(kappa_by_s: dict[int, np.ndarray], model: str) -> Figure:
    """Empirical CDF of the closable share, one step line per budget s."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _fig()
        for s, k in sorted(kappa_by_s.items()):
            k = np.sort(k[np.isfinite(k)])
            if k.size:
                ax.step(np.r_[0.0, k], np.r_[0.0, np.arange(1, k.size + 1) / k.size], where="post", label=f"s = {s}")
        ax.set_xlabel("closable share κ")
        ax.set_ylabel("fraction of rows ≤ κ")
        ax.set_ylim(0, 1.01)
        ax.set_title(model)
        if ax.get_legend_handles_labels()[0]:  # no finite κ (e.g. every row invalid): no legend, no warning
            ax.legend(loc="lower right")
    return fig


def roc_figure(curves: dict[int, tuple[np.ndarray, np.ndarray, float]], model: str, threshold: float) -> Figure:
    """ROC of the top-mass dropped mass as a predictor of hard rows (κ > threshold), per s."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _fig(COLUMN_WIDTH * 0.85)
        for s, (fpr, tpr, auc) in sorted(curves.items()):
            ax.plot(fpr, tpr, label=f"s = {s} (AUC {auc:.2f})")
        ax.plot([0, 1], [0, 1], ls="--", c="0.5", lw=0.8)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{model}: dropped mass → κ > {threshold:g}")
        ax.legend(loc="lower right")
    return fig


def pi_figure(medians: pl.DataFrame) -> Figure:
    """Median forced-weight penalty π of the top-mass set (95% CI) against s, one line per model."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _fig()
        for model in sorted(medians["model"].unique().to_list()):
            d = medians.filter(pl.col("model") == model).sort("s")
            x, m = d["s"].to_numpy(), d["median"].to_numpy().astype(float)
            lo, hi = d["ci_lo"].to_numpy().astype(float), d["ci_hi"].to_numpy().astype(float)
            err = np.vstack([np.nan_to_num(m - lo), np.nan_to_num(hi - m)])
            ax.errorbar(x, m, yerr=err, marker="o", ms=3, capsize=2, label=model)
        ax.set_xscale("log", base=2)
        ticks = sorted(medians["s"].unique().to_list())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("budget s (kept keys)")
        ax.set_ylabel("median π (top-mass)")
        ax.legend(loc="best")
    return fig


def selector_figure(ratios: dict[str, dict[int, np.ndarray]], model: str) -> Figure:
    """Box plots of E(selector)/ES* per selector (log scale), one box per budget s."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _fig(HEIGHT * 1.1)
        names = list(ratios)
        s_values = sorted({s for r in ratios.values() for s in r})
        width = 0.8 / max(len(s_values), 1)
        colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
        for k, s in enumerate(s_values):
            data, pos = [], []
            for j, name in enumerate(names):
                v = ratios[name].get(s, np.array([]))
                v = v[np.isfinite(v) & (v > 0)]
                if v.size:
                    data.append(v)
                    pos.append(j - 0.4 + width * (k + 0.5))
            if data:
                bp = ax.boxplot(data, positions=pos, widths=width * 0.9, showfliers=False, patch_artist=True)
                for patch in bp["boxes"]:
                    patch.set_facecolor(colors[k % len(colors)])
                    patch.set_alpha(0.7)
                ax.plot([], [], "s", color=colors[k % len(colors)], label=f"s = {s}")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_xlabel("selector")
        ax.set_ylabel("E(selector) / ES*")
        ax.set_title(model)
        ax.legend(loc="upper left")
    return fig


def groups_figure(summary: pl.DataFrame, model: str) -> Figure:
    """Median group-voting cost (95% CI) against group size g: over own top-mass error and over ES_pool."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _fig()
        colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
        for k, s in enumerate(sorted(summary["s"].unique().to_list())):
            d = summary.filter(pl.col("s") == s).sort("g")
            x = d["g"].to_numpy()
            for what, ls in (("top", "-"), ("pool", "--")):
                m = d[f"cost_{what}_median"].to_numpy().astype(float)
                err = np.vstack([
                    np.nan_to_num(m - d[f"cost_{what}_lo"].to_numpy().astype(float)),
                    np.nan_to_num(d[f"cost_{what}_hi"].to_numpy().astype(float) - m),
                ])
                label = f"s = {s}, / " + ("own top-mass" if what == "top" else "ES_pool")
                ax.errorbar(x, m, yerr=err, ls=ls, marker="o", ms=3, capsize=2, label=label, color=colors[k % len(colors)])
        ticks = sorted(summary["g"].unique().to_list())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("group size g (query heads sharing a kept set)")
        ax.set_ylabel("median cost (×)")
        ax.set_title(model)
        ax.legend(loc="best")
    return fig


def write_all(df: pl.DataFrame, tables: dict[str, pl.DataFrame], fdir: Path, hard_threshold: float) -> dict[str, list[Path]]:
    """Every report figure from the results frame and the computed tables; returns name -> paths."""
    written: dict[str, list[Path]] = {}
    models = sorted(df["model"].unique().to_list())
    for model in models:
        mdf = df.filter(pl.col("model") == model)
        kappa, curves, ratios = {}, {}, {}
        for (s,), part in sorted(mdf.group_by(["s"]), key=lambda kv: kv[0]):
            m = row_metrics(part)
            kappa[s] = m["closable_share"]
            auc, curve = hard_row_auc(m, hard_threshold, with_curve=True)
            if curve is not None:
                curves[s] = (*curve, auc.auc)
            for name, v in m.items():
                if name.startswith("ratio_") and np.isfinite(v).any():
                    label = SELECTOR_LABELS.get(name[6:], name[6:])
                    ratios.setdefault(label, {})[s] = v
        tag = slug(model)
        written[f"cdf_closable_share_{tag}"] = save_figure(cdf_figure(kappa, model), fdir / f"cdf_closable_share_{tag}")
        if curves:
            written[f"roc_dropped_mass_{tag}"] = save_figure(
                roc_figure(curves, model, hard_threshold), fdir / f"roc_dropped_mass_{tag}"
            )
        if ratios:
            written[f"selector_ratios_{tag}"] = save_figure(selector_figure(ratios, model), fdir / f"selector_ratios_{tag}")
    med = tables["medians"]
    pi = med.filter((pl.col("scope") == "pooled") & (pl.col("metric") == "pi_top"))
    if pi.height and pi.group_by("model").agg(pl.col("s").n_unique().alias("k"))["k"].max() >= 2:
        written["pi_vs_s"] = save_figure(pi_figure(pi), fdir / "pi_vs_s")  # a curve needs two budgets
    if "groups" in tables and tables["groups"].height:
        g = tables["groups"]
        for model in sorted(g["model"].unique().to_list()):
            tag = slug(model)
            written[f"group_cost_{tag}"] = save_figure(
                groups_figure(g.filter(pl.col("model") == model), model), fdir / f"group_cost_{tag}"
            )
    return written
