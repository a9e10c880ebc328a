"""The run page's anomaly rules (reports/anomalies.py), each on hand-made steps."""

from __future__ import annotations

import math

from reports.anomalies import carried_only, entropy_collapse, find_anomalies, jumps, slow_steps


def _rows(column: str, values: list[float]) -> list[dict]:
    return [{"step": i + 1, column: v} for i, v in enumerate(values)]


def test_slow_steps_against_the_median_merged_into_runs() -> None:
    seconds = [2.8] * 10 + [30.0, 35.8, 9.0] + [2.8] * 5 + [12.0]
    found = slow_steps(list(range(1, len(seconds) + 1)), seconds)
    assert [(a.first_step, a.last_step) for a in found] == [(11, 13), (19, 19)]
    assert found[0].text == "steps 11-13 took up to 35.8 s, 12.8x the median step (2.8 s)"
    assert found[1].text.startswith("step 19 took up to 12.0 s, 4.3x")
    assert slow_steps([1, 2, 3, 4], [2.0, 2.5, 3.0, 5.9]) == []  # under 3x the median (2.75 s)


def test_entropy_collapse_needs_a_fall_that_stays_down() -> None:
    collapsing = [0.9, 0.8, 0.85, 0.8, 0.85, 0.5, 0.3, 0.2, 0.15, 0.1, 0.1]
    (found,) = entropy_collapse(_rows("entropy", collapsing))
    # early level = mean of the first 5 = 0.84; below 25% of it (0.21) from step 8 on
    assert (found.first_step, found.last_step) == (8, 11)
    assert "fell from 0.840 nats" in found.text and "0.200 at step 8" in found.text
    # dipping once and recovering is no collapse
    assert entropy_collapse(_rows("entropy", [0.9, 0.8, 0.85, 0.8, 0.85, 0.1, 0.7, 0.8])) == []
    assert entropy_collapse(_rows("entropy", [0.9, math.nan, 0.8])) == []  # too few steps


def test_reward_jump_against_the_typical_change() -> None:
    reward = [0.0, 0.02, 0.01, 0.03, 0.02, 0.04, 0.03, 0.05, 0.9, 0.92, 0.91]
    (found,) = jumps(_rows("reward_mean", reward), "reward_mean", "reward")
    assert found.kind == "reward jump" and found.first_step == 9
    assert found.text.startswith("reward rose from 0.05 to 0.9 at step 9")
    steady = [0.1 * (i % 3) for i in range(20)]  # noisy but regular: nothing stands out
    assert jumps(_rows("reward_mean", steady), "reward_mean", "reward") == []


def test_length_jump_names_its_unit() -> None:
    length = [100.0, 102, 101, 103, 102, 104, 103, 105, 104, 30]
    (found,) = jumps(_rows("response_length_mean", length), "response_length_mean", "response length", " tokens")
    assert found.text.startswith("response length fell from 104 tokens to 30 tokens at step 10")


def test_steps_trained_only_on_carried_groups() -> None:
    rows = [{"step": s, "generation_rounds": r, "trained_groups": g}
            for s, r, g in ((1, 2, 8), (2, 0, 8), (3, 0, 8), (4, 1, 8), (5, 0, 0), (6, 0, 3))]
    (found,) = carried_only(rows)  # one line for the run, listing the steps
    # step 5 trained nothing (skipped): not a carried-only step
    assert (found.first_step, found.last_step) == (2, 6)
    assert found.text.startswith("steps 2-3 and 6 trained only on groups carried over")
    assert carried_only(rows[:1]) == []


def test_find_anomalies_aligns_step_times_with_steps() -> None:
    rows = [{"step": s, "generation_rounds": 1, "trained_groups": 4} for s in range(1, 8)]
    found = find_anomalies(rows, [1.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0])
    assert [(a.kind, a.first_step) for a in found] == [("slow steps", 4)]


def test_wall_time_split_hand_worked() -> None:
    from reports.run import wall_split

    summary = {"wall_seconds": 440.0, "step_seconds": [100.0, 150.0, 60.0]}
    split = wall_split(summary, [{"step": 0, "seconds": 40.0}, {"step": 3, "seconds": 45.0}])
    assert (split.wall_s, split.steps_s, split.evals_s, split.rest_s) == (440.0, 310.0, 85.0, 45.0)
    # an older summary.json without evaluation times: the rest holds them, the evaluations are unknown
    split = wall_split(summary, [{"step": 0}, {"step": 3}])
    assert (split.steps_s, split.evals_s, split.rest_s) == (310.0, None, 130.0)
    assert wall_split({}, []).rest_s is None
