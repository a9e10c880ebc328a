"""The end-of-run screen (``format_summary``) and summary.json's best evaluation, hand-worked."""

from __future__ import annotations

from workflows.driver import _best_eval, _interval
from cli.run import format_summary


def _summary(**extra: object) -> dict:
    return {
        "run_dir": "/runs/tiny-cpu", "config": "configs/tiny-cpu.yaml", "config_digest": "abc123",
        "accuracy_before": 0.30, "accuracy_after": 0.52, "pass_at_k_before": 0.5, "pass_at_k_after": 0.7,
        "eval_k": 4, "eval_problems": 1000, "steps": 60, "steps_done": 60, "wall_seconds": 500.0,
        "step_seconds": [5.0, 7.0], "final_checkpoint": "/runs/tiny-cpu/checkpoints/step-0060", **extra,
    }


def test_screen_shows_before_after_and_change_intervals() -> None:
    text = format_summary(_summary(accuracy_before_ci95=[0.28, 0.32], accuracy_after_ci95=[0.495, 0.545],
                                   accuracy_change_ci95=[0.19, 0.25], accuracy_best=0.52, accuracy_best_step=60))
    assert "30.0% [28.0%, 32.0%] -> 52.0% [49.5%, 54.5%]" in text
    assert "+22.0 points (paired over problems: +19.0 to +25.0)" in text
    assert "best evaluation" not in text  # the final evaluation is the best one
    assert "step mean 6.0 s" in text


def test_screen_names_a_best_evaluation_before_the_last() -> None:
    text = format_summary(_summary(accuracy_best=0.55, accuracy_best_step=30))
    assert "best evaluation: 55.0% at step 30" in text
    # a summary without intervals (an older run folder) still prints, without brackets
    assert "30.0% -> 52.0%" in text and "paired" not in text


def test_best_eval_and_interval_hand_worked() -> None:
    evals = [{"step": 0, "avg_at_k": 0.3, "avg_at_k_ci95_half": 0.02}, {"step": 30, "avg_at_k": 0.55},
             {"step": 45, "avg_at_k": 0.55}, {"step": 60, "avg_at_k": 0.5}]
    assert _best_eval(evals) == {"accuracy_best": 0.55, "accuracy_best_step": 30}  # first of a tie
    low, high = _interval(evals[0])
    assert abs(low - 0.28) < 1e-12 and abs(high - 0.32) < 1e-12
    assert _interval(evals[1]) is None
