"""How a finished run used what it generated: samples generated per sample trained, and zero-signal groups.

Read from a run folder's shards, not from the step record: a new StepMetrics column would change the
train task's code version (infra/versioning.py: the import closure of the task's module), so every
cached stage of an existing run would run again. Per step:

- ``generated``: rollout rows of all the step's rounds (``steps/step-N/rollouts/round-*.parquet``);
- ``trained``: the samples the train task trained on (``steps/step-N/metrics.parquet``: ``samples``),
  carried surplus included, so one step's ratio can be below 1; the run's ratio is its totals';
- per round, ``zero_signal_share``: groups whose G rewards are all equal (no advantage, no gradient:
  what TRL logs as ``frac_reward_zero_std``), and ``filtered_share``: groups dynamic sampling dropped
  (``filter_reason`` other than ``kept``: the run's own rule, eq. 11 by default).

Imported by the scripts in this folder as ``from sample_use import run_sample_use`` (a script's own
folder is first on ``sys.path``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RoundSignal:
    """The groups of one generation round and how many of them carried no signal."""

    round: int
    groups: int
    zero_signal_groups: int  # all G rewards equal
    filtered_groups: int  # dropped by dynamic sampling (filter_reason != "kept")

    @property
    def zero_signal_share(self) -> float:
        return self.zero_signal_groups / self.groups if self.groups else math.nan

    @property
    def filtered_share(self) -> float:
        return self.filtered_groups / self.groups if self.groups else math.nan


@dataclass(frozen=True)
class StepSampleUse:
    """One step's samples generated and trained, and its rounds' signal."""

    step: int
    generated: int
    trained: int
    rounds: list[RoundSignal]

    @property
    def over_generation(self) -> float:
        """Samples generated per sample trained (NaN for a step that trained nothing)."""
        return self.generated / self.trained if self.trained else math.nan


@dataclass(frozen=True)
class RunSampleUse:
    """Every step's sample use, and the run's totals."""

    steps: list[StepSampleUse]

    @property
    def generated(self) -> int:
        return sum(s.generated for s in self.steps)

    @property
    def trained(self) -> int:
        return sum(s.trained for s in self.steps)

    @property
    def over_generation(self) -> float:
        return self.generated / self.trained if self.trained else math.nan

    @property
    def zero_signal_share(self) -> float:
        """Zero-signal groups over all groups generated in the run."""
        groups = sum(r.groups for s in self.steps for r in s.rounds)
        return sum(r.zero_signal_groups for s in self.steps for r in s.rounds) / groups if groups else math.nan

    def as_dict(self) -> dict:
        return {
            "generated": self.generated, "trained": self.trained, "over_generation": round(self.over_generation, 4),
            "zero_signal_share": round(self.zero_signal_share, 4),
            "per_step": [{"step": s.step, "generated": s.generated, "trained": s.trained,
                          "over_generation": round(s.over_generation, 4),
                          "rounds": [{"round": r.round, "groups": r.groups, "zero_signal_share": round(r.zero_signal_share, 4),
                                      "filtered_share": round(r.filtered_share, 4)} for r in s.rounds]}
                         for s in self.steps],
        }


def round_signal(scored_shard: Path) -> RoundSignal:
    """Groups, all-equal-reward groups and filtered groups of one scored round shard."""
    import sys

    sys.path.insert(0, str(REPO))
    from engines.score.stage import group_keys_of

    table = pq.read_table(scored_shard, columns=["problem_id", "checkpoint_id", "generation_round", "reward",
                                                 "filter_reason"])
    rewards: dict[str, set[float]] = {}
    reasons: dict[str, str] = {}
    for key, reward, reason in zip(group_keys_of(table), table.column("reward").to_pylist(),
                                   table.column("filter_reason").to_pylist()):
        rewards.setdefault(key, set()).add(reward)
        reasons[key] = reason
    return RoundSignal(
        round=int(scored_shard.stem.split("-")[-1]),
        groups=len(rewards),
        zero_signal_groups=sum(len(values) == 1 for values in rewards.values()),
        filtered_groups=sum(reason != "kept" for reason in reasons.values()),
    )


def step_sample_use(step_dir: Path, step: int) -> StepSampleUse:
    """One step folder's sample use (``steps/step-NNNN`` of a run folder)."""
    generated = sum(pq.read_metadata(p).num_rows for p in sorted(step_dir.glob("rollouts/round-*.parquet")))
    trained = int(sum(pq.read_table(step_dir / "metrics.parquet", columns=["samples"]).column("samples").to_pylist()))
    rounds = [round_signal(p) for p in sorted(step_dir.glob("scored/round-*.parquet"))]
    return StepSampleUse(step=step, generated=generated, trained=trained, rounds=rounds)


def run_sample_use(run_dir: str | Path, steps: int) -> RunSampleUse:
    """Steps 1..``steps`` of a run folder."""
    root = Path(run_dir) / "steps"
    return RunSampleUse([step_sample_use(root / f"step-{i:04d}", i) for i in range(1, steps + 1)])
