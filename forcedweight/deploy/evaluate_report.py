"""The evaluate report: tables per task x compression ratio, score against physical bytes, and paired
comparisons between methods at matched physical bytes (``DIR/report/``).

A *method* is ``policy/allocator`` (``none`` for the full cache). Written files:

- ``summary.csv``: per (task, metric, method, compression ratio): examples, mean score, mean
  physical / nominal / dense bytes, physical share of the dense cache, mean seconds;
- ``paired.csv`` / ``paired.parquet``: for every two methods other than none and every metric,
  wins / losses / ties over the (task, compression ratio, example) triples both ran (same budget, so
  the same kept entries: matched physical bytes; ``bytes_ratio`` = their mean physical-bytes ratio),
  a two-sided sign test and a bootstrap interval of the mean difference
  (``forcedweight.core.stats.paired_comparison``; for cross-entropy lower is better);
- ``score_vs_bytes-<task>.png``: mean score against mean physical bytes per method;
- ``report.md``: the tables and the figures.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from forcedweight import io as fio  # noqa: E402
from forcedweight.core.stats import paired_comparison  # noqa: E402
from forcedweight.deploy.allocate import budget_ratio  # noqa: E402
from forcedweight.deploy.tasks import higher_is_better  # noqa: E402
from forcedweight.errors import InputError  # noqa: E402


#: the result rows ``evaluate`` writes (one per example and method) and this report reads
RESULT_SCHEMA = pa.schema([
    ("id", pa.string()), ("task", pa.string()), ("metric", pa.string()), ("policy", pa.string()),
    ("allocator", pa.string()), ("compression_ratio", pa.float64()), ("budget", pa.float64()),
    ("query_aware", pa.bool_()), ("seed", pa.int64()), ("answer", pa.string()), ("score", pa.float64()),
    ("ce_full", pa.float64()), ("ce_delta", pa.float64()), ("physical_bytes", pa.int64()),
    ("nominal_bytes", pa.int64()), ("dense_bytes", pa.int64()), ("kept_entries", pa.int64()),
    ("context_tokens", pa.int64()), ("answer_tokens", pa.int64()), ("prefill_s", pa.float64()),
    ("scoring_s", pa.float64()), ("evict_s", pa.float64()), ("decode_s", pa.float64()),
    ("effective_compression", pa.float64()),
])


def method_name(row: dict) -> str:
    return "none" if row["policy"] == "none" else f"{row['policy']}/{row['allocator']}"


def _rows(results) -> list[dict]:
    """Result rows of a results file or an output directory; a directory whose run is still going (or
    was stopped) is read from its finished parts (a partial report)."""
    path = Path(results)
    files = [path]
    if path.is_dir():
        parts = sorted((path / ".results.parquet.parts").glob("part-*.parquet"))
        files = [path / "results.parquet"] if (path / "results.parquet").is_file() or not parts else parts
    if not files[0].is_file():
        raise InputError(f"{files[0]}: no such results file (run forcedweight evaluate first)")
    try:
        tables = [pq.read_table(f) for f in files]
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    need = ("id", "task", "metric", "policy", "allocator", "compression_ratio", "score", "physical_bytes")
    for f, t in zip(files, tables):
        missing = [c for c in need if c not in t.column_names]
        if missing:
            raise InputError(f"{f}: not an evaluate results file (missing {', '.join(missing)})")
        fio.check_column_types(f, t.schema, {c: "text" if pa.types.is_string(RESULT_SCHEMA.field(c).type) else "numbers"
                                             for c in need + ("budget", "context_tokens")})
    rows = [r for t in tables for r in t.to_pylist()]
    if not rows:
        raise InputError(f"{path}: no result rows")
    for i, r in enumerate(rows):
        empty = [c for c in need if c != "score" and r[c] is None and not (c == "compression_ratio" and r.get("budget") is not None)]
        if empty:
            raise InputError(f"{path}: result row {i} (id {r['id']!r}) has no {empty[0]}")
    for r in rows:
        r["method"] = method_name(r)
        r["ratio"] = setting_ratio(r)
    return rows


def setting_ratio(row: dict) -> float:
    """The compression ratio a row was asked for, rounded to 4 places: its ``compression_ratio``, or in
    budget mode the nominal ``1 - min(round(budget), N) / N`` of its context (a sampled policy's
    effective ratio follows its random kept count, which would pair it with no other method)."""
    b, n = row.get("budget"), row.get("context_tokens")
    if row["policy"] == "none" or b is None or not n:
        return round(float(row["compression_ratio"]), 4)
    return round(budget_ratio(b, n), 4)


def summary(rows: list[dict]) -> list[dict]:
    """Per (task, metric, method, ratio) means (see the module docstring)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["task"], r["metric"], r["method"], r["ratio"]), []).append(r)
    out = []
    for (task, metric, method, ratio), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][3] > 0, kv[0][2], kv[0][3])):
        mean = lambda k: float(np.mean([x[k] for x in g if x.get(k) is not None])) if any(x.get(k) is not None for x in g) else float("nan")  # noqa: E731
        out.append({"task": task, "metric": metric, "method": method, "compression_ratio": ratio, "n": len(g),
                    "score": mean("score"), "ce_delta": mean("ce_delta"), "physical_bytes": mean("physical_bytes"),
                    "nominal_bytes": mean("nominal_bytes"), "dense_bytes": mean("dense_bytes"),
                    "physical_share": mean("physical_bytes") / mean("dense_bytes") if mean("dense_bytes") else float("nan"),
                    "prefill_s": mean("prefill_s"), "scoring_s": mean("scoring_s"), "decode_s": mean("decode_s")})
    return out


