"""The one interface every tracker adapter implements: log a step, log an evaluation, close."""

from __future__ import annotations

from typing import Protocol


class Tracker(Protocol):
    """One tracker's run: scalars by name at a training step (tracking/scalars.py names them)."""

    name: str  # "tensorboard", "wandb" or "mlflow": its key in the logged-state file

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """The scalars of training step ``step`` (one StepMetrics row)."""

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        """The scalars of the held-out evaluation of step ``step``'s checkpoint (0: the step-0 policy)."""

    def close(self) -> None:
        """Flush what was logged to disk and end this session of the run (a resume continues it)."""
