"""Weights & Biases in offline mode, under ``<run>/tracking/wandb/`` (off by default; no network).

The run's W&B id is made once and kept in the logged-state file (tracking/state.py), so a resumed
run continues the same W&B run: each session writes one ``wandb/offline-run-<time>-<id>/`` folder
with that id, and ``wandb sync <run>/tracking/wandb/wandb/offline-run-*`` uploads them all into
one W&B run. Offline mode, no console capture, no git or system probes are set here (not left
to the caller's environment), so nothing reaches for the network.

Why not ``flyteplugins-wandb``: its ``@wandb_init`` wraps a whole task and names the W&B run after
the Flyte run and action (``{run_name}-{action}``), so each ``dapo run`` of a resumed run folder (a
new Flyte run) would start a new W&B run; it takes its settings from the Flyte run context at
launch, not from the run config, and on a cluster forces W&B's online ``shared`` mode. Its
``Wandb`` link points at ``https://wandb.ai``, where an offline run exists only after
``wandb sync``. Linking the Flyte UI to the synced run is left for online use.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

# Set in the process before wandb is imported: offline, quiet, no probes that could reach out.
_OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_ERROR_REPORTING": "false"}


class WandbTracker:
    """One session of the run's offline W&B run."""

    name = "wandb"

    def __init__(self, run: Any) -> None:
        self._run = run

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


def open_wandb(folder: Path, state: dict[str, Any], *, project: str, run_name: str,
               config: dict[str, Any]) -> WandbTracker:
    """Start or continue the run's offline W&B run in ``folder/wandb``; records its id in ``state``."""
    os.environ.update(_OFFLINE_ENV)
    import wandb  # lazy: heavy, and only when turned on

    run_id = state.setdefault("run_id", uuid.uuid4().hex[:16])
    out = folder / "wandb"
    out.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(mode="offline", silent=True, console="off", disable_git=True, save_code=False,
                              x_disable_stats=True, x_disable_meta=True)
    run = wandb.init(project=project, id=run_id, name=run_name, dir=str(out), resume="allow", config=config,
                     settings=settings, reinit="create_new")
    return WandbTracker(run)
