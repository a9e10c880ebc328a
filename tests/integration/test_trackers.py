"""W&B (offline) and MLflow (file store) receive every step and evaluation, read back with each
library's own reader, and a resumed run continues the same tracker run without logging twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from settings.tracking import TrackingConfig
from tests.tracking_fixtures import evaluation, step_rows, wandb_history, wandb_runs
from tracking.run_tracking import open_tracking
from tracking.scalars import eval_scalars, step_scalars
from tracking.state import read_state


def _resumed_run(tmp_path: Path, config: TrackingConfig) -> tuple[Path, list[dict], list[dict]]:
    """Steps 1..3 and evaluations 0, 3 in a first invocation; the resume replays all and adds 4, 5 and eval 5;
    then a re-run of cache hits. Returns the tracking folder and what was logged."""
    rows, evals = step_rows(tmp_path, range(1, 6)), [evaluation(0), evaluation(3), evaluation(5)]
    folder = tmp_path / "run" / "tracking"
    run_config = {"run": {"name": "r", "steps": 5}, "train": {"lr": 1e-4}}
    for upto_rows, upto_evals, logged in ((3, 2, 5), (5, 3, 3), (5, 3, 0)):
        tracking = open_tracking(config, str(folder), run_name="r", run_config=run_config)
        assert tracking.record(rows[:upto_rows], evals[:upto_evals]) == logged
        tracking.close()
    return folder, rows, evals


def _by_step(rows: list[dict], evals: list[dict]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for step, scalars in [(r["step"], step_scalars(r)) for r in rows] + [(e["step"], eval_scalars(e)) for e in evals]:
        out.setdefault(step, {}).update(scalars)
    return out


def test_wandb_offline_run_holds_every_step_once_and_a_resume_continues_it(tmp_path: Path, monkeypatch) -> None:
    for key in ("WANDB_MODE", "WANDB_SILENT", "WANDB_DISABLE_GIT"):
        monkeypatch.delenv(key, raising=False)  # the adapter, not the test, makes it offline
    monkeypatch.setenv("WANDB_API_KEY", "")
    folder, rows, evals = _resumed_run(tmp_path, TrackingConfig(tensorboard=False, wandb=True, wandb_project="dapo-test"))
    assert os.environ["WANDB_MODE"] == "offline"
    run_id = read_state(folder)["wandb"]["run_id"]
    sessions = sorted((folder / "wandb" / "wandb").glob("offline-run-*"))
    assert len(sessions) == 3 and all(f"-{run_id}" in s.name for s in sessions)  # one W&B run, 3 sessions
    # each session names the run after the run and carries the resolved config
    runs = wandb_runs(folder / "wandb")
    assert [(r["run_id"], r["name"]) for r in runs] == [(run_id, "r")] * 3
    assert all(r["config"]["train"] == {"lr": 1e-4} for r in runs), runs[0]["config"]
    history = wandb_history(folder / "wandb")
    assert {h["_run_id"] for h in history} == {run_id}
    steps = [h["_step"] for h in history]
    assert steps == sorted(set(steps)) == [0, 1, 2, 3, 4, 5]  # each step once, in order
    for h in history:
        expected = _by_step(rows, evals)[h["_step"]]
        assert {k: v for k, v in h.items() if not k.startswith("_")} == pytest.approx(expected), h["_step"]


def test_mlflow_run_holds_every_step_once_and_a_resume_continues_it(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from tracking.mlflow_log import store_uri

    folder, rows, evals = _resumed_run(tmp_path, TrackingConfig(tensorboard=False, mlflow=True, mlflow_experiment="e"))
    client = MlflowClient(tracking_uri=store_uri(folder))
    runs = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert [r.info.run_id for r in runs] == [read_state(folder)["mlflow"]["run_id"]]  # one run across 3 sessions
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.params["train.lr"] == "0.0001"
    assert run.info.run_name == "r"
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path)))
    assert config.read_text() == "run:\n  name: r\n  steps: 5\ntrain:\n  lr: 0.0001\n"
    expected = _by_step(rows, evals)
    names = {name for scalars in expected.values() for name in scalars}
    assert set(run.data.metrics) == names
    for name in names:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert history == [(step, pytest.approx(s[name])) for step, s in sorted(expected.items()) if name in s], name
