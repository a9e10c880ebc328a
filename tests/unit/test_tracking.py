"""Experiment tracking: every StepMetrics column and evaluation reaches TensorBoard, read back with
TensorBoard's own reader; a resume continues the same log and logs nothing twice."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

import schemas
from settings.tracking import TrackingConfig
from tests.tracking_fixtures import evaluation, step_rows
from tracking.run_tracking import open_tracking
from tracking.scalars import STEP_GROUPS, eval_scalars, step_scalars
from tracking.state import read_state


def test_every_numeric_step_metrics_column_has_a_scalar_name() -> None:
    numeric = {f.name for f in schemas.arrow_schema(schemas.StepMetrics)
               if (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)) and f.name != "step"}
    assert numeric == set(STEP_GROUPS)


def test_scalars_leave_out_missing_values(tmp_path: Path) -> None:
    skipped = step_rows(tmp_path, range(2, 3))[0]
    scalars = step_scalars(skipped)
    assert skipped["loss"] is None and "train/loss" not in scalars and "train/entropy" not in scalars
    assert scalars["rollout/accuracy"] == skipped["accuracy"] and scalars["sampling/generation_rounds"] == skipped["generation_rounds"]
    assert eval_scalars({"step": 1, "avg_at_k": 0.5, "pass_at_k": math.nan, "eval_set": "x"}) == {"eval/avg_at_k": 0.5}


def _tensorboard(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the TensorBoard folder, read with TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _expected(rows: list[dict], evals: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for step, scalars in [(r["step"], step_scalars(r)) for r in rows] + [(e["step"], eval_scalars(e)) for e in evals]:
        for name, value in scalars.items():
            out.setdefault(name, []).append((step, value))
    return {name: sorted(points) for name, points in out.items()}


def _approx(series: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    # TensorBoard stores scalars as float32: compare at that precision
    return {name: [(s, pytest.approx(v, rel=1e-6)) for s, v in sorted(points)] for name, points in series.items()}


def test_tensorboard_holds_every_step_and_evaluation_once_across_a_resume(tmp_path: Path) -> None:
    rows = step_rows(tmp_path, range(1, 6))
    evals = [evaluation(0), evaluation(3), evaluation(5)]
    folder = tmp_path / "run" / "tracking"
    config = TrackingConfig()  # TensorBoard only, the default
    # first invocation: killed after step 3 (its evaluation logged), so close() never ran
    first = open_tracking(config, str(folder), run_name="r", run_config={})
    assert first.record(rows[:3], evals[:2]) == 5
    first.trackers[0].close()  # the writer's file handle; the run record is not told
    # the resume replays steps 1..5 (cache hits, then new work) and logs only 4, 5 and eval 5
    second = open_tracking(config, str(folder), run_name="r", run_config={})
    assert second.record(rows[:4], evals[:2]) == 1
    assert second.record(rows, evals) == 2
    second.close()
    # a re-run that is all cache hits logs nothing new
    third = open_tracking(config, str(folder), run_name="r", run_config={})
    assert third.record(rows, evals) == 0
    third.close()
    seen = _tensorboard(folder / "tensorboard" / "r")  # one folder, named after the run
    assert _approx(seen) == _approx(_expected(rows, evals))
    assert seen["eval/avg_at_k"] == [(0, 0.25), (3, 0.625), (5, 0.875)] and "train/lr" in seen and "time/time_train_s" in seen
    assert len(list((folder / "tensorboard" / "r").glob("events.out.tfevents.*"))) == 3  # one file per session
    assert {k: v for k, v in read_state(folder)["tensorboard"].items() if k != "config_sha256"} == {
        "steps": [1, 2, 3, 4, 5], "evals": [0, 3, 5]}


def test_no_tracker_writes_nothing(tmp_path: Path) -> None:
    tracking = open_tracking(TrackingConfig(tensorboard=False), str(tmp_path / "tracking"), run_name="r", run_config={})
    assert tracking.record(step_rows(tmp_path, range(1, 2)), [evaluation(0)]) == 0
    assert not (tmp_path / "tracking").exists() or not any((tmp_path / "tracking").rglob("events*"))


def test_a_run_logged_before_runs_were_named_moves_into_its_named_folder_on_resume(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "tracking"
    rows = step_rows(tmp_path, range(1, 3))
    first = open_tracking(TrackingConfig(), str(folder), run_name="r", run_config={})
    first.record(rows[:1], [])
    first.close()
    for path in (folder / "tensorboard" / "r").iterdir():  # where the files lay before: the logdir itself
        path.rename(folder / "tensorboard" / path.name)
    (folder / "tensorboard" / "r").rmdir()
    second = open_tracking(TrackingConfig(), str(folder), run_name="r", run_config={})
    second.record(rows, [])
    second.close()
    assert sorted(p.name for p in (folder / "tensorboard").iterdir()) == ["r"]
    assert _tensorboard(folder / "tensorboard" / "r")["train/loss"] == [(1, pytest.approx(rows[0]["loss"]))]
