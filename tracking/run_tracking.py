"""A run's trackers as one: opened from the ``tracking`` config, fed the steps and evaluations so far.

:meth:`RunTracking.record` takes every StepMetrics row and evaluation the driver holds and sends
each tracker only those it has not logged (tracking/state.py), in step order (an evaluation after
its step's metrics), so the driver calls it after each step whatever was cached. Files live in
``<run>/tracking/``; for a run root in an object store they are written in the run's local mirror
(storage/run_store.py), fetched from the store when a run resumes and uploaded after each call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from settings.tracking import TrackingConfig
from storage import run_store
from tracking.config_view import config_yaml, flat_params
from tracking.protocol import Tracker
from tracking.scalars import eval_scalars, step_scalars
from tracking.state import STATE_FILE, is_logged, mark_logged, read_state, write_state


class RunTracking:
    """The enabled trackers of one run folder and what each has logged."""

    def __init__(self, trackers: list[Tracker], state: dict[str, dict[str, Any]], local: Path,
                 remote: str | None = None) -> None:
        self.trackers, self.state, self.local, self.remote = trackers, state, local, remote

    def record(self, rows: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]]) -> int:
        """Log what each tracker lacks of ``rows`` (StepMetrics) and ``evals``; returns the items logged."""
        items = sorted([(int(r["step"]), 0, "steps", r) for r in rows] + [(int(e["step"]), 1, "evals", e) for e in evals],
                       key=lambda item: item[:2])
        logged = 0
        for step, _, kind, item in items:
            pending = [t for t in self.trackers if not is_logged(self.state[t.name], kind, step)]
            if not pending:
                continue
            scalars = step_scalars(item) if kind == "steps" else eval_scalars(item)
            for tracker in pending:
                (tracker.log_step if kind == "steps" else tracker.log_eval)(step, scalars)
                mark_logged(self.state[tracker.name], kind, step)
                logged += 1
            write_state(self.local, self.state)
        if logged:
            self._upload()
        return logged

    def close(self) -> None:
        """End this session of every tracker (a later resume continues the same runs)."""
        for tracker in self.trackers:
            tracker.close()
        write_state(self.local, self.state)
        self._upload()

    def _upload(self) -> None:
        if self.remote is not None:
            run_store.upload_folder(self.local, self.remote, marker=None, clear=False)


def open_tracking(config: TrackingConfig, folder: str, *, run_name: str, run_config: Mapping[str, Any]) -> RunTracking:
    """Open (or continue) every tracker ``config`` turns on, in ``folder`` (``<run>/tracking``).

    ``run_config`` is ``RunConfig.to_dict()``: TensorBoard's hparams and config text, W&B's run config,
    MLflow's parameters and config artifact. ``run_name`` names the run in each tracker (the run
    folder's name, ``run.name``).
    """
    remote = folder if run_store.is_remote(folder) else None
    local = run_store.local_path(folder)
    if remote is not None and run_store.exists(run_store.join(remote, STATE_FILE)):
        run_store.download_tree(remote, local)
    state = read_state(local)
    trackers: list[Tracker] = []
    for name in config.enabled():
        record = state.setdefault(name, {})
        if name == "tensorboard":
            from tracking.tensorboard_log import open_tensorboard

            trackers.append(open_tensorboard(local, record, run_name=run_name, run_config=run_config))
        elif name == "wandb":
            from tracking.wandb_log import open_wandb

            trackers.append(open_wandb(local, record, project=config.wandb_project, run_name=run_name,
                                       config=dict(run_config)))
        elif name == "mlflow":
            from tracking.mlflow_log import open_mlflow

            trackers.append(open_mlflow(local, record, experiment=config.mlflow_experiment, run_name=run_name,
                                        params=flat_params(run_config), config_text=config_yaml(run_config)))
    if trackers:
        write_state(local, state)  # the run ids, before anything is logged under them
    return RunTracking(trackers, state, local, remote)
