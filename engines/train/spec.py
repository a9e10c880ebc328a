"""The contract between a training launch's owner and its worker ranks.

``engines/train/launch.py`` (the owner) writes a ``WorkerSpec`` as JSON; every rank reads it back
(``engines/train/worker.py`` under torchrun, ``engines/train/rank.py`` under an elastic agent)
and runs it (``engines/train/step.py``). Both sides also agree on where a checkpoint folder
keeps its DeepSpeed state (``DS_STATE_DIR``, ``DS_META_FILE``), and a failed step raises
``TrainStepFailure`` on the worker side. These live apart from the worker and step code so that
each of them, and the owner, can import the contract without importing one another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settings.train import TrainConfig
from storage import checkpoints

DS_STATE_DIR = checkpoints.OPTIMIZER_STATE_DIR  # DeepSpeed checkpoint (optimizer state) inside a checkpoint folder
DS_META_FILE = "dapo_ds_meta.json"  # how the DeepSpeed state was laid out (world size, stage)


class TrainStepFailure(RuntimeError):
    """The step cannot produce a valid update (non-finite loss/gradient, incompatible state)."""


@dataclass(frozen=True)
class WorkerSpec:
    """What ``engines/train/launch.py`` hands every worker process: the stage's settings whole
    (``train``, settings/train.py) and this launch's paths, batches and mailbox."""

    train: TrainConfig  # every training setting, as the run config holds it
    parent_checkpoint: str  # HF folder of the policy to update
    resume_ds_state: str | None  # the parent's ds_state/ folder, or None for a fresh optimizer
    steps: list[dict[str, Any]]  # [{"step": int, "shards": [paths]}]; > 1 = consecutive steps, one engine
    out_dir: str  # staging folder that receives the HF export and ds_state/
    metrics_path: str  # JSON written by rank 0: one metrics dict per step
    error_path: str  # text file written by the failing rank
    # Optimizer updates the parent's LR schedule has taken (engines/train/launch.py: schedule_start):
    # where a fresh optimizer's warm-up starts; a resumed state must agree with it.
    start_updates: int = 0
    # Whether ds_state/ is written (engines/train/checkpoint.py: writes_optimizer_state; a replay always writes it).
    write_state: bool = True
    probe_input_ids: list[list[int]] | None = None  # tests: logits of these inputs after the update
    probe_path: str | None = None
    serve_dir: str | None = None  # serve mode: the request mailbox (engines/train/server.py); None = one launch
    owner_pid: int | None = None  # serve mode: exit when this process is gone
    owner_start_ticks: int | None = None  # its start time (/proc/PID/stat field 22): pids get reused

    @property
    def warmup_updates(self) -> int:
        """The paper counts warm-up in rollout steps (sec. 4.1); the optimizer counts updates."""
        return self.train.warmup_steps * self.train.optimizer_updates_per_step

    @classmethod
    def from_json(cls, path: str | Path) -> WorkerSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WorkerSpec:
        """From the JSON form (engines/train/launch.py: _worker_spec)."""
        return cls(**{**raw, "train": TrainConfig(**raw["train"])})
