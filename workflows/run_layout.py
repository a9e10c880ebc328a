"""Where every stage's outputs live inside a run folder (documented in the README).

The driver hands each task explicit output paths from here, so a task never writes into a
temporary folder that a cache entry could outlive, and the lineage command finds everything
by walking the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run folder ``<run_root>/<run name>``."""

    root: Path

    @property
    def run_record(self) -> Path:
        return self.root / "run.json"  # resolved config, its digest and code versions

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def flyte_dir(self) -> Path:
        return self.root / "flyte"  # Flyte config, local cache DB and run records of this run

    @property
    def problems_dir(self) -> Path:
        return self.root / "curate" / "problems"

    @property
    def rejected_dir(self) -> Path:
        return self.root / "curate" / "rejected"

    @property
    def curate_dir(self) -> Path:
        return self.root / "curate"

    def checkpoint(self, step: int) -> Path:
        return self.root / "checkpoints" / f"step-{step:04d}"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def step_dir(self, step: int) -> Path:
        return self.root / "steps" / f"step-{step:04d}"

    def rollout_shard(self, step: int, generation_round: int) -> Path:
        return self.step_dir(step) / "rollouts" / f"round-{generation_round:02d}.parquet"

    def scored_shard(self, step: int, generation_round: int) -> Path:
        return self.step_dir(step) / "scored" / f"round-{generation_round:02d}.parquet"

    def batch_shard(self, step: int) -> Path:
        return self.step_dir(step) / "batch.parquet"  # the groups step `step` trained on

    def surplus_shard(self, step: int) -> Path:
        return self.step_dir(step) / "surplus.parquet"  # informative groups carried to the next step

    def metrics_shard(self, step: int) -> Path:
        return self.step_dir(step) / "metrics.parquet"

    def eval_shard(self, step: int) -> Path:
        return self.root / "eval" / f"step-{step:04d}.parquet"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"
