"""TensorBoard event files under ``<run>/tracking/tensorboard/<run name>/`` (on by default; no account needed).

Written with ``torch.utils.tensorboard.SummaryWriter`` (torch is already a dependency; it needs
the ``tensorboard`` package). TensorBoard names a run after the folder of its event files relative
to ``--logdir``: files directly in the logdir showed as the run ".", so they go one folder down,
named after the run (a run folder written before that has its files moved there when it resumes).
A resumed run writes a new event file into the same folder, which TensorBoard shows as one run;
the logged-state file (tracking/state.py) keeps steps from being written twice.

Besides the scalars (tracking/scalars.py), the run holds:

- the resolved run config as hparams (the HPARAMS tab; its table shows the held-out metrics'
  last values, unsmoothed) and as YAML text (the TEXT tab, tag ``config``), logged when the run
  starts and again at the next step when a resume changed it (e.g. more steps);
- each held-out evaluation as one line of text (tag ``eval/held_out``): an evaluation is a few
  points, which the scalar chart's default smoothing (0.6) draws well below their values.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracking.config_view import config_digest, config_yaml, flat_config
from tracking.scalars import eval_text

# The held-out metrics the hparams table shows beside the config (scalar tags of tracking/scalars.py).
HPARAM_METRICS = ("eval/avg_at_k", "eval/pass_at_k")
EVENT_FILES = "events.out.tfevents.*"


class TensorBoardTracker:
    """One session of the run's TensorBoard log folder."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # lazy: heavy, and only when turned on
        )

        log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = SummaryWriter(log_dir=str(log_dir))

    def log_config(self, step: int, run_config: Mapping[str, Mapping[str, Any]]) -> None:
        """The resolved config as hparams (with the held-out metrics as their columns) and as text."""
        from torch.utils.tensorboard.summary import hparams

        for summary in hparams(flat_config(run_config), dict.fromkeys(HPARAM_METRICS, 0.0)):
            self._writer.file_writer.add_summary(summary, global_step=step)
        # indented by four spaces: a code block in TensorBoard's markdown, so the YAML keeps its lines
        text = "".join(f"    {line}\n" for line in config_yaml(run_config).splitlines())
        self._writer.add_text("config", text, global_step=step)
        self._writer.flush()

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def log_eval(self, step: int, values: dict[str, float]) -> None:
        self._writer.add_text("eval/held_out", eval_text(step, values), global_step=step)
        self.log_step(step, values)

    def close(self) -> None:
        self._writer.close()


def _next_step(state: Mapping[str, Any]) -> int:
    """The first step this session can log: 0 for a new run, else one past the last logged item."""
    logged = [*state.get("steps", []), *state.get("evals", [])]
    return max(logged) + 1 if logged else 0


def _move_top_level_events(top: Path, run_dir: Path) -> None:
    """Event files a run wrote directly into ``top`` (before runs were named) join ``run_dir``."""
    for path in top.glob(EVENT_FILES):
        if path.is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            path.replace(run_dir / path.name)


def open_tensorboard(folder: Path, state: dict[str, Any], *, run_name: str,
                     run_config: Mapping[str, Mapping[str, Any]]) -> TensorBoardTracker:
    """The run's TensorBoard folder ``folder/tensorboard/<run_name>`` (the same one on every resume);
    logs the config when it is new or changed since it was last logged (its digest kept in ``state``)."""
    top = folder / "tensorboard"
    run_dir = top / run_name
    _move_top_level_events(top, run_dir)
    tracker = TensorBoardTracker(run_dir)
    digest = config_digest(run_config)
    if state.get("config_sha256") != digest:
        tracker.log_config(_next_step(state), run_config)
        state["config_sha256"] = digest
    return tracker
