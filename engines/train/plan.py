"""What one training step trains on, and how its samples are split: the data side of a step.

Pure and rank-local (no engine, no collective), so every rank derives the same answer from the
same shards and seed:

- ``load_step_batch``: the step's kept rows collated into one padded batch, each sample's policy
  lag behind the parent, and which samples get the behaviour weight (decoupled PPO,
  dapo_core/correction.py);
- ``step_mini_batches``: the samples shuffled (seeded) into ``updates_per_step`` mini-batches
  (the paper: 16 updates per rollout step, sec. 4.1), one optimizer update each, and the
  gradient-accumulation steps every rank runs per mini-batch;
- ``rank_plan``: this rank's micro-batches of each mini-batch, padded to that count.

engines/train/batch.py reads and collates the rows; engines/train/step.py runs the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dapo_core.correction import policy_lags
from engines.train import batch as tb
from engines.train.spec import TrainStepFailure
from settings.train import TrainConfig

# plan[m][j] = (sample indices, weight) of this rank's micro-batch j of mini-batch m; weight 0.0
# marks a filler that runs forward/backward but contributes nothing.
MicroPlan = list[list[tuple[list[int], float]]]


@dataclass(frozen=True)
class StepBatch:
    """The step's samples and which of them get the behaviour weight."""

    batch: tb.TrainBatch
    lags: torch.Tensor  # [B] int64: how many checkpoints each sample's policy is behind the parent
    stale: torch.Tensor  # [B] bool: lag > 0
    correct: bool  # behaviour weights are computed and applied this step
    correct_samples: torch.Tensor | None  # [B] bool: the samples weighted ("auto"); None = every sample


def load_step_batch(shards: Sequence[str], *, step: int, parent_version: int, train: TrainConfig,
                    pad_token_id: int) -> StepBatch:
    """The kept rows of ``shards`` as one batch; ``parent_version`` is the step of the checkpoint
    being updated (the proximal policy), against which each sample's policy lag is measured."""
    rows = tb.load_rows(shards)
    tb.check_trainable(rows, step=step)
    batch = tb.collate(rows, pad_token_id=pad_token_id)
    try:
        lags = policy_lags(batch.policy_versions, current_version=parent_version)  # [B]
    except ValueError as err:
        raise TrainStepFailure(f"step {step}: {err} (engines/train/launch.py refuses such batches before launch)") from err
    stale = lags > 0
    # Which samples get the behaviour weight (decoupled PPO, dapo_core/correction.py): keyed on
    # each sample's policy lag, whatever made it stale (carried surplus, pipelined rollout).
    # "auto" leaves on-policy samples at weight 1 and an all-fresh batch on the exact code path
    # it had without correction; "always" weights every sample (TIS).
    correct = {"always": True, "auto": bool(stale.any()), "off": False}[train.correction_mode]
    correct_samples = stale if train.correction_mode == "auto" else None
    return StepBatch(batch=batch, lags=lags, stale=stale, correct=correct, correct_samples=correct_samples)


def step_mini_batches(num_samples: int, train: TrainConfig, *, step: int, world_size: int
                      ) -> tuple[list[list[int]], int]:
    """(the step's mini-batches of sample indices, shuffled with seed ``train.seed + step``; the
    gradient-accumulation steps, i.e. micro-batches per rank, of every mini-batch)."""
    minis = tb.mini_batches(num_samples, train.updates_per_step, seed=train.seed + step)
    gas = tb.accumulation_steps([len(m) for m in minis], world_size=world_size,
                                micro_batch_samples=train.micro_batch_samples)
    return minis, gas


def rank_plan(minis: list[list[int]], gas: int, *, rank: int, world_size: int, micro_batch_samples: int
              ) -> MicroPlan:
    """This rank's micro-batches of each mini-batch, exactly ``gas`` of them.

    Padded with zero-weight repeats of the mini-batch's first sample so every rank runs exactly
    ``gas`` forward/backward passes (ZeRO-3 gathers parameters collectively in each forward).
    """
    plan: MicroPlan = []
    for mini in minis:
        micro = [(idx, 1.0) for idx in tb.rank_micro_batches(mini, rank=rank, world_size=world_size,
                                                               micro_batch_samples=micro_batch_samples)]
        micro += [([mini[0]], 0.0)] * (gas - len(micro))
        plan.append(micro)
    return plan