def paired(rows: list[dict], n_boot: int = 2000, seed: int = 0) -> list[dict]:
    """Every two non-none methods per metric, over their shared (task, ratio, example) triples."""
    by: dict = {}
    for r in rows:
        if r["method"] != "none":
            by.setdefault(r["metric"], {}).setdefault(r["method"], {})[(r["task"], r["ratio"], r["id"])] = r
    out = []
    for metric, methods in sorted(by.items()):
        for ma, mb in itertools.combinations(sorted(methods), 2):
            keys = sorted(set(methods[ma]) & set(methods[mb]))
            if not keys:
                continue
            a = np.array([methods[ma][k]["score"] for k in keys], dtype=float)
            b = np.array([methods[mb][k]["score"] for k in keys], dtype=float)
            pa_ = np.array([methods[ma][k]["physical_bytes"] for k in keys], dtype=float)
            pb_ = np.array([methods[mb][k]["physical_bytes"] for k in keys], dtype=float)
            c = paired_comparison(a, b, higher_is_better=higher_is_better(metric), n_boot=n_boot, seed=seed)
            out.append({"metric": metric, "method_a": ma, "method_b": mb, "n": c.n, "wins": c.wins,
                        "losses": c.losses, "ties": c.ties, "sign_test_p": c.pvalue, "mean_diff": c.mean_diff,
                        "ci_lo": c.lo, "ci_hi": c.hi, "bytes_ratio": float(pa_.mean() / pb_.mean()),
                        "note": c.note})
    return out


