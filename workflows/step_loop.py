"""The DAPO step loop's control flow, apart from whatever runs the stages.

For every training step: draw problems for a generation round, generate and score them, hand
the groups to dynamic sampling (paper sec. 3.2), repeat until the batch is full or
``max_rounds`` is spent, then train on the batch and carry the surplus into the next step.

The stages are behind :class:`StepStages`: the driver (workflows/driver.py) runs them as cached
Flyte tasks, the simulation (tests/unit/test_step_loop_sim.py, benchmarks/sampling_plan.py) as
fast stand-ins. Both run this code, so what the simulation checks (unique requests, full or
documented partial batches, no group trained twice, bounded surplus age, each problem once per
epoch, resume equals an uninterrupted run) is what a real run does.

Outcomes of a step (``DynamicSamplingResult.outcome``):

* ``full``: ``prompts_per_step`` informative groups.
* ``partial`` (``on_max_rounds: train_on_partial``): ``max_rounds`` rounds found fewer; the
  step trains on those it found.
* ``skipped`` (``train_on_partial``, none found): nothing to train on; the policy carries over
  unchanged and the step's metrics record ``trained_groups = 0``.
* with ``on_max_rounds: raise`` a short batch stops the run with ``DynamicSamplingExhaustedError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dapo_core.sampling import DynamicSamplingAccumulator, DynamicSamplingResult
from workflows.problem_order import ProblemOrder, check_pool_size


@dataclass(frozen=True)
class LoopSettings:
    """The driver's loop shape (unpacked from ``DriverConfig`` at the driver's boundary)."""

    steps: int  # training steps
    prompts_per_step: int  # informative groups one batch holds
    prompts_per_round: int  # problems one generation round draws
    max_rounds: int  # generation rounds a step may use
    on_max_rounds: str  # "raise" or "train_on_partial"
    seed: int  # problem order seed


@dataclass(frozen=True)
class GroupRef:
    """Where a group's rows are and when they were generated (the accumulator's payload)."""

    problem_id: str
    source: str  # the scored shard holding the group's rows
    generated_step: int  # the step whose rollout generated it


@dataclass(frozen=True)
class GeneratedRound:
    """One generation round's groups, as the accumulator takes them, and the stages' figures."""

    groups: list[tuple[str, str, GroupRef]]  # (group key, filter reason, ref), in shard order
    stats: dict[str, Any] = field(default_factory=dict)  # what rollout and scoring measured


@dataclass(frozen=True)
class StepPlan:
    """What a step drew and what dynamic sampling made of it."""

    step: int
    requests: list[list[str]]  # problem ids drawn, per generation round
    request_epochs: list[list[int]]  # the epoch each of those draws served (workflows/problem_order.py)
    result: DynamicSamplingResult
    round_stats: list[dict[str, Any]]

    @property
    def skipped(self) -> bool:
        """True when no informative group was found (``train_on_partial`` only)."""
        return not self.result.kept

    def policy_lags(self) -> list[int]:
        """Steps between generation and this training step, per kept group (0 = fresh)."""
        return [self.step - ref.generated_step for _, ref in self.result.kept]

    def carried_groups(self) -> int:
        """Kept groups that were carried in as surplus from an earlier step."""
        return sum(1 for lag in self.policy_lags() if lag > 0)


class StepStages(Protocol):
    """What the loop needs from whatever runs the stages."""

    async def generate(self, step: int, generation_round: int, problem_ids: list[str]) -> GeneratedRound:
        """Roll out and score ``problem_ids`` with the current policy."""
        ...

    async def train(self, plan: StepPlan) -> None:
        """Train on ``plan.result.kept`` (or record a skipped step without changing the policy)."""
        ...


def settle_carried(carried: Sequence[tuple[str, GroupRef]]) -> set[str]:
    """The problems carried surplus groups hold; each may be carried once."""
    problems = [ref.problem_id for _, ref in carried]
    if len(set(problems)) != len(problems):
        raise ValueError(f"carried surplus holds a problem twice: {sorted(problems)}")
    return set(problems)


async def sample_step(
    step: int,
    order: ProblemOrder,
    carried: Sequence[tuple[str, GroupRef]],
    settings: LoopSettings,
    stages: StepStages,
) -> StepPlan:
    """Generation rounds until dynamic sampling holds the batch (sec. 3.2), or the rounds run out."""
    acc = DynamicSamplingAccumulator(
        target_groups=settings.prompts_per_step, max_rounds=settings.max_rounds,
        on_max_rounds=settings.on_max_rounds, carried=carried,  # type: ignore[arg-type]
    )
    live = settle_carried(carried)
    requests: list[list[str]] = []
    epochs: list[list[int]] = []
    round_stats: list[dict[str, Any]] = []
    while acc.needs_more():
        drawn = order.draw_with_epochs(settings.prompts_per_round, live)
        ids = [pid for pid, _ in drawn]
        live.update(ids)
        requests.append(ids)
        epochs.append([epoch for _, epoch in drawn])
        generated = await stages.generate(step, acc.rounds, ids)
        round_stats.append(generated.stats)
        acc.add_round(generated.groups)
    return StepPlan(step=step, requests=requests, request_epochs=epochs, result=acc.finish(), round_stats=round_stats)


async def run_steps(
    settings: LoopSettings, problem_ids: Sequence[str], stages: StepStages, *, plans: list[StepPlan] | None = None
) -> list[StepPlan]:
    """Every step of a run, in order; returns (and appends to ``plans`` as it goes) each step's plan.

    A re-run or resume calls this again from step 1: the stages answer finished work from their
    cache, so the order, the surplus and every plan come out the same.
    """
    order = ProblemOrder(problem_ids, seed=settings.seed)
    check_pool_size(order.pool_size, prompts_per_step=settings.prompts_per_step,
                    prompts_per_round=settings.prompts_per_round, max_rounds=settings.max_rounds)
    out = plans if plans is not None else []
    carried: list[tuple[str, GroupRef]] = []
    for step in range(1, settings.steps + 1):
        plan = await sample_step(step, order, carried, settings, stages)
        await stages.train(plan)
        carried = list(plan.result.surplus)  # type: ignore[arg-type]
        out.append(plan)
    return out


__all__ = ["GeneratedRound", "GroupRef", "LoopSettings", "StepPlan", "StepStages", "run_steps", "sample_step"]
