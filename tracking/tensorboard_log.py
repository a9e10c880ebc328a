"""TensorBoard event files under ``<run>/tracking/tensorboard/`` (on by default; no account needed).

Written with ``torch.utils.tensorboard.SummaryWriter`` (torch is already a dependency; it needs
the ``tensorboard`` package). A resumed run writes a new event file into the same folder, which
TensorBoard shows as one run; the logged-state file (tracking/state.py) keeps steps from being
written twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TensorBoardTracker:
    """One session of the run's TensorBoard log folder."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # lazy: heavy, and only when turned on
        )

        log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = SummaryWriter(log_dir=str(log_dir))

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        self.log_step(step, values)

    def close(self) -> None:
        self._writer.close()


def open_tensorboard(folder: Path, state: dict[str, Any]) -> TensorBoardTracker:
    """The run's TensorBoard log folder ``folder/tensorboard`` (the same one on every resume)."""
    return TensorBoardTracker(folder / "tensorboard")
