"""Where every stage's outputs live inside a run folder (documented in the README).

The driver hands each task explicit output paths from here, so a task never writes into a
temporary folder that a cache entry could outlive, and the lineage command finds everything
by walking the same layout. The root is a path or an object-store URI (storage/run_store.py), so
every name is a string joined the same way for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from storage.run_lookup import RUN_RECORD
from storage.run_store import join


@dataclass(frozen=True)
class RunLayout:
    """Names inside one run folder ``<run_root>/<run name>`` (a path or a URI)."""

    root: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", str(self.root).rstrip("/") if "://" in str(self.root) else os.fspath(self.root))

    def _at(self, *parts: str) -> str:
        return join(self.root, *parts)

    @property
    def run_record(self) -> str:
        return self._at(RUN_RECORD)  # resolved config, its digest and code versions

    @property
    def summary(self) -> str:
        return self._at("summary.json")

    @property
    def flyte_dir(self) -> str:
        return self._at("flyte")  # Flyte config, local cache DB and run records of this run

    @property
    def curate_dir(self) -> str:
        return self._at("curate")

    @property
    def problems_dir(self) -> str:
        return self._at("curate", "problems")

    @property
    def rejected_dir(self) -> str:
        return self._at("curate", "rejected")

    @property
    def checkpoints_dir(self) -> str:
        return self._at("checkpoints")

    def checkpoint(self, step: int) -> str:
        return self._at("checkpoints", f"step-{step:04d}")

    def step_dir(self, step: int) -> str:
        return self._at("steps", f"step-{step:04d}")

    def rollout_shard(self, step: int, generation_round: int) -> str:
        return self._at("steps", f"step-{step:04d}", "rollouts", f"round-{generation_round:02d}.parquet")

    def scored_shard(self, step: int, generation_round: int) -> str:
        return self._at("steps", f"step-{step:04d}", "scored", f"round-{generation_round:02d}.parquet")

    def batch_shard(self, step: int) -> str:
        return self._at("steps", f"step-{step:04d}", "batch.parquet")  # the groups step `step` trained on

    def surplus_shard(self, step: int) -> str:
        return self._at("steps", f"step-{step:04d}", "surplus.parquet")  # informative groups carried on

    def metrics_shard(self, step: int) -> str:
        return self._at("steps", f"step-{step:04d}", "metrics.parquet")

    def eval_shard(self, step: int) -> str:
        return self._at("eval", f"step-{step:04d}.parquet")

    @property
    def tracking_dir(self) -> str:
        return self._at("tracking")  # experiment trackers (tracking/): tensorboard/, wandb/, mlflow/, logged.json

    @property
    def report_dir(self) -> str:
        return self._at("report")

    @property
    def report_page(self) -> str:
        return self._at("report", "index.html")  # the run page (reports/run.py)


def checkpoint_beside(folder: str, step: int) -> str:
    """The checkpoint folder of ``step`` in the run that holds the checkpoint ``folder`` (a path or a URI,
    named as :meth:`RunLayout.checkpoint` names it); ValueError for a folder outside a run's layout."""
    root, checkpoints_dir, name = str(folder).rstrip("/").rsplit("/", 2)
    if checkpoints_dir != "checkpoints" or not (name.startswith("step-") and name[5:].isdigit()):
        raise ValueError(f"{folder}: not a checkpoint in a run folder (<run>/checkpoints/step-NNNN)")
    return RunLayout(root).checkpoint(step)


def rung_folder(slug: str, seed: int) -> str:
    """One seed's run folder of a ladder rung, relative to the ladder folder (dapo ablate)."""
    return f"{slug}/seed-{seed}"
