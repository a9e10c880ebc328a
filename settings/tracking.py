"""Settings of experiment tracking: which trackers receive each step's metrics and each evaluation.

Trackers only record what the pipeline computes; they never change it. So this section is left
out of ``RunConfig.digest()`` and of the run-folder binding (workflows/run_binding.py): a resumed
run may turn a tracker on or off. Every tracker writes under ``<run>/tracking/`` and needs no
network (W&B runs offline; ``wandb sync`` uploads later).
"""

from __future__ import annotations

from dataclasses import dataclass

from settings.checks import check_fields

# Characters W&B refuses in a project name (and MLflow's UI shows badly in an experiment name).
_BAD_NAME_CHARS = set("/\\#?%:")


def _plain_name(name: str) -> bool:
    return bool(name.strip()) and not (set(name) & _BAD_NAME_CHARS)


@dataclass(frozen=True)
class TrackingConfig:
    """Trackers of a run (section ``tracking``); files under ``<run>/tracking/<tracker>/``."""

    tensorboard: bool = True  # TensorBoard event files (no account needed): tensorboard --logdir <run>/tracking/tensorboard
    wandb: bool = False  # Weights & Biases, offline mode (no network); upload later with `wandb sync`
    wandb_project: str = "dapo"  # W&B project the offline run belongs to (used when it is synced)
    mlflow: bool = False  # MLflow, a local file store: mlflow ui --backend-store-uri <run>/tracking/mlflow
    mlflow_experiment: str = "dapo"  # MLflow experiment the run is filed under

    def __post_init__(self) -> None:
        check_fields(self, {
            "wandb_project": (_plain_name(self.wandb_project), "must be a non-empty name without / \\ # ? % :"),
            "mlflow_experiment": (_plain_name(self.mlflow_experiment), "must be a non-empty name without / \\ # ? % :"),
        })

    def enabled(self) -> tuple[str, ...]:
        """The trackers turned on, in a fixed order (``tensorboard``, ``wandb``, ``mlflow``)."""
        return tuple(name for name in ("tensorboard", "wandb", "mlflow") if getattr(self, name))
