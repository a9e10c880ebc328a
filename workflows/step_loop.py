"""The DAPO step loop's control flow, apart from whatever runs the stages.

For every training step: draw problems for a generation round, generate and score them, hand the
groups to dynamic sampling (paper sec. 3.2), repeat until the batch is full or ``max_rounds`` is
spent, then train on the batch and carry the surplus into the next step. The stages are behind
:class:`StepStages`: the driver runs them as cached Flyte tasks, the simulation
(tests/unit/test_step_loop_sim.py) as fast stand-ins, so both run this code. Outcomes: ``full``,
``partial``, ``skipped`` or ``DynamicSamplingExhaustedError``. Pipelined (``run.pipelined``),
step N+1's rounds are generated from the policy after step N-1 while step N trains. A round draws
``prompts_per_round`` problems, or (``run.round_size: adaptive``) only as many as the groups still
needed take at the informative-group rate of the run's latest rounds (:func:`round_prompts`).

Design notes (outcomes, what the simulation checks, pipelining): docs/ARCHITECTURE.md,
"Step loop (workflows/step_loop.py)".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dapo_core.sampling import (
    DynamicSamplingAccumulator,
    DynamicSamplingResult,
    RoundReport,
    adaptive_round_prompts,
    group_key,
    recent_informative_rate,
)
from workflows.problem_order import ProblemOrder, check_pool_size


@dataclass(frozen=True)
class LoopSettings:
    """The driver's loop shape (unpacked from ``DriverConfig`` at the driver's boundary)."""

    steps: int  # training steps
    prompts_per_step: int  # informative groups one batch holds
    prompts_per_round: int  # problems one generation round draws (adaptive: at most)
    max_rounds: int  # generation rounds a step may use
    on_max_rounds: str  # "raise" or "train_on_partial"
    seed: int  # problem order seed
    pipelined: bool = False  # generate step N+1 while step N trains, from the policy after step N-1
    round_size: str = "fixed"  # "fixed": every round draws prompts_per_round; "adaptive": round_prompts


@dataclass(frozen=True)
class GroupRef:
    """Where a group's rows are and when they were generated (the accumulator's payload)."""

    problem_id: str
    source: str  # the scored shard holding the group's rows
    generated_step: int  # the step whose rollout generated it
    behaviour_step: int  # the policy that generated it: as it stood after this step (0 = the step-0 policy)


@dataclass(frozen=True)
class GeneratedRound:
    """One generation round's groups, as the accumulator takes them, and the stages' figures."""

    groups: list[tuple[str, str, GroupRef]]  # (round group key, filter reason, ref), in shard order
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
        """Steps the generating policy is behind the one this step trains, per kept group (0 = on-policy).

        Step s trains the policy as it stood after step s - 1; a group generated from the policy
        after step b is ``s - 1 - b`` steps behind (carried surplus: 1 per step carried; pipelined:
        1 more). Counted in steps: a skipped step in between counts although it changed nothing.
        """
        return [self.step - 1 - ref.behaviour_step for _, ref in self.result.kept]

    def carried_groups(self) -> int:
        """Kept groups that were carried in as surplus from an earlier step (a pipelined step's own
        groups are stale too, but not carried: they count in ``policy_lags`` only)."""
        return sum(1 for _, ref in self.result.kept if ref.generated_step < self.step)


class StepStages(Protocol):
    """What the loop needs from whatever runs the stages."""

    async def generate(self, step: int, generation_round: int, problem_ids: list[str], behaviour_step: int) -> GeneratedRound:
        """Roll out and score ``problem_ids`` with the policy as it stood after step ``behaviour_step``.

        That policy is published before the call (``train`` of that step has returned), also when
        later steps train meanwhile (pipelined); the returned refs record ``behaviour_step``.
        """
        ...

    async def train(self, plan: StepPlan) -> None:
        """Train on ``plan.result.kept`` (or record a skipped step without changing the policy)."""
        ...


# Adaptive rounds measure the informative-group rate over the latest rounds holding this many
# batches' worth of groups (~2.5 steps of the main job): the rate drifts as the policy learns
# (zero-signal groups 16% at step 1, ~45% by step 75 in runs/tiny-cpu), one round alone is noisy.
RATE_WINDOW_BATCHES = 4


def round_prompts(settings: LoopSettings, groups_needed: int, rounds_done: int, rounds_seen: Sequence[RoundReport]) -> int:
    """Problems the next generation round of a step draws.

    ``fixed``: ``prompts_per_round``. ``adaptive``: ``ceil(groups_needed / rate)``, at most
    ``prompts_per_round`` (dapo_core.sampling.adaptive_round_prompts), the rate measured over the
    run's latest rounds (``rounds_seen``: earlier steps' and this step's ``rounds_done`` so far).
    Before any round the prior is the configured over-sampling, ``prompts_per_step /
    prompts_per_round``: the user's own estimate of the rate, so the run's first round is the
    fixed one. A step's last allowed round draws the fixed size (its surplus is carried, a short
    batch is not made up).
    """
    if settings.round_size == "fixed":
        return settings.prompts_per_round
    per_round = settings.prompts_per_round
    informative, generated = recent_informative_rate(
        rounds_seen, window_groups=RATE_WINDOW_BATCHES * settings.prompts_per_step,
        prior=(min(settings.prompts_per_step, per_round), per_round))  # a rate of at most 1
    return adaptive_round_prompts(groups_needed, informative, generated, per_round,
                                  last_round=rounds_done + 1 >= settings.max_rounds)


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
    behaviour_step: int | None = None,
    rounds_seen: list[RoundReport] | None = None,
) -> StepPlan:
    """Generation rounds until dynamic sampling holds the batch (sec. 3.2), or the rounds run out.

    The rounds generate from the policy after step ``behaviour_step`` (default ``step - 1``: on-policy).
    ``rounds_seen``: the run's rounds so far, oldest first, which adaptive round sizes measure;
    each round of this step is appended (steps sample one after another, also pipelined, so the
    list grows in one order and a re-run replays it).
    """
    rounds_seen = [] if rounds_seen is None else rounds_seen
    behaviour_step = step - 1 if behaviour_step is None else behaviour_step
    acc = DynamicSamplingAccumulator(
        target_groups=settings.prompts_per_step, max_rounds=settings.max_rounds,
        on_max_rounds=settings.on_max_rounds, carried=carried,  # type: ignore[arg-type]
    )
    live = settle_carried(carried)
    requests: list[list[str]] = []
    epochs: list[list[int]] = []
    round_stats: list[dict[str, Any]] = []
    while acc.needs_more():
        drawn = order.draw_with_epochs(round_prompts(settings, acc.groups_needed, acc.rounds, rounds_seen), live)
        ids = [pid for pid, _ in drawn]
        live.update(ids)
        requests.append(ids)
        epochs.append([epoch for _, epoch in drawn])
        generated = await stages.generate(step, acc.rounds, ids, behaviour_step)
        round_stats.append(generated.stats)
        # A group is one (step, round, problem, checkpoint): two steps may generate one problem in
        # one round from one checkpoint (after a skipped step, or pipelined), so the step is part of its id.
        rounds_seen.append(acc.add_round([(group_key(step, key), reason, ref) for key, reason, ref in generated.groups]))
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
    rounds_seen: list[RoundReport] = []  # every round of the run, in order (adaptive round sizes)
    if not settings.pipelined:
        for step in range(1, settings.steps + 1):
            plan = await sample_step(step, order, carried, settings, stages, rounds_seen=rounds_seen)
            await stages.train(plan)
            carried = list(plan.result.surplus)  # type: ignore[arg-type]
            out.append(plan)
        return out
    plan = (await sample_step(1, order, carried, settings, stages, behaviour_step=0, rounds_seen=rounds_seen)
            if settings.steps else None)
    for step in range(1, settings.steps + 1):
        assert plan is not None
        carried = list(plan.result.surplus)  # type: ignore[arg-type]
        # Step N+1 draws after step N's draws (the same order as synchronously) and from the
        # policy after step N-1, published before step N's training starts.
        ahead = (sample_step(step + 1, order, carried, settings, stages, behaviour_step=step - 1, rounds_seen=rounds_seen)
                 if step < settings.steps else None)
        next_plan = await train_beside(stages.train(plan), ahead)
        out.append(plan)
        plan = next_plan
    return out


async def train_beside(training: Coroutine[Any, Any, None],
                       sampling: Coroutine[Any, Any, StepPlan] | None) -> StepPlan | None:
    """Await the ``training`` coroutine with the ``sampling`` one (or None) running beside it; returns its plan.

    A failed training step cancels the sampling (nothing runs on after the failure, as after a
    kill). A failed sampling (``DynamicSamplingExhaustedError`` under ``on_max_rounds: raise``, a
    task error) lets the training step finish first, so its checkpoint is published as the
    synchronous loop would have published it, then raises.
    """
    if sampling is None:
        await training
        return None
    ahead = asyncio.ensure_future(sampling)
    try:
        await training
    except BaseException:
        ahead.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await ahead
        raise
    return await ahead


__all__ = ["GeneratedRound", "GroupRef", "LoopSettings", "StepPlan", "StepStages", "round_prompts", "run_steps",
           "sample_step", "train_beside"]
