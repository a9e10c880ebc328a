"""Dynamic sampling (paper sec. 3.2, the constraint 0 < |{o_i correct}| < G of eq. 11).

A group whose G responses are all right or all wrong has zero reward variance, hence zero
advantage for every response (eq. 9) and no policy gradient: it only dilutes the batch. DAPO
over-samples and keeps generating until the training batch holds ``target_groups`` informative
groups. This module holds the pure pieces:

* ``group_filter_reasons`` / ``group_filter_reason``: is a group informative, and if not, why.
* ``DynamicSamplingAccumulator``: collects informative groups over generation rounds, keeps the
  groups beyond the target as surplus for the next step (instead of throwing away paid-for
  generations), counts rounds and stops at ``max_rounds`` with an explicit outcome.
* ``zero_signal_groups``: how many groups have all-equal rewards (no advantage, no gradient).
* ``recent_informative_rate`` / ``adaptive_round_prompts``: the size of the next round when rounds
  follow the measured informative-group rate (``run.round_size: adaptive``) instead of drawing a
  fixed ``prompts_per_round`` (``fixed``, the default and the paper's over-sampling).

Note on carried surplus: those groups may have been sampled by an earlier checkpoint than the one
the step updates, so they are off-policy. The driver records each kept group's lag in steps
(between generation and training, workflows/step_loop.py); surplus is always smaller than one
round, so that lag is at most ``1 + (prompts_per_round - 2) // target_groups`` steps. Nothing here
corrects for it: the trainer does, per sample from its recorded ``policy_version`` and rollout
log-probs (decoupled PPO behaviour weights, dapo_core/correction.py; engines/train/step.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

__all__ = [
    "REASON_ALL_CORRECT",
    "REASON_ALL_WRONG",
    "REASON_KEPT",
    "REASON_SURPLUS",
    "REASON_ZERO_REWARD_STD",
    "DynamicSamplingAccumulator",
    "DynamicSamplingExhaustedError",
    "DynamicSamplingResult",
    "RoundReport",
    "adaptive_round_prompts",
    "recent_informative_rate",
    "zero_signal_groups",
    "group_filter_reason",
    "group_key",
    "round_group_key",
    "group_filter_reasons",
]

REASON_KEPT = "kept"
REASON_ALL_CORRECT = "all_correct"
REASON_ALL_WRONG = "all_wrong"
REASON_SURPLUS = "surplus"
# Only reachable with by="reward_std" when rewards tie although correctness differs; cannot happen
# with the +1/-1 rule reward plus a penalty in [-1, 0] (correct >= 0 > -1 >= wrong).
REASON_ZERO_REWARD_STD = "zero_reward_std"
_INPUT_REASONS = (REASON_KEPT, REASON_ALL_CORRECT, REASON_ALL_WRONG, REASON_ZERO_REWARD_STD)

OnMaxRounds = Literal["raise", "train_on_partial"]
Criterion = Literal["accuracy", "reward_std"]


def group_filter_reasons(
    correct: torch.Tensor, rewards: torch.Tensor | None = None, *, by: Criterion = "accuracy"
) -> list[str]:
    """Classify B groups of G responses each.

    Args:
        correct: ``[B, G]`` bool, whether each response's answer is right.
        rewards: ``[B, G]`` float final rewards; needed only for ``by="reward_std"``.
        by: ``"accuracy"`` - eq. 11 literally: informative iff 0 < #correct < G.
            ``"reward_std"`` - informative iff the group's rewards are not all equal (std > 0);
            with soft overlong punishment an all-correct group can still carry signal this way.

    Returns:
        B reason strings: ``"kept"``, ``"all_correct"``, ``"all_wrong"`` (or ``"zero_reward_std"``).
    """
    if correct.dtype != torch.bool or correct.dim() != 2:
        raise TypeError(f"correct must be a bool tensor [B, G], got dtype {correct.dtype} shape {tuple(correct.shape)}")
    if by not in ("accuracy", "reward_std"):
        raise ValueError(f"by must be 'accuracy' or 'reward_std', got {by!r}")
    group_size = correct.shape[1]
    n_correct = correct.sum(dim=1)
    all_correct = n_correct == group_size
    all_wrong = n_correct == 0
    if by == "accuracy":
        informative = ~all_correct & ~all_wrong
    else:
        if rewards is None or rewards.shape != correct.shape:
            raise ValueError(f"by='reward_std' needs rewards of shape {tuple(correct.shape)}, "
                             f"got {None if rewards is None else tuple(rewards.shape)}")
        # max > min is "std > 0" without rounding noise from computing a std.
        informative = rewards.amax(dim=1) > rewards.amin(dim=1)
    reasons = []
    for keep, good, bad in zip(informative.tolist(), all_correct.tolist(), all_wrong.tolist()):
        if keep:
            reasons.append(REASON_KEPT)
        elif good:
            reasons.append(REASON_ALL_CORRECT)
        elif bad:
            reasons.append(REASON_ALL_WRONG)
        else:
            reasons.append(REASON_ZERO_REWARD_STD)
    return reasons


def group_filter_reason(
    correct: torch.Tensor, rewards: torch.Tensor | None = None, *, by: Criterion = "accuracy"
) -> str:
    """``group_filter_reasons`` for one group: ``correct [G]`` bool, ``rewards [G]``."""
    return group_filter_reasons(correct.unsqueeze(0), None if rewards is None else rewards.unsqueeze(0), by=by)[0]


def round_group_key(problem_id: str, checkpoint_id: str, generation_round: int) -> str:
    """A group's key among the rows of one generation round: its problem, checkpoint and round.

    Unique within one step (a step never draws a problem twice, nor one carried into it:
    workflows/problem_order.py), not across steps: after a skipped step, or pipelined, two steps
    generate from one checkpoint and may draw one problem in the same round. Scoring groups one
    round's rows by it; across steps a group is ``group_key``.
    """
    return f"{problem_id}|{checkpoint_id}|{generation_round}"


def group_key(step: int, round_key: str) -> str:
    """The id of a group in a run: one (step, round, problem, checkpoint), the G samples of one
    problem that one step generated in one round from one checkpoint.

    ``round_key`` is ``round_group_key``; the step is appended, so the order of groups (arrival
    order, never the key's text) is unchanged.
    """
    return f"{round_key}|step-{step}"


class DynamicSamplingExhaustedError(RuntimeError):
    """Raised when ``max_rounds`` generation rounds did not yield ``target_groups`` informative groups."""


@dataclass(frozen=True)
class RoundReport:
    """What one generation round contributed (for step metrics)."""

    round_index: int  # 1-based generation round within this step
    generated_groups: int  # groups generated and scored this round
    informative_groups: int  # of those, groups with reason "kept" (before any surplus split)
    reason_counts: dict[str, int] = field(default_factory=dict)  # input reason -> number of groups


@dataclass(frozen=True)
class DynamicSamplingResult:
    """The outcome of one step's dynamic sampling.

    ``kept`` and ``surplus`` hold ``(group_id, payload)`` pairs in arrival order (carried groups
    first). ``final_reasons`` maps every group seen this step to kept | all_correct | all_wrong |
    surplus (| zero_reward_std), the ``filter_reason`` shard column.
    """

    # "partial": fewer than target_groups, "skipped": none at all (both only with
    # on_max_rounds="train_on_partial"; a skipped step trains nothing and keeps the policy)
    outcome: Literal["full", "partial", "skipped"]
    target_groups: int
    rounds: int  # generation rounds used (0 when carried surplus alone filled the batch)
    kept: list[tuple[str, object]]
    surplus: list[tuple[str, object]]
    final_reasons: dict[str, str]
    round_reports: list[RoundReport]
    carried_in: int  # how many kept/surplus groups came from the previous step's surplus


class DynamicSamplingAccumulator:
    """Collects informative groups over generation rounds until the batch is full (sec. 3.2).

    Usage (one training step)::

        acc = DynamicSamplingAccumulator(target_groups=512, max_rounds=8, carried=prev.surplus)
        while acc.needs_more():
            acc.add_round([(group_id, reason, payload), ...])   # one generate + score round
        result = acc.finish()   # result.kept -> train on these; result.surplus -> next step

    Groups are identified by a string id (e.g. ``problem_id`` plus round); ``payload`` is opaque
    (row indices, rollout ids) so the task layer can map back to its rows.
    """

    def __init__(
        self,
        target_groups: int,
        max_rounds: int,
        on_max_rounds: OnMaxRounds = "raise",
        carried: Iterable[tuple[str, object]] = (),
    ) -> None:
        if target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {target_groups}")
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        if on_max_rounds not in ("raise", "train_on_partial"):
            raise ValueError(f"on_max_rounds must be 'raise' or 'train_on_partial', got {on_max_rounds!r}")
        self.target_groups = target_groups
        self.max_rounds = max_rounds
        self.on_max_rounds: OnMaxRounds = on_max_rounds
        self.rounds = 0
        self.informative: list[tuple[str, object]] = []  # arrival order, carried first
        self.rejected: dict[str, str] = {}  # group id -> reason
        self.round_reports: list[RoundReport] = []
        self._seen: set[str] = set()
        self._finished = False
        carried_list = list(carried)
        for gid, payload in carried_list:
            self._claim(gid, "carried surplus")
            self.informative.append((gid, payload))
        self.carried_in = len(carried_list)

    def _claim(self, group_id: str, where: str) -> None:
        if not isinstance(group_id, str):
            raise TypeError(f"group id must be a str, got {type(group_id).__name__} ({group_id!r}) in {where}")
        if group_id in self._seen:
            raise ValueError(f"duplicate group id {group_id!r} in {where}: each group may enter a step once")
        self._seen.add(group_id)

    @property
    def is_full(self) -> bool:
        """True once at least ``target_groups`` informative groups are held."""
        return len(self.informative) >= self.target_groups

    @property
    def groups_needed(self) -> int:
        """Informative groups still missing from the batch (0 once full)."""
        return max(0, self.target_groups - len(self.informative))

    def needs_more(self) -> bool:
        """True while the batch is short and another generation round is allowed."""
        return not self.is_full and self.rounds < self.max_rounds

    def add_round(self, groups: Sequence[tuple[str, str, object]]) -> RoundReport:
        """Record one generation round: ``(group_id, reason, payload)`` per generated group.

        ``reason`` comes from ``group_filter_reason(s)``. Raises if the batch is already full, the
        round budget is spent, or ``finish`` was called.
        """
        if self._finished:
            raise RuntimeError("add_round after finish(): start a new accumulator for the next step")
        if self.is_full:
            raise RuntimeError(f"batch already holds {len(self.informative)} >= {self.target_groups} "
                               "informative groups; call finish()")
        if self.rounds >= self.max_rounds:
            raise RuntimeError(f"max_rounds={self.max_rounds} generation rounds already used; call finish()")
        self.rounds += 1
        counts: dict[str, int] = {}
        where = f"generation round {self.rounds}"
        for position, entry in enumerate(groups):
            if len(entry) != 3:
                raise ValueError(f"{where}, entry {position}: expected (group_id, reason, payload), got {entry!r}")
            gid, reason, payload = entry
            if reason not in _INPUT_REASONS:
                raise ValueError(f"{where}, group {gid!r}: unknown reason {reason!r}; expected one of {_INPUT_REASONS}")
            self._claim(gid, where)
            counts[reason] = counts.get(reason, 0) + 1
            if reason == REASON_KEPT:
                self.informative.append((gid, payload))
            else:
                self.rejected[gid] = reason
        report = RoundReport(round_index=self.rounds, generated_groups=len(groups),
                             informative_groups=counts.get(REASON_KEPT, 0), reason_counts=counts)
        self.round_reports.append(report)
        return report

    def finish(self) -> DynamicSamplingResult:
        """Split into the training batch and the surplus; apply the max-rounds policy if short."""
        if self._finished:
            raise RuntimeError("finish() was already called on this accumulator")
        if not self.is_full and self.needs_more():
            raise RuntimeError(f"finish() called with {len(self.informative)}/{self.target_groups} groups after "
                               f"{self.rounds}/{self.max_rounds} rounds: keep generating while needs_more()")
        self._finished = True
        if not self.is_full and self.on_max_rounds == "raise":
            raise DynamicSamplingExhaustedError(
                f"dynamic sampling found only {len(self.informative)} of {self.target_groups} informative groups "
                f"after max_rounds={self.max_rounds} generation rounds (rejected: "
                f"{_count(self.rejected.values())}); raise max_rounds, use easier/harder prompts, or set "
                "on_max_rounds='train_on_partial'")
        kept = self.informative[: self.target_groups]
        surplus = self.informative[self.target_groups:]
        final = dict(self.rejected)
        final.update({gid: REASON_KEPT for gid, _ in kept})
        final.update({gid: REASON_SURPLUS for gid, _ in surplus})
        return DynamicSamplingResult(
            outcome="full" if self.is_full else ("partial" if kept else "skipped"),
            target_groups=self.target_groups,
            rounds=self.rounds,
            kept=kept,
            surplus=surplus,
            final_reasons=final,
            round_reports=list(self.round_reports),
            carried_in=self.carried_in,
        )


def zero_signal_groups(group_keys: Sequence[str], rewards: torch.Tensor) -> int:
    """Groups whose rewards are all equal: zero advantage for every sample (eq. 9), no gradient.

    ``group_keys`` names each of the N responses' group, ``rewards`` ``[N]`` their final rewards.
    The count TRL logs as ``frac_reward_zero_std`` (times the groups): with the +1/-1 reward it is
    the all-correct and all-wrong groups, less those the soft overlong penalty (eq. 13) split.
    """
    if rewards.dim() != 1 or rewards.shape[0] != len(group_keys):
        raise ValueError(f"rewards must be [N] with N = {len(group_keys)} group keys, got shape {tuple(rewards.shape)}")
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for key, value in zip(group_keys, rewards.tolist()):
        low[key] = min(low.get(key, value), value)
        high[key] = max(high.get(key, value), value)
    return sum(1 for key in low if low[key] == high[key])


def recent_informative_rate(
    rounds: Sequence[RoundReport], *, window_groups: int, prior: tuple[int, int]
) -> tuple[int, int]:
    """The informative-group rate of the latest rounds, as ``(informative, generated)`` groups.

    Pooled over the newest rounds (newest first) until they hold at least ``window_groups`` groups
    (all of them if fewer): the rate drifts as the policy learns (more groups all-correct), so old
    rounds mislead, while one round alone is noisy (96 groups: ~5 points of standard error).
    Pooling counts, not per-round rates, weighs a small last round by its size. Before any round,
    ``prior`` (the caller's expected rate as a pair of counts).
    """
    if window_groups < 1:
        raise ValueError(f"window_groups must be >= 1, got {window_groups}")
    informative = generated = 0
    for report in reversed(rounds):
        if generated >= window_groups:
            break
        informative += report.informative_groups
        generated += report.generated_groups
    return (informative, generated) if generated else prior


def adaptive_round_prompts(
    groups_needed: int, informative: int, generated: int, max_prompts: int, *, last_round: bool = False
) -> int:
    """Prompts the next generation round draws: ``ceil(groups_needed / rate)``, enough to fill the
    batch at the measured rate ``informative / generated``, clamped to
    ``[min(groups_needed, max_prompts), max_prompts]``.

    Exact in integers (``64`` needed at a rate of ``2/3`` draws ``96``, never ``97``). No informative
    group measured draws ``max_prompts``; so does the step's ``last_round``: a short last round
    leaves a partial step (or an exhausted error), while its surplus is carried to the next step,
    not lost. ``max_prompts`` is ``run.prompts_per_round``, so a round never outgrows the fixed size.
    """
    if groups_needed < 1:
        raise ValueError(f"groups_needed must be >= 1 (a full batch draws no round), got {groups_needed}")
    if max_prompts < 1:
        raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
    if not 0 <= informative <= generated or generated < 1:
        raise ValueError(f"need 0 <= informative <= generated and generated >= 1, got {informative} of {generated}")
    if last_round or informative == 0:
        return max_prompts
    wanted = -(-groups_needed * generated // informative)  # ceil(groups_needed * generated / informative)
    return max(min(groups_needed, max_prompts), min(wanted, max_prompts))


def _count(reasons: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts
