"""RULER's scoring rules, case-insensitive, per example in [0, 1].

- ``string_match_all``: share of the reference strings found in the prediction (niah, vt, cwe, fwe);
- ``string_match_part``: 1 when any reference string is found (RULER's qa tasks).

RULER reports the mean over examples times 100; here each example's score is kept in [0, 1].
Continuation examples are scored by cross-entropy instead (``metric_for_task``: ``"ce_nats"``,
nats per token, lower is better).
"""

from __future__ import annotations

from typing import Sequence

CONTINUATION_TASK = "continuation"
METRICS = ("string_match_all", "string_match_part", "ce_nats")


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Share of ``references`` occurring in ``prediction`` (case-insensitive); 0 when there are none."""
    refs = [str(r) for r in references]
    if not refs:
        return 0.0
    pred = prediction.lower()
    return sum(1.0 for r in refs if r.lower() in pred) / len(refs)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 when any of ``references`` occurs in ``prediction`` (case-insensitive), else 0.0."""
    pred = prediction.lower()
    return 1.0 if any(str(r).lower() in pred for r in references) else 0.0


def metric_for_task(task: str) -> str:
    """The metric of a task name: ``ce_nats`` for continuation, ``string_match_part`` for RULER's qa
    tasks (names starting with ``qa``), ``string_match_all`` otherwise."""
    task = str(task or "")
    if task == CONTINUATION_TASK:
        return "ce_nats"
    if task.startswith("qa"):
        return "string_match_part"
    return "string_match_all"


def higher_is_better(metric: str) -> bool:
    return metric != "ce_nats"


def score_answer(task: str, prediction: str, references: Sequence[str]) -> float:
    """The RULER score of one generated answer (string metrics only)."""
    metric = metric_for_task(task)
    if metric == "string_match_part":
        return string_match_part(prediction, references)
    return string_match_all(prediction, references)
