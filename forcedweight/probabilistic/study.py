"""Bias–variance study of probabilistic eviction on real attention trajectories (paper 000, §6, App. F).

A trajectory is one (text, layer, KV head) of an all-positions dump: the attention of every query row
t' = 0..L-1 of each query head of the group over the entries 0..t', and the group's values (and keys).
At an eviction position t the cache holds the n = t + 1 entries 0..t; each method keeps some of them:

- ``topk``: the round((1 - r) n) entries of largest proposal probability (ties: lower index first);
- ``sampled``: m draws from the proposal (m from Algorithm 2 for j* = (1 - r) n), the unique entries
  kept, no correction (the kept logits renormalised, as deployed methods do);
- ``corrected``: the same draws with the logit bias ``log(c_i / (m pi_i)) / tau``.

Every later row t' > t attends over the kept pre-t entries plus every entry written after t, exactly;
the error is ``||o_evicted - o_dense||_2`` against the row's dense output. Under GQA the query heads of
a KV group share one cache, so they share one proposal (the mixture of their proposals), one kept set
and one bias; the error is measured for each query head.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from forcedweight.core.operator import top_s
from forcedweight.dump import builtin_texts, dump_rows
from forcedweight.errors import InputError, check_seed
from forcedweight.io import check_dump_complete, list_parquet_files, output_lock, progress as progress_bar, read_guard, staged_outputs
from forcedweight.probabilistic import study_outputs as so
from forcedweight.probabilistic.correction import corrected_output, correction_bias
from forcedweight.probabilistic.proposals import PROPOSALS, gqa_mixture, make_proposal
from forcedweight.probabilistic.sampling import expected_unique, global_sample_count, sample, sample_count
from forcedweight.rows import iter_batches, read_table

DEFAULT_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_TAUS = (1.0, 2.0, 3.0, 4.0, 5.0)


@dataclass
class Trajectory:
    """One KV group's trajectory.

    Attributes
    ----------
    text_id, layer, kv_head : int
    heads : list[int], the G query heads of the group.
    attn : ndarray (G, L, L) float64, ``attn[g, t', i]`` = weight of row t' on entry i (0 for i > t').
    values : ndarray (L, d_v) float64.
    keys : ndarray (L, d_k) float64 or None.
    """

    text_id: int
    layer: int
    kv_head: int
    heads: list[int]
    attn: np.ndarray
    values: np.ndarray
    keys: np.ndarray | None = None

    @property
    def length(self) -> int:
        return int(self.attn.shape[1])


def _unique(values) -> tuple:
    """``values`` as a tuple, repeated entries dropped (first occurrence kept, order kept)."""
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class StudyConfig:
    """Options of the study (see :func:`run_study`), validated on construction (``InputError``).

    Attributes
    ----------
    compression_ratios : evicted fractions r in (0, 1) (paper 000's r; CLI ``--ratios``); each
        method keeps ``round((1 - r) n)`` of the n entries (in expectation for the sampled ones).
    taus : correction temperatures > 0 (``--taus``); τ = ∞ ("sampled", uncorrected) is always run,
        so an ``inf`` given here is dropped (``--taus inf`` runs top-k and sampled only).
    seeds : sampling repetitions per setting (>= 1).
    proposals : names from ``PROPOSALS``.
    evict_at : eviction positions as fractions of each text's length, in (0, 1).
    temperature, mix : proposal temperature (> 0) and uniform mixing weight in [0, 1].
    snapkv_window, snapkv_kernel, sinks, streaming_floor : the proposals' parameters.
    share_gqa : one proposal per KV group (True) or per query head.
    seed : base seed of the sampling.

    Repeated values in the tuples are dropped (a repeated ratio would only repeat records).
    """

    compression_ratios: tuple[float, ...] = DEFAULT_RATIOS
    taus: tuple[float, ...] = DEFAULT_TAUS
    seeds: int = 8
    proposals: tuple[str, ...] = PROPOSALS
    evict_at: tuple[float, ...] = (0.5,)
    temperature: float = 1.0
    mix: float = 0.0
    snapkv_window: int = 8
    snapkv_kernel: int = 5
    sinks: int = 4
    streaming_floor: float = 0.01
    share_gqa: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("compression_ratios", "taus", "proposals", "evict_at"):
            object.__setattr__(self, name, _unique(getattr(self, name)))
        # τ = ∞ is the uncorrected "sampled" method, always run: an explicit inf adds nothing more
        object.__setattr__(self, "taus", tuple(float(t) for t in self.taus if not t == float("inf")))
        if not self.compression_ratios or any(not (0 < r < 1) for r in self.compression_ratios):
            raise InputError(f"--ratios: every ratio must lie in (0, 1), got {list(self.compression_ratios)}")
        if any(not (t > 0) for t in self.taus):
            raise InputError(f"--taus: every tau must be > 0, got {list(self.taus)}")
        if self.seeds < 1:
            raise InputError(f"--seeds must be >= 1, got {self.seeds}")
        check_seed(self.seed)
        bad = [p for p in self.proposals if p not in PROPOSALS]
        if bad or not self.proposals:
            raise InputError(f"--proposal: unknown {bad or 'none given'} (choose from {', '.join(PROPOSALS)})")
        if not self.evict_at or any(not (0 < f < 1) for f in self.evict_at):
            raise InputError(f"--evict-at: fractions of the length in (0, 1), got {list(self.evict_at)}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"--temperature must be finite and > 0, got {self.temperature}")
        if not 0.0 <= self.mix <= 1.0:
            raise InputError(f"--mix must lie in [0, 1], got {self.mix}")
        if self.snapkv_window < 1 or self.snapkv_kernel < 1:
            raise InputError(f"snapkv window and kernel must be >= 1, got {self.snapkv_window}, {self.snapkv_kernel}")
        if self.sinks < 0:
            raise InputError(f"sinks must be >= 0, got {self.sinks}")
        if not (math.isfinite(self.streaming_floor) and self.streaming_floor >= 0):
            raise InputError(f"streaming floor must be finite and >= 0, got {self.streaming_floor}")


# ----------------------------------------------------------------------------------------------- loading
_META = ["text_id", "layer", "head", "kv_head", "query_pos"]


def _read_values(file: Path, trajs: dict[tuple, Trajectory]) -> None:
    """Fill values (and keys) of each trajectory from its last row only (a filtered read)."""
    lengths = {(k[0], k[1]): tr.length for k, tr in trajs.items()}
    filters = [[("text_id", "=", int(t)), ("layer", "=", int(l)), ("query_pos", "=", int(L - 1))]
               for (t, l), L in lengths.items()]
    names = pq.ParquetFile(file).schema_arrow.names
    cols = [c for c in _META + ["values", "value_dim", "keys"] if c in names]
    with read_guard(file):
        table = pq.read_table(file, columns=cols, filters=filters)
    meta = {c: table.column(c).to_numpy().astype(np.int64) for c in _META + ["value_dim"]}
    for i in range(table.num_rows):
        tr = trajs[(meta["text_id"][i], meta["layer"][i], meta["kv_head"][i])]
        if tr.values.size:
            continue
        n = tr.length
        vals = table.column("values")[i]
        if not vals.is_valid or len(vals) != n * meta["value_dim"][i]:
            raise InputError(f"{file}: text {tr.text_id} layer {tr.layer} query_pos {n - 1}: values of wrong length")
        tr.values = vals.values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(n, -1)
        if "keys" in cols and table.column("keys")[i].is_valid:
            keys = table.column("keys")[i].values.to_numpy(zero_copy_only=False)
            tr.keys = keys.astype(np.float64).reshape(n, -1)


def load_trajectories(rows: str | Path) -> list[Trajectory]:
    """Group an all-positions dump (``dump --all-positions``, ``--with-keys`` for K-norm) into trajectories.

    Position 0 (whose row is the single weight 1 on entry 0) may be absent, as ``dump`` skips it.
    Raises InputError when provenance columns are missing or a (text, layer, head) lacks a position.
    """
    files = list_parquet_files(rows)  # a dump's texts/stats sidecars are skipped there
    metas = [read_table(f, columns=_META) for f in files]
    for f, meta in zip(files, metas):
        missing = [c for c in _META if c not in meta.column_names]
        if missing:
            raise InputError(f"{f}: rows lack provenance column(s) {', '.join(missing)}")
    groups: dict[tuple, dict] = {}
    for meta in metas:
        cols = {c: meta.column(c).to_numpy(zero_copy_only=False).astype(np.int64) for c in _META}
        for i in range(meta.num_rows):
            key = (cols["text_id"][i], cols["layer"][i], cols["kv_head"][i])
            g = groups.setdefault(key, {})
            g.setdefault(cols["head"][i], set()).add(cols["query_pos"][i])
    trajs: dict[tuple, Trajectory] = {}
    for key, g in groups.items():
        length = 1 + max(max(p) for p in g.values())
        for h, pos in g.items():
            if len(pos - {0}) != length - 1:
                raise InputError(
                    f"{rows}: text {key[0]} layer {key[1]} head {h} has {len(pos - {0})} of the {length - 1} "
                    "query positions 1..L-1; the study needs a dump with --all-positions"
                )
        heads = sorted(int(h) for h in g)
        attn = np.zeros((len(heads), length, length))
        attn[:, 0, 0] = 1.0  # row 0 sees entry 0 only
        trajs[key] = Trajectory(int(key[0]), int(key[1]), int(key[2]), heads, attn, np.zeros((0, 0)))
    for file in files:
        for _, _, batch in iter_batches(file, columns=_META + ["weights"], required=_META + ["weights"]):
            meta_cols = {c: batch.column(c).to_numpy(zero_copy_only=False).astype(np.int64) for c in _META}
            w_arr = batch.column("weights")
            w_off = w_arr.offsets.to_numpy()
            w_flat = w_arr.values.to_numpy(zero_copy_only=False).astype(np.float64)
            for i in range(batch.num_rows):
                key = (meta_cols["text_id"][i], meta_cols["layer"][i], meta_cols["kv_head"][i])
                tr = trajs[key]
                pos, head = int(meta_cols["query_pos"][i]), int(meta_cols["head"][i])
                if not w_arr[i].is_valid:
                    raise InputError(f"{file}: text {key[0]} layer {key[1]} head {head} query_pos {pos}: null weights")
                w = w_flat[w_off[i] : w_off[i + 1]]
                where = f"{file}: text {key[0]} layer {key[1]} head {head} query_pos {pos}"
                if w.size != pos + 1:
                    raise InputError(f"{where}: {w.size} weights, expected {pos + 1}")
                if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
                    raise InputError(f"{where}: weights are not a distribution (NaN/inf, negative or all zero)")
                tr.attn[tr.heads.index(head), pos, : pos + 1] = w / w.sum()
        _read_values(file, trajs)
    out = [trajs[k] for k in sorted(trajs)]
    for tr in out:
        if tr.values.size == 0:
            raise InputError(f"{rows}: text {tr.text_id} layer {tr.layer} kv head {tr.kv_head}: no values found")
        if not np.all(np.isfinite(tr.values)) or (tr.keys is not None and not np.all(np.isfinite(tr.keys))):
            raise InputError(f"{rows}: text {tr.text_id} layer {tr.layer}: values or keys contain NaN or inf")
    return out


# ----------------------------------------------------------------------------------------------- methods
def group_proposal(tr: Trajectory, t: int, name: str, cfg: StudyConfig, target: float) -> np.ndarray:
    """The proposal of the group at eviction position t over its n = t + 1 entries, shape (n,)."""
    n = t + 1
    keys = None if tr.keys is None else tr.keys[:n]
    recent = max(0, int(round(target)) - cfg.sinks)
    pis = [
        make_proposal(name, tr.attn[g, :n, :n], keys, cfg.temperature, cfg.mix, cfg.snapkv_window,
                      cfg.snapkv_kernel, cfg.sinks, recent, cfg.streaming_floor)
        for g in range(len(tr.heads))
    ]
    return gqa_mixture(np.stack(pis))


def topk_set(pi: np.ndarray, k: int) -> np.ndarray:
    """The k entries of largest probability (ties: lower index first, ``operator.top_s``), sorted (k,)."""
    return top_s(pi, k)


def _stats(outs: np.ndarray, dense: np.ndarray, deterministic: bool = False) -> dict:
    """Error statistics of outputs (S, Q, d) against dense (Q, d) over S seeds.

    ``error``/``rel_error``/``mse``: mean over seeds and rows of ‖out − dense‖ (relative) and its
    square. ``variance``: the unbiased per-row variance over seeds, Σ_s ‖out_s − mean‖² / (S − 1);
    ``bias2``: the unbiased squared bias ‖mean − dense‖² − variance / S (the plain squared error of the
    mean includes variance / S; this estimate may be slightly negative when the bias is ~0). Then
    ``mse = bias2 + variance`` exactly, both averaged over rows. ``deterministic`` outputs (top-k, S = 1)
    have variance 0; random outputs with S = 1 give NaN for both (nothing to split them with).
    """
    err = np.linalg.norm(outs - dense, axis=-1)  # (S, Q)
    scale = np.maximum(np.linalg.norm(dense, axis=-1), 1e-30)
    S = outs.shape[0]
    mean = outs.mean(axis=0)
    plug = np.sum((mean - dense) ** 2, axis=-1)  # (Q,)
    if deterministic:
        bias2, var = plug, np.zeros_like(plug)
    elif S < 2:
        bias2 = var = np.full_like(plug, np.nan)
    else:
        var = np.sum(np.sum((outs - mean) ** 2, axis=-1), axis=0) / (S - 1)
        bias2 = plug - var / S
    return dict(error=float(err.mean()), rel_error=float((err / scale).mean()), mse=float((err**2).mean()),
                bias2=float(bias2.mean()), variance=float(var.mean()))


def split_heads(tr: Trajectory) -> list[Trajectory]:
    """One single-head trajectory per query head (each head with its own proposal and kept set)."""
    return [Trajectory(tr.text_id, tr.layer, tr.kv_head, [h], tr.attn[g : g + 1], tr.values, tr.keys)
            for g, h in enumerate(tr.heads)]


def draw_rng(cfg: StudyConfig, repetition: int, ident: tuple, ratio: float, proposal: str) -> np.random.Generator:
    """The generator of one repetition's draw: seeded by ``cfg.seed``, the repetition, ``ident`` (where
    the draw is: text, layer, KV group, first head, position), the ratio's value and the proposal's
    name, so a setting's draws do not depend on which other ratios or proposals the study runs, and
    heads studied one by one (``share_gqa=False``) draw apart."""
    return np.random.default_rng([int(cfg.seed), int(repetition), *(int(x) for x in ident),
                                  int(round(1e6 * float(ratio))), zlib.crc32(proposal.encode())])


def study_trajectory(tr: Trajectory, cfg: StudyConfig) -> list[dict]:
    """All methods, ratios, proposals and taus on one trajectory; one record per query head and setting."""
    if not cfg.share_gqa and len(tr.heads) > 1:
        return [rec for one in split_heads(tr) for rec in study_trajectory(one, cfg)]
    records: list[dict] = []
    L = tr.length
    for t in sorted({min(L - 2, max(0, int(f * L))) for f in cfg.evict_at}):
        if t < 0 or L - t - 1 < 1:
            continue
        n = t + 1
        with np.errstate(divide="ignore"):
            logw = np.log(tr.attn[:, t + 1 :, :])  # (G, Q, L): -inf where a row cannot see
        pre, post = logw[..., :n], logw[..., n:]
        G, Q = logw.shape[0], logw.shape[1]
        pre_all, post_all = pre.reshape(G * Q, n), post.reshape(G * Q, L - n)
        dense = tr.attn[:, t + 1 :, :] @ tr.values  # (G, Q, d)
        vpre, vpost = tr.values[:n], tr.values[n:]
        for name in cfg.proposals:
            if name == "knorm" and tr.keys is None:
                raise InputError("proposal knorm needs keys: dump with --with-keys")
            fixed = None if name == "streaming" else group_proposal(tr, t, name, cfg, 0.0)
            for r in cfg.compression_ratios:  # r = evicted fraction
                target = (1.0 - r) * n
                pi = fixed if fixed is not None else group_proposal(tr, t, name, cfg, target)
                base = dict(text_id=tr.text_id, layer=tr.layer, kv_head=tr.kv_head, evict_pos=t, n_pre=n,
                            n_later=L - t - 1, proposal=name, ratio=r)
                k = max(1, int(round(target)))
                kept = topk_set(pi, k)
                top = corrected_output(pre_all, vpre, kept, None, post_all, vpost).reshape(dense.shape)
                for g, h in enumerate(tr.heads):
                    out = top[g][None]
                    records.append(dict(base, head=h, method="topk", tau=None, m=None, kept=float(k),
                                        status="ok", **_stats(out, dense[g], deterministic=True)))
                try:
                    m = sample_count(pi, target)
                except InputError as exc:
                    for g, h in enumerate(tr.heads):
                        for method in ("sampled", "corrected"):
                            records.append(dict(base, head=h, method=method, tau=None, m=None, kept=None,
                                                status=f"unreachable: {exc}"))
                    continue
                taus = [float("inf")] + [float(x) for x in cfg.taus]
                outs = np.zeros((len(taus), len(tr.heads), cfg.seeds) + dense.shape[1:])
                n_kept = []
                for s in range(cfg.seeds):
                    rng = draw_rng(cfg, s, (tr.text_id, tr.layer, tr.kv_head, tr.heads[0], t), r, name)
                    kept_s, counts = sample(pi, m, rng)
                    n_kept.append(kept_s.size)
                    for ti, tau in enumerate(taus):
                        b = correction_bias(counts, pi[kept_s], m, tau)
                        o = corrected_output(pre_all, vpre, kept_s, b, post_all, vpost)  # all heads at once
                        outs[ti, :, s] = o.reshape(outs.shape[1], outs.shape[3], outs.shape[4])
                for ti, tau in enumerate(taus):
                    method = "sampled" if np.isinf(tau) else "corrected"
                    for g, h in enumerate(tr.heads):
                        records.append(dict(base, head=h, method=method, tau=None if np.isinf(tau) else tau,
                                            m=float(m), kept=float(np.mean(n_kept)), status="ok",
                                            **_stats(outs[ti, g], dense[g])))
    return records


def compression_table(trajs: list[Trajectory], cfg: StudyConfig) -> list[dict]:
    """Paper 000 Table 1: target ratio versus the compression achieved by one global m.

    For each text and eviction position, the proposals of every (layer, KV group) share one m
    (:func:`global_sample_count`); each seed draws every group once. One record per
    (text, position, proposal, ratio, seed) with the effective ratio ``mean_g (1 - k_g / n)`` and its
    spread over groups (layerwise compression is uneven).
    """
    by_text: dict[int, list[Trajectory]] = {}
    for tr in trajs:
        by_text.setdefault(tr.text_id, []).append(tr)
    out = []
    for text_id, group in sorted(by_text.items()):
        L = min(tr.length for tr in group)
        for t in sorted({min(L - 2, max(0, int(f * L))) for f in cfg.evict_at}):
            n = t + 1
            for name in cfg.proposals:
                if name == "knorm" and any(tr.keys is None for tr in group):
                    continue
                fixed = None if name == "streaming" else [group_proposal(tr, t, name, cfg, 0.0) for tr in group]
                for r in cfg.compression_ratios:  # r = evicted fraction
                    pis = fixed or [group_proposal(tr, t, name, cfg, (1 - r) * n) for tr in group]
                    base = dict(text_id=text_id, evict_pos=t, n_pre=n, proposal=name, target_ratio=r,
                                groups=len(pis))
                    try:
                        m = global_sample_count(pis, r)
                    except InputError as exc:
                        out.append(dict(base, status=f"unreachable: {exc}"))
                        continue
                    expected = 1 - float(np.mean([expected_unique(p, m) for p in pis])) / n
                    for s in range(cfg.seeds):
                        rng = draw_rng(cfg, s, (text_id, t, 7), r, name)  # (7: apart from the trajectories' draws)
                        ratios = np.array([1 - sample(p, m, rng)[0].size / n for p in pis])
                        out.append(dict(base, seed=s, m=m, expected_ratio=expected,
                                        effective_ratio=float(ratios.mean()), group_ratio_min=float(ratios.min()),
                                        group_ratio_max=float(ratios.max()), status="ok"))
    return out


# ----------------------------------------------------------------------------------------------- driver
RECORD_SCHEMA = {
    "text_id": "Int64", "layer": "Int64", "head": "Int64", "kv_head": "Int64", "evict_pos": "Int64",
    "n_pre": "Int64", "n_later": "Int64", "proposal": "Utf8", "ratio": "Float64", "method": "Utf8",
    "tau": "Float64", "m": "Float64", "kept": "Float64", "status": "Utf8", "error": "Float64",
    "rel_error": "Float64", "mse": "Float64", "bias2": "Float64", "variance": "Float64",
}


def _frame(records: list[dict], schema: dict[str, str]):
    types = {k: getattr(pl, v) for k, v in schema.items()}
    cols = {k: [r.get(k) for r in records] for k in schema}
    return pl.DataFrame(cols, schema=types)


#: every name the study writes into its output directory (a rerun replaces all of them at once)
STUDY_OUTPUTS = tuple(f"{stem}.{ext}" for stem in ("records", "summary", "compression_draws", "compression")
                      for ext in ("parquet", "csv")) + tuple(
    f"{stem}.{ext}" for stem in ("error_vs_ratio", "error_vs_tau", "bias_variance_vs_tau", "effective_compression")
    for ext in ("png", "pdf")) + ("report.md",)


def run_study(
    rows_dir: str | Path,
    out_dir: str | Path,
    cfg: StudyConfig | None = None,
    command: str = "",
    progress: bool = True,
    allow_incomplete: bool = False,
) -> Path:
    """Run the whole study on an all-positions dump and write its outputs into ``out_dir``.

    The rows of an unfinished dump (``manifest.json``: ``complete: false``) are refused unless
    ``allow_incomplete``.

    Writes ``records`` (one per text, layer, head, position, proposal, ratio, method, tau),
    ``summary`` (means per proposal, method, tau, ratio), ``compression_draws`` and ``compression``
    (Table 1) as Parquet and CSV; figures ``error_vs_ratio``, ``error_vs_tau``,
    ``bias_variance_vs_tau``, ``effective_compression`` as PNG and PDF; and ``report.md``.
    Every file is written atomically. Returns ``out_dir``.
    """
    cfg = cfg or StudyConfig()
    check_dump_complete(rows_dir, allow_incomplete)
    trajs = load_trajectories(rows_dir)
    if not trajs:
        raise InputError(f"{rows_dir}: no trajectories")
    if "knorm" in cfg.proposals and any(tr.keys is None for tr in trajs):
        raise InputError(f"{rows_dir}: proposal knorm needs keys; dump with --with-keys or drop --proposal knorm")
    short = [tr for tr in trajs if tr.length < 3]
    if short:
        raise InputError(f"{rows_dir}: text {short[0].text_id} has {short[0].length} positions; need at least 3")
    out = Path(out_dir)
    with output_lock(out, "probabilistic study"), staged_outputs(out, owned=STUDY_OUTPUTS, keep=("rows",)) as stage:
        records: list[dict] = []
        with progress_bar("probabilistic study", enabled=progress, transient=True) as bar:
            task = bar.add_task("trajectories", total=len(trajs))
            for tr in trajs:
                records += study_trajectory(tr, cfg)
                bar.advance(task)
        rec = _frame(records, RECORD_SCHEMA)
        comp = _frame(compression_table(trajs, cfg), {
            "text_id": "Int64", "evict_pos": "Int64", "n_pre": "Int64", "proposal": "Utf8",
            "target_ratio": "Float64", "groups": "Int64", "seed": "Int64", "m": "Float64",
            "expected_ratio": "Float64", "effective_ratio": "Float64", "group_ratio_min": "Float64",
            "group_ratio_max": "Float64", "status": "Utf8"})
        summary = so.summarise(rec)
        comp_summary = so.compression_summary(comp)
        so.write_frame(rec, stage, "records")
        so.write_frame(summary, stage, "summary")
        so.write_frame(comp, stage, "compression_draws")
        if comp_summary.height:
            so.write_frame(comp_summary, stage, "compression")
        so.figures(summary, comp_summary, stage)
        config_text = (
            f"compression ratios (evicted fraction) {list(cfg.compression_ratios)}, taus {list(cfg.taus)}, {cfg.seeds} seeds, proposals {list(cfg.proposals)}, "
            f"eviction at {list(cfg.evict_at)} of each text, temperature {cfg.temperature}, mix {cfg.mix}, "
            f"GQA-shared proposals: {cfg.share_gqa}."
        )
        so.write_report(stage, rec, comp_summary, command or "run_study(...)", len(trajs), config_text)
    return out


def truncate_text(text: str, max_chars: int) -> str:
    """The text cut at the last word boundary before ``max_chars`` characters (whole when shorter)."""
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    return cut[: cut.rfind(" ")] if " " in cut else cut


def dump_and_study(
    out_dir: str | Path,
    model: str | None = "smollm2",
    texts: list[str] | None = None,
    n_texts: int = 2,
    max_chars: int = 320,
    layers: str | None = "1,15,29",
    heads: str | None = None,
    cfg: StudyConfig | None = None,
    command: str = "",
    progress: bool = True,
) -> Path:
    """One command for the whole study: dump every position (with keys) of a few layers of ``model`` over
    the first ``n_texts`` built-in texts (each cut to ``max_chars`` characters) into ``out_dir/rows``,
    then :func:`run_study` into ``out_dir``. Rerunning resumes the dump."""
    cfg = cfg or StudyConfig()
    if n_texts < 1:
        raise InputError(f"--texts: must be >= 1, got {n_texts}")
    if max_chars < 16:
        raise InputError(f"--max-chars: must be >= 16, got {max_chars}")
    chosen = [truncate_text(t, max_chars) for t in (texts or builtin_texts())[:n_texts]]
    rows = Path(out_dir) / "rows"
    with output_lock(out_dir, "probabilistic study"):
        dump_rows(model, chosen, rows, layers=layers, heads=heads, all_positions=True, with_keys=True,
                  progress=progress)
        return run_study(rows, out_dir, cfg, command=command, progress=progress)
