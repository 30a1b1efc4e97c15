"""``report.md``: the headline numbers pooled per (model, s), links to tables and figures, definitions."""

from __future__ import annotations

from importlib import metadata

import numpy as np
import polars as pl

def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "NaN"
    return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _ci(m, lo, hi) -> str:
    return f"{_fmt(m)} [{_fmt(lo)}, {_fmt(hi)}]"


def package_versions_text() -> str:
    """``name version`` of the packages the report depends on (and forcedweight itself)."""
    out = []
    for name in ("forcedweight", "numpy", "scipy", "polars", "pyarrow", "matplotlib"):
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return ", ".join(out)


def render_markdown(tables, out, written_tables, written_figures, results_path, groups_path,
                    command, hard_threshold, n_boot, seed, settings=()) -> str:
    """``report.md``: headline table pooled per (model, s), then links and the command."""
    pooled = {name: t.filter(pl.col("scope") == "pooled") for name, t in tables.items() if "scope" in t.columns}
    med = pooled["medians"]

    def metric(model, s, name):
        r = med.filter((pl.col("model") == model) & (pl.col("s") == s) & (pl.col("metric") == name))
        return _ci(r["median"][0], r["ci_lo"][0], r["ci_hi"][0]) if r.height else "NaN"

    lines = [
        "# forcedweight report", "",
        f"Results: `{results_path}`" + (f"; groups: `{groups_path}`" if groups_path else ""), "",
        "Medians with percentile-bootstrap 95% intervals "
        f"({n_boot} resamples, seed {seed}); hard = closable share > {hard_threshold}.", "",
        "## Headline numbers (pooled per model and budget)", "",
        "| model | s | rows (opt/impr/unsolved/invalid) | median κ [95% CI] | κ median, one-sided 95% Wilson upper (pessimistic; exact coverage) "
        "| Δ median κ, pool → best | solver-improved + unsolved share (Wilson hi) "
        "| balancing recovery | π (top) | AUC dropped mass → hard [95% CI] | Spearman(D, ES_pool) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    counts, bounds, pred, subst = pooled["status_counts"], pooled["bounds"], pooled["prediction"], pooled["substitution"]
    for c in counts.iter_rows(named=True):
        model, s = c["model"], c["s"]
        b = bounds.filter((pl.col("model") == model) & (pl.col("s") == s)).row(0, named=True)
        p = pred.filter((pl.col("model") == model) & (pl.col("s") == s)).row(0, named=True)
        d = subst.filter((pl.col("model") == model) & (pl.col("s") == s)).row(0, named=True)
        lines.append(
            f"| {model} | {s} | {c['n_rows']} ({c['n_optimal']}/{c['n_improved']}/{c['n_unsolved']}/{c['n_invalid']}) "
            f"| {metric(model, s, 'closable_share')} | {_fmt(b['median_kappa_wilson_upper'])} ({_fmt(b['median_kappa_wilson_coverage'])}) "
            f"| {_fmt(d['delta_median_kappa'])} | {_fmt(b['improved_share'])} ({_fmt(b['improved_share_wilson_hi'])}) "
            f"| {metric(model, s, 'balancing_recovery')} | {metric(model, s, 'pi_top')} "
            f"| {_ci(p['auc'], p['auc_lo'], p['auc_hi'])} | {_fmt(p['spearman_rho'])} |"
        )
    meds = tables["medians"].filter(pl.col("scope") == "pooled")
    if meds.height:
        lines += ["", "## Pooled medians: row bootstrap beside cluster bootstraps", "",
                  "Rows cluster by text and by (layer, head) family; the cluster intervals resample whole texts "
                  "or whole families (blank where there is one cluster or no text ids).", "",
                  "| model | s | metric | median | row 95% CI | text-cluster 95% CI | family-cluster 95% CI |",
                  "|---|---|---|---|---|---|---|"]
        for r in meds.iter_rows(named=True):
            lines.append(f"| {r['model']} | {r['s']} | {r['metric']} | {_fmt(r['median'])} | [{_fmt(r['ci_lo'])}, {_fmt(r['ci_hi'])}] "
                         f"| [{_fmt(r['ci_lo_text'])}, {_fmt(r['ci_hi_text'])}] | [{_fmt(r['ci_lo_family'])}, {_fmt(r['ci_hi_family'])}] |")
        auc_cols = [c for c in pred.columns if c.startswith("auc_hard_")]
        lines += ["", "## Dropped mass → hard rows at several thresholds; per-family Spearman", "",
                  "| model | s | " + " | ".join(f"AUC (κ > {c[9:]})" for c in auc_cols)
                  + " | median over families of Spearman(D, ES_pool) (families) |",
                  "|---|---|" + "---|" * (len(auc_cols) + 1)]
        for p in pred.filter(pl.col("scope") == "pooled").iter_rows(named=True):
            lines.append(f"| {p['model']} | {p['s']} | " + " | ".join(_fmt(p[c]) for c in auc_cols)
                         + f" | {_fmt(p['spearman_family_median'])} ({p['spearman_families']}) |")
    if "groups" in tables and tables["groups"].height:
        lines += ["", "## Group voting (shared kept set per KV group)", "",
                  "| model | s | g | rows | cost / own top-mass [95% CI] | cost / ES_pool [95% CI] |", "|---|---|---|---|---|---|"]
        for r in tables["groups"].iter_rows(named=True):
            lines.append(
                f"| {r['model']} | {r['s']} | {r['g']} | {r['n']} | {_ci(r['cost_top_median'], r['cost_top_lo'], r['cost_top_hi'])} "
                f"| {_ci(r['cost_pool_median'], r['cost_pool_lo'], r['cost_pool_hi'])} |"
            )
    lines += ["", "## Tables", ""]
    for name, paths in written_tables.items():
        lines.append(f"- {name}: " + ", ".join(f"[{p.name}]({p.relative_to(out).as_posix()})" for p in paths))
    lines += ["", "## Figures", ""]
    for name, paths in written_figures.items():
        png = [p for p in paths if p.suffix == ".png"]
        lines.append(f"- {name}: " + ", ".join(f"[{p.name}]({p.relative_to(out).as_posix()})" for p in paths))
        if png:
            lines.append(f"  ![{name}]({png[0].relative_to(out).as_posix()})")
    left = tables.get("left_out")
    if left is not None and left.height:
        lines += ["", "Left out (no row has their inputs): " + ", ".join(f"`{m[6:]}`" for m in left["metric"].to_list()) + "."]
    lines += ["", "## Settings", "", f"- bootstrap: {n_boot} resamples, seed {seed}; hard threshold κ > {hard_threshold}",
              f"- package versions: {package_versions_text()}",
              *(settings or ["- certify and dump settings: not recorded in the results file"])]
    lines += ["", "## Definitions", "",
              "Full definitions: [docs/concepts.md](../docs/concepts.md) in the forcedweight repository.", "",
              "- E(S): the forced-weight error ‖Σ_{i∈S} p_i v_i / p(S) − μ‖ of keeping S (μ = Σ p_i v_i); "
              "EF(S): the same with free simplex weights on S; π = E/EF (the forced-weight penalty).",
              "- D = dropped mass 1 − p(S) of the top-mass set.",
              "- Pool: the candidate pool (top keys by mass plus keys of largest single-key error); ES_pool = the "
              "exact minimum of E over its s-subsets.",
              "- Balancing recovery = (E(top) − E(balance))/(E(top) − ES*): share of the gap that 1-swaps recover.",
              "- Family = one (model, layer, head) at one s; pooled = all families of a model at one s.",
              "- κ = (E(top) − ES*)/E(top), ES* = best known value (solver improvements substituted); 0 when E(top) = 0.",
              "- Pessimistic κ: unsolved and improved rows (neither proved optimal) take ES* = their proved lower bound "
              "(κ = 1 when none), i.e. counted as improved "
              "as far as the proof allows; the one-sided 95% Wilson upper bound on its median is the smallest observed κ "
              "whose share of rows at or below it has a one-sided 95% Wilson lower bound (z = 1.645) ≥ 1/2; in "
              "parentheses its exact coverage P(Bin(n, 1/2) ≤ j − 1) for that n (below 0.95 at some small n); "
              "blank below n = 3.",
              "- Rows with N ≤ s (nothing can be evicted, κ = 0 by construction) are left out of every statistic; "
              "their count is `n_no_eviction` in status_counts and a note in the tables.",
              "- Selector ratio E(selector)/ES*; rows with ES* = 0 excluded and counted in the note.",
              "- AUC = Mann–Whitney U/(n_hard·n_easy) of the top-mass dropped mass, ties half; DeLong 95% interval.",
              "", "## Command", "", "```", command, "```", ""]
    return "\n".join(lines)
