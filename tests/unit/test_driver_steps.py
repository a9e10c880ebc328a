"""The driver's training step (workflows/driver.py: ``_PipelineStages._train`` and its named steps):
when the policy is evaluated between steps, and the order of one step's task calls and records,
which a re-run replays over cache hits and pipelined mode overlaps with the next step's sampling."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas
from dapo_core.sampling import DynamicSamplingResult
from storage.run_layout import RunLayout
from workflows import driver
from workflows.step_loop import GroupRef, StepPlan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import peer_trl  # noqa: E402  (benchmarks/peer_trl.py: the evaluated steps TRL is scored at)


@pytest.mark.parametrize(("step", "every", "steps", "expected"), [
    (1, 0, 3, False),  # eval_every_steps=0: only before and after training
    (3, 0, 3, False),
    (1, 1, 3, True),
    (2, 1, 3, True),
    (3, 1, 3, False),  # the last step: train_and_report evaluates it after the steps
    (2, 2, 5, True),
    (3, 2, 5, False),  # not a multiple
    (4, 2, 5, True),
    (5, 2, 5, False),
    (4, 2, 4, False),  # the last step and a multiple: still evaluated once, after the steps
    (5, 5, 5, False),
    (8, 4, 10, True),
    (0, 2, 0, False),  # steps=0: no step runs; step 0 is prepare_run's evaluation
])
def test_evaluates_after_every_nth_step_but_the_last(step: int, every: int, steps: int, expected: bool) -> None:
    assert driver.evaluates_after(step, every, steps) is expected


@given(steps=st.integers(0, 60), every=st.integers(0, 70))
def test_the_runs_evaluated_steps_are_those_the_trl_peer_is_scored_at(steps: int, every: int) -> None:
    # A run evaluates step 0 (prepare_run), the steps evaluates_after names, and the last (train_and_report).
    evaluated = {0, *(s for s in range(1, steps + 1) if driver.evaluates_after(s, every, steps)), steps}
    assert sorted(evaluated) == peer_trl.eval_steps(steps, every)


def _plan(step: int, *, kept: int) -> StepPlan:
    refs = [(f"g{i}", GroupRef(problem_id=f"p{i}", source=f"scored-{step}-{i % 2}", generated_step=step,
                               behaviour_step=step - 1)) for i in range(kept)]
    result = DynamicSamplingResult(outcome="full" if kept else "skipped", target_groups=2, rounds=1, kept=refs[:2],
                                   surplus=refs[2:], final_reasons={}, round_reports=[], carried_in=0)
    return StepPlan(step=step, requests=[], request_epochs=[], result=result, round_stats=[])


def _stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, every: int, steps: int) -> tuple[Any, list[tuple]]:
    """A ``_PipelineStages`` whose tasks, records and page are stand-ins that log each call in order."""
    calls: list[tuple] = []
    layout = RunLayout(str(tmp_path))

    async def call_verified(task: Any, outs: list[str], *args: Any, upstream: list[str]) -> Any:
        calls.append((task.short_name, *args[:1]))  # train's first input is the checkpoint it trains from
        return SimpleNamespace(checkpoint_dir=outs[0])

    async def evaluate(cfg: Any, layout: Any, checkpoint: str, test_paths: list[str], step: int) -> dict[str, Any]:
        calls.append(("evaluate", step, checkpoint))
        return {"step": step}

    async def refresh_report() -> None:
        calls.append(("refresh_report",))

    def row(plan: StepPlan, trained: dict[str, Any], train_s: float) -> dict[str, Any]:
        calls.append(("metrics_row", plan.step, trained["checkpoint_id"]))
        return schemas.StepStats.blank(plan.step, trained["checkpoint_id"], "parent").row()

    monkeypatch.setattr(driver, "call_verified", call_verified)
    monkeypatch.setattr(driver, "_evaluate", evaluate)
    monkeypatch.setattr(driver, "_train_row", lambda d: calls.append(("train_row", d)) or {"checkpoint_id": d})
    monkeypatch.setattr(driver, "_skipped_step", lambda s, c: calls.append(("skipped", s, c)) or {"checkpoint_id": c})
    monkeypatch.setattr(driver.progress, "training", lambda s, n, *, trains: calls.append(("training", s, trains)))
    monkeypatch.setattr(driver.progress, "step_done", lambda report: calls.append(("step_done", report.step)))
    stages = object.__new__(driver._PipelineStages)
    stages.cfg = SimpleNamespace(run=SimpleNamespace(steps=steps, eval_every_steps=every), train="train-settings")
    stages.layout, stages.test_paths = layout, ["test.parquet"]
    stages.checkpoint, stages.policy_step = "ckpt-0", 0
    stages.checkpoint_paths, stages.policy_after = {0: "ckpt-0"}, {0: ("ckpt-0", 0)}
    stages.evals, stages.metrics_rows, stages.step_seconds = [], [], []
    stages._step_started, stages._page_drawn_at = time.perf_counter(), time.perf_counter() + 3600  # page not due
    stages._metrics_row = row
    stages.track = lambda: calls.append(("track",))
    stages.apply_retention = lambda step: calls.append(("retention", step))
    stages.refresh_report = refresh_report
    return stages, calls


def test_a_trained_step_calls_its_tasks_then_records_evaluates_and_prunes_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stages, calls = _stages(tmp_path, monkeypatch, every=2, steps=3)
    asyncio.run(stages._train(_plan(2, kept=3)))
    new = stages.layout.checkpoint(2)
    assert calls == [
        ("training", 2, True),
        ("assemble_batch-step-0002", ["scored-2-0", "scored-2-1"]),
        ("train-step-0002", "ckpt-0"),  # trains from the policy before the step
        ("train_row", new),
        ("metrics_row", 2, new),
        ("step_done", 2),
        ("evaluate", 2, new),  # the new policy, evaluated because step 2 is due
        ("track",),
        ("retention", 2),
        ("refresh_report",),  # after an evaluation, however recently the page was drawn
    ]
    assert (stages.checkpoint, stages.policy_step) == (new, 2) and stages.checkpoint_paths == {0: "ckpt-0", 2: new}
    assert stages.policy_after[2] == (new, 2) and len(stages.metrics_rows) == len(stages.step_seconds) == 1


def test_a_skipped_step_keeps_the_policy_and_trains_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stages, calls = _stages(tmp_path, monkeypatch, every=1, steps=3)
    asyncio.run(stages._train(_plan(3, kept=0)))
    assert calls == [("training", 3, False), ("skipped", 3, "ckpt-0"), ("metrics_row", 3, "ckpt-0"), ("step_done", 3),
                     ("track",), ("retention", 3)]  # the last step: no evaluation here; the page is not due
    assert (stages.checkpoint, stages.policy_step, stages.policy_after[3]) == ("ckpt-0", 0, ("ckpt-0", 0))
    assert stages.checkpoint_paths == {0: "ckpt-0"}


def test_a_failed_train_call_leaves_the_policy_and_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stages, calls = _stages(tmp_path, monkeypatch, every=1, steps=3)

    async def interrupted(task: Any, outs: list[str], *args: Any, upstream: list[str]) -> Any:
        calls.append((task.short_name,))
        if task.short_name.startswith("train-"):
            raise KeyboardInterrupt  # Ctrl-C while the train task runs
        return None

    monkeypatch.setattr(driver, "call_verified", interrupted)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(stages._train(_plan(1, kept=2)))
    assert calls == [("training", 1, True), ("assemble_batch-step-0001",), ("train-step-0001",)]
    assert (stages.checkpoint, stages.policy_step, stages.checkpoint_paths) == ("ckpt-0", 0, {0: "ckpt-0"})
    assert 1 not in stages.policy_after and stages.metrics_rows == []
