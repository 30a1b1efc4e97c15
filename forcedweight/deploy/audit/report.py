"""``DIR/report.md`` of an audit and its figure (``DIR/memory.png``: bytes against the nominal
compression ratio, per method and storage). Reads whichever of ``memory.parquet``,
``leak_margins.parquet``, ``ceiling.parquet`` and ``ceiling_steps.parquet`` exist."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from forcedweight import io as fio  # noqa: E402

STYLES = {"ragged": "-", "masked": "--", "nominal": ":"}


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist() if path.exists() else []


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def memory_summary(rows: list[dict]) -> list[dict]:
    """Mean bytes per (policy, allocator, ratio, storage) over examples, with the share of dense."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["allocator"], r["compression_ratio"], r["storage"]), []).append(r)
    return [{"policy": k[0], "allocator": k[1], "compression_ratio": k[2], "storage": k[3],
             "bytes": float(np.mean([r["bytes"] for r in v])),
             "share": float(np.mean([r["bytes"] / r["dense_bytes"] for r in v]))} for k, v in sorted(groups.items())]


def memory_figure(summary: list[dict]) -> Figure:
    """Bytes held (MiB) against the compression ratio: one colour per method (labelled when there are
    at most 8), one line style per storage, and the full cache as a grey line."""
    fig = Figure(figsize=(4.5, 3.4))
    ax = fig.add_subplot()
    methods = sorted({(r["policy"], r["allocator"]) for r in summary})
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    few = len(methods) <= 8
    for i, (pol, alloc) in enumerate(methods):
        for st, ls in STYLES.items():
            pts = sorted((r["compression_ratio"], r["bytes"] / 2**20) for r in summary
                         if (r["policy"], r["allocator"], r["storage"]) == (pol, alloc, st))
            if pts:
                x, y = zip(*pts)
                ax.plot(x, y, ls, marker="o", ms=2.5, lw=1, alpha=1.0 if few else 0.5,
                        color=colors[i % len(colors)], label=f"{pol}/{alloc}" if few and st == "ragged" else None)
    dense = [r["bytes"] / r["share"] / 2**20 for r in summary if r["share"] > 0]
    if dense:
        ax.axhline(float(np.mean(dense)), color="grey", lw=0.8, label="full cache")
    for st, ls in STYLES.items():
        ax.plot([], [], ls, color="black", lw=1, label=st)
    ax.set_xlabel("nominal compression ratio (fraction evicted)")
    ax.set_ylabel("bytes held (MiB)")
    ax.set_title(f"memory audit, {len(methods)} policy/allocator methods", fontsize=8)
    ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    return fig


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]


def ceiling_summary(rows: list[dict]) -> list[dict]:
    """Mean score (and CE) per (task, kind, method, s) over examples."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["metric"], r["kind"], r["method"], r["s"]), []).append(r)
    out = []
    for (task, metric, kind, method, s), v in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][4] or 0,
                                                                                      kv[0][2], kv[0][3])):
        errs = [r["mean_error"] for r in v if r["rows"]]
        opt = [r["optimal_share"] for r in v if r["optimal_share"] is not None and np.isfinite(r["optimal_share"])]
        out.append({"task": task, "metric": metric, "kind": kind, "method": method, "s": s, "n": len(v),
                    "score": float(np.mean([r["score"] for r in v])),
                    "mean_error": float(np.mean(errs)) if errs else float("nan"),
                    "optimal_share": float(np.mean(opt)) if opt else float("nan")})
    return out


def step_check(steps: list[dict], rel: float = 1e-9) -> dict:
    """Rows where the certified best set is worse than top-mass (must be none), over the ``best`` rows."""
    best = [r for r in steps if r["method"] == "best"]
    bad = [r for r in best if r["error"] > r["error_top"] * (1 + rel) + 1e-15]
    return {"rows": len(best), "violations": len(bad),
            "optimal": sum(r["status"] == "optimal" for r in best)}


def write_report(out) -> Path:
    """Write ``out/report.md`` (and ``out/memory.png`` when the memory table exists); return the path."""
    out = Path(out)
    lines = ["# forcedweight audit", ""]
    mem = _rows(out / "memory.parquet")
    if mem:
        summary = memory_summary(mem)
        fig = memory_figure(summary)
        with fio.atomic_path(out / "memory.png") as tmp:
            fig.savefig(tmp, format="png", dpi=150)
        by = {}
        for r in summary:
            by.setdefault((r["policy"], r["allocator"], r["compression_ratio"]), {})[r["storage"]] = r
        lines += ["## Memory (bytes held; share of the full cache)", ""]
        lines += _table(["policy", "allocator", "compression ratio", "ragged bytes", "masked bytes", "nominal bytes",
                         "ragged / full", "masked / full", "ragged / nominal"],
                        [[k[0], k[1], f"{k[2]:.2f}", f"{v['ragged']['bytes']:,.0f}", f"{v['masked']['bytes']:,.0f}",
                          f"{v['nominal']['bytes']:,.0f}", v["ragged"]["share"], v["masked"]["share"],
                          v["ragged"]["bytes"] / max(v["nominal"]["bytes"], 1)] for k, v in sorted(by.items())])
        lines += ["", "![memory](memory.png)", ""]
    margins = _rows(out / "leak_margins.parquet")
    if margins:
        lines += ["## Query leak (score with the question visible minus without; positive = the question helped)", ""]
        lines += _table(["policy", "allocator", "compression ratio", "task", "n", "agnostic", "aware", "margin",
                         "95% interval", "wins/losses/ties", "sign-test p"],
                        [[r["policy"], r["allocator"], f"{r['compression_ratio']:.2f}", r["task"], r["n"],
                          r["mean_agnostic"], r["mean_aware"], r["margin"], f"[{_fmt(r['lo'])}, {_fmt(r['hi'])}]",
                          f"{r['wins']}/{r['losses']}/{r['ties']}", r["pvalue"]] for r in margins])
        lines += [""]
    ceil = _rows(out / "ceiling.parquet")
    if ceil:
        lines += ["## Selection ceiling inside generation (score per s; ce_nats: lower is better)", ""]
        lines += _table(["task", "metric", "s", "kind", "method", "n", "score", "mean attention error", "optimal share"],
                        [[r["task"], r["metric"], r["s"], r["kind"], r["method"], r["n"], r["score"], r["mean_error"],
                          r["optimal_share"]] for r in ceiling_summary(ceil)])
        steps = _rows(out / "ceiling_steps.parquet")
        if steps:
            chk = step_check(steps)
            lines += ["", f"Per-row check over {chk['rows']} rows of the certified best set: "
                          f"{chk['violations']} rows with E(best) > E(top-mass); {chk['optimal']} proved optimal "
                          "(the others stopped at the time limit; their proved lower bound is in ceiling_steps.parquet)."]
        lines += [""]
    path = out / "report.md"
    with fio.atomic_path(path) as tmp:
        Path(tmp).write_text("\n".join(lines) + "\n")
    return path


__all__ = ["ceiling_summary", "memory_figure", "memory_summary", "step_check", "write_report"]
