"""The driver's step loop run with fast stand-in stages: checks a config's shape in seconds.

:class:`SimulatedStages` answers the loop's questions (workflows/step_loop.py) the way the real
stages would, without a model: each problem has a solve rate, a group of G samples has a
seeded binomial number of correct answers, and dynamic sampling (sec. 3.2) keeps the groups
with 0 < correct < G. Finished "tasks" are kept in a :class:`SimulatedCache` keyed by their inputs,
as Flyte's cache keys a task by its inputs, so a run stopped anywhere and started again replays
over cache hits exactly like a real resume.

Training yields to the event loop a seeded number of times before it finishes, as a real train
task does while its workers run, so in pipelined mode (``LoopSettings.pipelined``) the next
step's rounds really interleave with it; ``events`` records the order. A round asks for the
policy after a given step, which must have been published already (else the loop is wrong).

Used by tests/unit/test_step_loop_sim.py (invariants over thousands of simulated runs) and
benchmarks/sampling_plan.py (what a config costs for an assumed solve-rate distribution).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dapo_core.sampling import (
    REASON_ALL_CORRECT,
    REASON_ALL_WRONG,
    REASON_KEPT,
    round_group_key,
)
from workflows.step_loop import (
    GeneratedRound,
    GroupRef,
    LoopSettings,
    StepPlan,
    run_steps,
)


class SimulatedStop(RuntimeError):
    """Raised by the stand-in stages where a simulated run is killed."""


def _seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


@dataclass
class SimulatedCache:
    """What finished stand-in tasks left behind, keyed by their inputs (shared by a run and its resume)."""

    rounds: dict[tuple[object, ...], GeneratedRound] = field(default_factory=dict)
    checkpoints: dict[tuple[object, ...], str] = field(default_factory=dict)


class SimulatedStages:
    """Stand-in rollout+score and train stages for :func:`workflows.step_loop.run_steps`.

    ``solve_rates`` maps each problem id to its chance that one sample is correct; the policy
    never changes them (the loop's behaviour, not learning, is what is simulated). ``stop_at``
    is ``("generate", step, round)`` or ``("train", step, -1)``: the call that is not finished
    yet when the run is killed (a cached call is answered even there, as a real resume would).
    """

    def __init__(
        self,
        solve_rates: Mapping[str, float],
        samples_per_prompt: int,
        *,
        seed: int = 0,
        cache: SimulatedCache | None = None,
        stop_at: tuple[str, int, int] | None = None,
    ) -> None:
        self._ids = sorted(solve_rates)
        self._index = {pid: i for i, pid in enumerate(self._ids)}
        self._rates = np.array([solve_rates[pid] for pid in self._ids], dtype=np.float64)
        self.samples_per_prompt = samples_per_prompt
        self.seed = seed
        self.cache = cache if cache is not None else SimulatedCache()
        self.stop_at = stop_at
        self.checkpoint = "step-0000"
        self.policy_after: dict[int, str] = {0: self.checkpoint}  # the policy as it stood after each step
        self.generated_from: list[tuple[int, int, int]] = []  # (step, round, behaviour step) of every generate call
        self.events: list[tuple[object, ...]] = []  # generate / train_start / train_end, in the order they happened
        self.killed = False  # after the simulated kill, no call finishes new work (kill -9 stops everything)
        self.requests: list[tuple[int, int, list[str]]] = []  # every generate call, cached or not
        self.trained: list[tuple[int, list[str]]] = []  # (step, group keys) of every train call
        self.samples_generated = 0

    async def generate(self, step: int, generation_round: int, problem_ids: list[str], behaviour_step: int) -> GeneratedRound:
        if behaviour_step not in self.policy_after:
            raise AssertionError(f"step {step} round {generation_round} asks for the policy after step {behaviour_step}, "
                                 f"not published yet (published: {sorted(self.policy_after)})")
        checkpoint = self.policy_after[behaviour_step]
        self.events.append(("generate", step, generation_round))
        key = (checkpoint, step, generation_round, tuple(problem_ids))
        if key not in self.cache.rounds:
            if self.killed or self.stop_at == ("generate", step, generation_round):
                self.killed = True
                raise SimulatedStop(f"killed before step {step} round {generation_round} finished")
            self.cache.rounds[key] = self._generate(checkpoint, step, generation_round, problem_ids, behaviour_step)
        self.requests.append((step, generation_round, list(problem_ids)))
        self.generated_from.append((step, generation_round, behaviour_step))
        self.samples_generated += len(problem_ids) * self.samples_per_prompt
        return self.cache.rounds[key]

    def _generate(self, checkpoint: str, step: int, generation_round: int, problem_ids: list[str],
                  behaviour_step: int) -> GeneratedRound:
        rng = np.random.default_rng(_seed_of(self.seed, checkpoint, step, generation_round))
        rates = self._rates[[self._index[pid] for pid in problem_ids]]
        correct = rng.binomial(self.samples_per_prompt, rates)
        groups = []
        source = f"step-{step:04d}/round-{generation_round:02d}"
        for pid, n in zip(problem_ids, correct.tolist()):
            reason = REASON_ALL_CORRECT if n == self.samples_per_prompt else REASON_ALL_WRONG if n == 0 else REASON_KEPT
            groups.append((round_group_key(pid, checkpoint, generation_round), reason,
                           GroupRef(problem_id=pid, source=source, generated_step=step, behaviour_step=behaviour_step)))
        accuracy = float(correct.sum()) / max(1, len(problem_ids) * self.samples_per_prompt)
        return GeneratedRound(groups=groups, stats={"samples": len(problem_ids) * self.samples_per_prompt,
                                                    "accuracy": accuracy})

    async def train(self, plan: StepPlan) -> None:
        self.events.append(("train_start", plan.step))
        kept = [gid for gid, _ in plan.result.kept]
        if plan.skipped:
            self.trained.append((plan.step, []))
        else:
            key = (self.checkpoint, plan.step, tuple(kept))
            if key not in self.cache.checkpoints:
                # The workers run: whatever runs beside this step (pipelined rounds) gets turns.
                for _ in range(1 + _seed_of(self.seed, "train", plan.step) % 4):
                    await asyncio.sleep(0)
                if self.killed or self.stop_at == ("train", plan.step, -1):
                    self.killed = True
                    raise SimulatedStop(f"killed before step {plan.step} finished training")
                self.cache.checkpoints[key] = f"step-{plan.step:04d}-{_seed_of(*key) % 10**8:08d}"
            self.checkpoint = self.cache.checkpoints[key]
            self.trained.append((plan.step, kept))
        self.policy_after[plan.step] = self.checkpoint
        self.events.append(("train_end", plan.step))


def simulate(
    settings: LoopSettings,
    solve_rates: Mapping[str, float],
    samples_per_prompt: int,
    *,
    cache: SimulatedCache | None = None,
    stop_at: tuple[str, int, int] | None = None,
) -> tuple[list[StepPlan], SimulatedStages]:
    """Run the real step loop over stand-in stages; returns the plans and the stages (their records).

    Raises what the loop raises (``SimulatedStop`` at ``stop_at``, ``DynamicSamplingExhaustedError``
    under ``on_max_rounds: raise``, ``PoolTooSmallError``); the plans made so far are then on
    ``stages.plans``.
    """
    stages = SimulatedStages(solve_rates, samples_per_prompt, seed=settings.seed, cache=cache, stop_at=stop_at)
    plans: list[StepPlan] = []
    stages.plans = plans  # type: ignore[attr-defined]
    asyncio.run(run_steps(settings, list(solve_rates), stages, plans=plans))
    return plans, stages


def beta_solve_rates(problem_ids: Sequence[str], *, a: float, b: float, all_solved: float = 0.0,
                     all_failed: float = 0.0, seed: int = 0) -> dict[str, float]:
    """Per-problem solve rates: Beta(a, b), with the given shares pinned at exactly 1 and 0."""
    rng = np.random.default_rng(seed)
    rates = rng.beta(a, b, size=len(problem_ids))
    pinned = rng.random(len(problem_ids))
    rates[pinned < all_solved] = 1.0
    rates[(pinned >= all_solved) & (pinned < all_solved + all_failed)] = 0.0
    return dict(zip(problem_ids, rates.tolist()))


__all__ = ["SimulatedCache", "SimulatedStages", "SimulatedStop", "beta_solve_rates", "simulate"]
