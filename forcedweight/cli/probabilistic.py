"""``forcedweight probabilistic``: the bias–variance study of probabilistic eviction (paper 000).

``study ROWS --out DIR`` runs it on an all-positions dump; ``run --out DIR`` dumps a few layers of the
embedded model first, then runs it (one command for the study's tables and figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from forcedweight.cli.options import split_list, torch_threads
from forcedweight.io import command_line

group = typer.Typer(no_args_is_help=True, help="Probabilistic eviction with importance-sampling correction (paper 000).")


def _floats(text: str, option: str) -> tuple[float, ...]:
    """A comma-separated option as numbers (``cli.options.numbers``); at least one value."""
    from forcedweight.cli.options import numbers
    from forcedweight.errors import InputError

    vals = tuple(numbers([text], option))
    if not vals:
        raise InputError(f"{option}: no values given")
    return vals


def _config(ratios, taus, seeds, proposal, evict_at, temperature, mix, share_gqa, seed):
    from forcedweight.probabilistic.study import StudyConfig

    extra = {"proposals": tuple(proposal)} if proposal else {}
    return StudyConfig(compression_ratios=_floats(ratios, "--ratios"), taus=_floats(taus, "--taus"), seeds=seeds,
                       evict_at=_floats(evict_at, "--evict-at"), temperature=temperature, mix=mix,
                       share_gqa=share_gqa, seed=seed, **extra)


RATIOS = typer.Option("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", "--ratios", help="Compression ratios r (evicted fraction), comma-separated.")
TAUS = typer.Option("1,2,3,4,5", "--taus", help="Correction temperatures τ, comma-separated (τ=∞ is 'sampled').")
SEEDS = typer.Option(8, "--seeds", help="Sampling repetitions per setting.")
PROPOSAL = typer.Option(None, "--proposal", help="h2o, snapkv, knorm, streaming, uniform (repeatable; default all).")
EVICT_AT = typer.Option("0.5", "--evict-at", help="Eviction positions as fractions of each text's length.")
TEMPERATURE = typer.Option(1.0, "--temperature", help="Proposal temperature T (pi ∝ score^(1/T)).")
MIX = typer.Option(0.0, "--mix", help="Weight λ of the uniform distribution mixed into each proposal.")
SHARE = typer.Option(True, "--share-gqa/--per-head", help="One proposal per KV group (mixture of its heads) or per query head.")
SEED = typer.Option(0, "--seed", help="Base seed of the sampling.")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="Show a progress bar.")


@group.command("study")
def study(
    rows: Path = typer.Argument(..., help="An all-positions dump (dump --all-positions --with-keys)."),
    out: Path = typer.Option(..., "--out", help="Output directory for tables, figures and report.md."),
    ratios: str = RATIOS, taus: str = TAUS, seeds: int = SEEDS, proposal: Optional[List[str]] = PROPOSAL,
    evict_at: str = EVICT_AT, temperature: float = TEMPERATURE, mix: float = MIX, share_gqa: bool = SHARE,
    seed: int = SEED, progress: bool = PROGRESS,
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="Take the rows of an unfinished dump (manifest complete: false)."),
) -> None:
    """Top-k vs sampled vs sampled+corrected eviction error on dumped trajectories; Table 1 of paper 000."""
    from forcedweight.probabilistic.study import run_study

    cfg = _config(ratios, taus, seeds, proposal, evict_at, temperature, mix, share_gqa, seed)
    path = run_study(rows, out, cfg, command=command_line(), progress=progress,
                     allow_incomplete=allow_incomplete)
    typer.echo(str(Path(path) / "report.md"))


@group.command("run")
def run(
    out: Path = typer.Option(..., "--out", help="Output directory (the dump goes to OUT/rows)."),
    model: str = typer.Option("smollm2", "--model", help="'smollm2' (embedded default), a HF directory or a .gguf file."),
    texts: int = typer.Option(2, "--texts", help="Number of built-in texts."),
    max_chars: int = typer.Option(320, "--max-chars", help="Each text cut to this many characters."),
    layers: str = typer.Option("1,15,29", "--layers", help="Layers to dump, e.g. 0,3,5-7."),
    ratios: str = RATIOS, taus: str = TAUS, seeds: int = SEEDS, proposal: Optional[List[str]] = PROPOSAL,
    evict_at: str = EVICT_AT, temperature: float = TEMPERATURE, mix: float = MIX, share_gqa: bool = SHARE,
    seed: int = SEED, progress: bool = PROGRESS,
) -> None:
    """Dump a few layers of the model (every position, with keys), then run the study on it."""
    from forcedweight.probabilistic.study import dump_and_study

    cfg = _config(ratios, taus, seeds, proposal, evict_at, temperature, mix, share_gqa, seed)
    path = dump_and_study(out, model, n_texts=texts, max_chars=max_chars, layers=layers, cfg=cfg,
                          command=command_line(), progress=progress)
    typer.echo(str(Path(path) / "report.md"))


@group.command("robustness")
def robustness(
    tasks: Path = typer.Option(..., "--tasks", help="Task file (forcedweight tasks writes one; contexts of 1,000-4,000 tokens)."),
    out: Path = typer.Option(..., "--out", help="Output directory (runs/, tables, report.md); rerun to resume."),
    model: str = typer.Option("smollm2", "--model", help="'smollm2' (embedded default), a HF directory or a .gguf file."),
    proposal: Optional[List[str]] = typer.Option(None, "--proposal", help="h2o, snapkv, knorm, streaming, uniform, minh (repeat or comma-separate; default h2o,snapkv,knorm,streaming,minh)."),
    ratios: str = RATIOS,
    taus: str = typer.Option("1,2,3,4,5", "--taus", help="Correction temperatures τ (comma-separated; τ=inf is added unless --no-uncorrected)."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Seeds of the draws, comma-separated."),
    uncorrected: bool = typer.Option(True, "--uncorrected/--no-uncorrected", help="Also run τ=inf (sampled, no correction)."),
    topk: bool = typer.Option(True, "--topk/--no-topk", help="Also run the top-k version of every proposal."),
    scope: str = typer.Option("layer", "--scope", help="Global soft constraint: one m per 'layer' or for the whole 'model'."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Only the first N examples."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Torch threads (default: torch's)."),
    progress: bool = PROGRESS,
) -> None:
    """Sampled + corrected vs sampled vs top-k in generation over a task suite: win scores, ranks, Table 1."""
    from forcedweight.deploy.robustness import RobustnessConfig, parse_taus, run_robustness
    from forcedweight.errors import InputError

    torch_threads(threads)
    props = tuple(split_list(proposal))
    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError:
        raise InputError(f"--seeds: expected comma-separated integers, got {seeds!r}") from None
    cfg = RobustnessConfig(**({"proposals": props} if props else {}), ratios=_floats(ratios, "--ratios"),
                           taus=parse_taus([t for t in taus.split(",") if t.strip()]), seeds=seed_list,
                           uncorrected=uncorrected, topk=topk, scope=scope, max_examples=max_examples)
    typer.echo(str(run_robustness(model, tasks, out, cfg, command=command_line(), progress=progress)))


def register(app: typer.Typer) -> None:
    app.add_typer(group, name="probabilistic")
