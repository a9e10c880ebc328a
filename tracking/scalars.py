"""The scalar names trackers show: every numeric StepMetrics column under ``<group>/<column>``, and
each evaluation's avg@k, pass@k, maj@k and 95% interval under ``eval/<name>``.

Names keep the schema's column names (schemas/models.py documents each), grouped so a tracker's
UI shows one panel per concern. Missing values (a skipped step has no loss; NaN reads back as
None from the shard) are left out rather than logged as NaN, which some trackers refuse.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# column -> group, for every numeric StepMetrics column (tests/unit/test_tracking.py checks the
# schema has no numeric column missing here). ``step`` is the x axis, not a scalar.
STEP_GROUPS: dict[str, str] = {
    **dict.fromkeys(("loss", "entropy", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl",
                     "grad_norm", "lr", "tokens", "samples", "masked_samples"), "train"),
    **dict.fromkeys(("reward_mean", "accuracy", "response_length_mean", "truncation_ratio"), "rollout"),
    **dict.fromkeys(("generation_rounds", "trained_groups", "carried_groups"), "sampling"),
    **dict.fromkeys(("max_policy_lag_steps", "policy_lag_mean", "policy_lag_max", "stale_sample_fraction",
                     "logprob_mismatch_mean_abs", "logprob_mismatch_max_abs", "logprob_mismatch_on_policy_mean_abs",
                     "logprob_mismatch_on_policy_max_abs", "behaviour_weight_mean",
                     "behaviour_weight_capped_fraction"), "off_policy"),
    **dict.fromkeys(("verdict_timeouts", "verdict_errors"), "verifier"),
    **dict.fromkeys(("time_rollout_s", "time_score_s", "time_train_s"), "time"),
}

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