def _write_csv(records: list[dict], path: Path) -> None:
    if not records:
        return
    cols = list(records[0])
    with fio.atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(",".join(cols) + "\n")
            for r in records:
                f.write(",".join(_cell(r[c]) for c in cols) + "\n")


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if np.isnan(v) else f"{v:.6g}"
    s = str(v)
    return f'"{s}"' if "," in s else s


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def score_figure(task: str, records: list[dict]) -> Figure:
    """Mean score against mean physical bytes (KiB), one line per method over its ratios."""
    fig = Figure(figsize=(5.0, 3.4), dpi=150)
    ax = fig.add_subplot(1, 1, 1)
    methods = sorted({r["method"] for r in records})
    for m in methods:
        pts = sorted((r["physical_bytes"] / 1024, r["score"]) for r in records if r["method"] == m)
        xs, ys = zip(*pts)
        if m == "none":
            ax.plot(xs, ys, "k*", markersize=9, label=m)
        else:
            ax.plot(xs, ys, "o-", markersize=3, linewidth=1, label=m)
    metric = records[0]["metric"]
    ax.set_xlabel("physical cache bytes after eviction (KiB)")
    ax.set_ylabel("cross-entropy (nats/token)" if metric == "ce_nats" else f"score ({metric})")
    ax.set_title(task, fontsize=9)
    ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    return fig


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "—"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _markdown(summ: list[dict], pairs: list[dict], figures: list[Path], source: Path) -> str:
    lines = ["# Evaluate report", "", f"Results: `{source}`", ""]
    for task in sorted({r["task"] for r in summ}):
        recs = [r for r in summ if r["task"] == task]
        ratios = sorted({r["compression_ratio"] for r in recs if r["method"] != "none"})
        metric = recs[0]["metric"]
        lines += [f"## {task} ({metric}, mean over {max(r['n'] for r in recs)} examples)", "",
                  "| method | " + " | ".join(f"r={x:g}" for x in ratios) + " | physical share |",
                  "|---|" + "---|" * (len(ratios) + 1)]
        none = [r for r in recs if r["method"] == "none"]
        if none:
            lines.append(f"| none (full cache) | {_fmt(none[0]['score'])}" + " |" * len(ratios) + " 1.000 |")
        for m in sorted({r["method"] for r in recs} - {"none"}):
            cells = {r["compression_ratio"]: r for r in recs if r["method"] == m}
            share = " / ".join(_fmt(cells[x]["physical_share"]) for x in ratios if x in cells)
            lines.append(f"| {m} | " + " | ".join(_fmt(cells[x]["score"]) if x in cells else "—" for x in ratios)
                         + f" | {share} |")
        lines.append("")
    if pairs:
        lines += ["## Paired comparisons at matched physical bytes", "",
                  "Over the (task, ratio, example) triples both methods ran; wins = a better than b; "
                  "sign test two-sided; 95% bootstrap interval of the mean difference (positive favours a).", "",
                  "| metric | a | b | n | wins | losses | ties | sign p | mean diff [95% CI] | bytes a/b |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p in pairs:
            lines.append(f"| {p['metric']} | {p['method_a']} | {p['method_b']} | {p['n']} | {p['wins']} | "
                         f"{p['losses']} | {p['ties']} | {_fmt(p['sign_test_p'], 3)} | {_fmt(p['mean_diff'])} "
                         f"[{_fmt(p['ci_lo'])}, {_fmt(p['ci_hi'])}] | {_fmt(p['bytes_ratio'], 4)} |")
        lines.append("")
    if figures:
        lines += ["## Score against physical bytes", ""] + [f"![{f.stem}]({f.name})" for f in figures] + [""]
    return "\n".join(lines)


REPORT_FILES = ("summary.csv", "paired.csv", "paired.parquet", "report.md")  # and score_vs_bytes-<task>.png


def write_report(results, out_dir, n_boot: int = 2000, seed: int = 0) -> Path:
    """Write the report of a results file (or an evaluate output directory) into ``out_dir``;
    return the path of ``report.md``."""
    rows = _rows(results)
    out_dir = Path(out_dir)
    summ, pairs = summary(rows), paired(rows, n_boot=n_boot, seed=seed)
    src = Path(results)
    if src.is_dir():
        src = src / "results.parquet" if (src / "results.parquet").is_file() else src / ".results.parquet.parts (partial)"
    # staged: the files of an earlier report (its pairs, its tasks' figures) never stay beside this one's
    owned = REPORT_FILES + tuple(p.name for p in out_dir.glob("score_vs_bytes-*.png"))
    with fio.staged_outputs(out_dir, owned=owned) as stage:
        _write_csv(summ, stage / "summary.csv")
        _write_csv(pairs, stage / "paired.csv")
        if pairs:
            fio.write_table_atomic(pa.Table.from_pylist(pairs), stage / "paired.parquet")
        figures = []
        for task in sorted({r["task"] for r in summ}):
            fig = score_figure(task, [r for r in summ if r["task"] == task])
            name = f"score_vs_bytes-{slug(task)}.png"
            fig.savefig(stage / name, format="png")
            figures.append(out_dir / name)
        (stage / "report.md").write_text(_markdown(summ, pairs, figures, src))
    return out_dir / "report.md"
