"""The scalar names trackers show: every numeric StepMetrics column under ``<group>/<column>``, and
each evaluation's avg@k, pass@k, maj@k and 95% interval under ``eval/<name>``; and each evaluation
as one line of text (:func:`eval_text`), which no chart smoothing changes.

Names keep the schema's column names (schemas/models.py documents each and declares its group),
grouped so a tracker's UI shows one panel per concern. Missing values (a skipped step has no loss;
NaN reads back as None from the shard) are left out rather than logged as NaN, which some trackers
refuse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from schemas.models import STEP_KEY
from schemas.step_stats import STEP_FIELDS, StepField

# column -> group, for every StepMetrics statistic, as schemas/models.py declares it (its ``group``);
# the key columns (``step``: the x axis; the checkpoint ids) are no scalars.
def step_groups(fields: tuple[StepField, ...]) -> dict[str, str]:
    """``{column: group}`` of every statistic among ``fields`` (a step record's FIELDS)."""
    return {f.name: f.group for f in fields if f.by != STEP_KEY}


STEP_GROUPS: dict[str, str] = step_groups(STEP_FIELDS)

# Evaluation summary key -> scalar name (the driver's evaluation dicts, engines/evaluate/stage.py: EvalSummary).
EVAL_NAMES: dict[str, str] = {
    "avg_at_k": "eval/avg_at_k",
    "pass_at_k": "eval/pass_at_k",
    "maj_at_k": "eval/maj_at_k",
    "avg_at_k_ci95_half": "eval/avg_at_k_ci95_half",
    "problems": "eval/problems",
    "k": "eval/k",
    "verdict_timeouts": "eval/verdict_timeouts",
    "verdict_errors": "eval/verdict_errors",
    "seconds": "eval/seconds",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def step_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """``{"train/loss": ..., "rollout/accuracy": ...}`` for one StepMetrics row; missing/NaN left out."""
    out = {}
    for column, group in STEP_GROUPS.items():
        value = _number(row.get(column))
        if value is not None:
            out[f"{group}/{column}"] = value
    return out


def eval_scalars(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """``{"eval/avg_at_k": ..., ...}`` for one evaluation summary; missing/NaN left out."""
    out = {}
    for key, name in EVAL_NAMES.items():
        value = _number(evaluation.get(key))
        if value is not None:
            out[name] = value
    return out


def _percent(scalars: Mapping[str, float], name: str) -> str:
    value = scalars.get(name)
    return "n/a" if value is None else f"{value:.1%}"


def eval_text(step: int, scalars: Mapping[str, float]) -> str:
    """One held-out evaluation as a line of text (markdown), from its :func:`eval_scalars`.

    An evaluation is a handful of points (4 in the main job) on a chart whose default smoothing
    (TensorBoard's 0.6) draws the last one well below its value (47.1% for 53.4%); this line
    states the value itself.
    """
    k = scalars.get("eval/k")
    at = f"@{int(k)}" if k is not None else "@k"
    half = scalars.get("eval/avg_at_k_ci95_half")
    interval = f" (95% interval +/- {half * 100:.1f} points)" if half is not None else ""
    problems = scalars.get("eval/problems")
    return (f"step {step}: held-out avg{at} **{_percent(scalars, 'eval/avg_at_k')}**{interval}, "
            f"pass{at} {_percent(scalars, 'eval/pass_at_k')}, maj{at} {_percent(scalars, 'eval/maj_at_k')}"
            + (f", {int(problems)} problems" if problems is not None else ""))
