"""The score/filter stage: Rollout shards -> ScoredRollout shards.

For every response: the rule reward of paper eq. 7 (math-verify, process-isolated with a
timeout per verdict), the soft overlong punishment of eq. 13 and/or overlong filtering
(sec. 3.4), the group-relative advantage (eq. 9), and the dynamic-sampling decision of its
group (sec. 3.2: keep only groups with 0 < correct < G) with its reason. Timeouts and errors
of the verifier are counted, never silently turned into a plain wrong answer.

A group is the G samples of one problem generated in one round by one checkpoint.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import torch

import schemas
from dapo_core.advantages import estimate_advantages
from dapo_core.overlong import soft_overlong_penalty
from dapo_core.rewards import (
    REWARD_VERSION,
    Verdict,
    score_responses,
    summarize_verdicts,
)
from dapo_core.sampling import REASON_KEPT, group_filter_reason, round_group_key, zero_signal_groups
from engines.score.verifier_pool import process_judge
from settings.score import ScoreConfig


@dataclass(frozen=True)
class GroupDecision:
    """One group's dynamic-sampling verdict, as its rows in the ScoredRollout shard hold it."""

    group_key: str  # dapo_core.sampling.round_group_key: problem, checkpoint, round (the driver adds the step)
    filter_reason: str  # the rows' ``filter_reason`` (kept | all_correct | all_wrong | zero_reward_std)
    problem_id: str


@dataclass(frozen=True)
class ScoreStats:
    """Counts a scoring pass produces, folded into the step metrics, and every group's decision
    (what the driver's dynamic-sampling accumulator takes, so it need not read the shard back)."""

    samples: int = 0
    groups: int = 0
    informative_groups: int = 0
    zero_signal_groups: int = 0  # groups whose G rewards are all equal (no advantage, whatever the filter rule)
    accuracy: float = 0.0
    reward_mean: float = 0.0
    truncation_ratio: float = 0.0
    verdict_timeouts: int = 0
    verdict_errors: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    group_decisions: list[GroupDecision] = field(default_factory=list)  # one per group, first-row order


def group_keys_of(table: pa.Table) -> list[str]:
    """``round_group_key`` of every row of a Rollout/ScoredRollout table (of one step: the table
    records no step; dapo_core.sampling.group_key adds it where it is known)."""
    return [
        round_group_key(pid, ckpt, rnd)
        for pid, ckpt, rnd in zip(
            table.column("problem_id").to_pylist(),
            table.column("checkpoint_id").to_pylist(),
            table.column("generation_round").to_pylist(),
        )
    ]


def _gold_answers(problems: pa.Table, problem_ids: list[str], rollout_file: str) -> list[int]:
    gold = dict(zip(problems.column("problem_id").to_pylist(), problems.column("answer").to_pylist()))
    missing = sorted({pid for pid in problem_ids if pid not in gold})
    if missing:
        raise ValueError(
            f"{rollout_file}: {len(missing)} rollout problem_id(s) not in the problem shards, e.g. {missing[:3]}"
        )
    return [gold[pid] for pid in problem_ids]


@dataclass(frozen=True)
class _Rewards:
    """The per-response reward terms of N responses, each a tensor [N]."""

    truncated: torch.Tensor  # bool: cut by the response cap (finish reason ``length``)
    correct: torch.Tensor  # bool: the verdict, and not truncated when truncated_is_wrong
    rule_reward: torch.Tensor  # float32: +1 / -1 (eq. 7)
    penalty: torch.Tensor  # float32: soft overlong punishment (eq. 13), zeros when off
    reward: torch.Tensor  # float32: rule_reward + penalty


def _response_rewards(
    rollouts: pa.Table, verdicts: list[Verdict], *, max_response_tokens: int, config: ScoreConfig
) -> _Rewards:
    """Rule reward (eq. 7) plus the soft overlong penalty (eq. 13) of every response."""
    n = rollouts.num_rows
    truncated = torch.tensor(rollouts.column("truncated").to_pylist(), dtype=torch.bool)
    correct = torch.tensor([v.correct for v in verdicts], dtype=torch.bool)
    rule_reward = torch.tensor([v.reward for v in verdicts], dtype=torch.float32)
    if config.truncated_is_wrong:
        rule_reward = torch.where(truncated, torch.full_like(rule_reward, -1.0), rule_reward)
        correct = correct & ~truncated
    lengths = torch.tensor(rollouts.column("response_length").to_pylist(), dtype=torch.long)
    if config.soft_overlong_punishment:
        penalty = soft_overlong_penalty(
            lengths, max_response_tokens, config.overlong_buffer_tokens, config.overlong_penalty_factor
        ).to(torch.float32)
    else:
        penalty = torch.zeros(n, dtype=torch.float32)
    return _Rewards(truncated, correct, rule_reward, penalty, rule_reward + penalty)


def _group_reasons(
    group_keys: list[str], correct: torch.Tensor, reward: torch.Tensor, config: ScoreConfig
) -> tuple[dict[str, str], Counter[str]]:
    """(group key -> filter reason, count of each informativeness verdict) over the groups."""
    members: dict[str, list[int]] = {}
    for i, key in enumerate(group_keys):
        members.setdefault(key, []).append(i)
    # Dynamic sampling (sec. 3.2, eq. 11): a group whose samples all agree has zero advantage
    # and no gradient. The final kept/surplus split happens in the driver's accumulator; here
    # each group gets its informativeness verdict. Without dynamic sampling every group is kept.
    reasons: dict[str, str] = {}
    for key, rows in members.items():
        index = torch.tensor(rows)
        reasons[key] = group_filter_reason(correct[index], reward[index], by=config.informative_by)
    decision_counts = Counter(reasons.values())
    if not config.dynamic_sampling:
        reasons = {key: REASON_KEPT for key in reasons}
    return reasons, decision_counts


def _scored_columns(
    gold: list[int],
    verdicts: list[Verdict],
    rewards: _Rewards,
    advantages: torch.Tensor,
    filter_reason: list[str],
    config: ScoreConfig,
) -> dict[str, pa.Array]:
    """The columns a ScoredRollout adds to its Rollout row, in the order they are appended."""
    kept = [r == REASON_KEPT for r in filter_reason]
    # Overlong filtering (sec. 3.4): truncated samples stay in the shard for audit but are
    # flagged so the train stage masks them out of the loss.
    truncated = rewards.truncated
    loss_masked = (truncated if config.overlong_filtering else torch.zeros_like(truncated)).tolist()
    return {
        "gold_answer": pa.array(gold, pa.int64()),
        "extracted_answer": pa.array([v.extracted_answer for v in verdicts], pa.string()),
        "correct": pa.array(rewards.correct.tolist(), pa.bool_()),
        "verdict_status": pa.array([v.status for v in verdicts], pa.string()),
        "rule_reward": pa.array(rewards.rule_reward.tolist(), pa.float32()),
        "overlong_penalty": pa.array(rewards.penalty.tolist(), pa.float32()),
        "reward": pa.array(rewards.reward.tolist(), pa.float32()),
        "advantage": pa.array(advantages.tolist(), pa.float32()),
        "loss_masked": pa.array(loss_masked, pa.bool_()),
        "kept": pa.array(kept, pa.bool_()),
        "filter_reason": pa.array(filter_reason, pa.string()),
        "reward_version": pa.array([REWARD_VERSION] * len(gold), pa.string()),
    }


def _score_stats(
    samples: int, verdicts: list[Verdict], rewards: _Rewards, decisions: list[GroupDecision],
    decision_counts: Counter[str], zero_signal: int, start: float
) -> ScoreStats:
    """The step-metric counts of one scoring pass that began at ``start`` (perf_counter)."""
    verdict_counts = summarize_verdicts(verdicts)
    return ScoreStats(
        samples=samples,
        groups=len(decisions),
        informative_groups=decision_counts.get(REASON_KEPT, 0),
        zero_signal_groups=zero_signal,
        accuracy=float(rewards.correct.float().mean()),
        reward_mean=float(rewards.reward.mean()),
        truncation_ratio=float(rewards.truncated.float().mean()),
        verdict_timeouts=verdict_counts.timeout,
        verdict_errors=verdict_counts.error,
        decisions=dict(sorted(decision_counts.items())),
        seconds=time.perf_counter() - start,
        group_decisions=decisions,
    )


def score_table(
    rollouts: pa.Table,
    problems: pa.Table,
    *,
    max_response_tokens: int,
    config: ScoreConfig,
    source: str = "<rollouts>",
) -> tuple[pa.Table, ScoreStats]:
    """Score every response of ``rollouts`` (a Rollout table) and decide each group's fate.

    ``max_response_tokens`` is the rollout's hard cap L_max (eq. 13). Returns a ScoredRollout
    table in the input's row order and the counts for the step metrics.
    """
    start = time.perf_counter()
    if rollouts.num_rows == 0:
        raise ValueError(f"{source}: no rollouts to score")
    gold = _gold_answers(problems, rollouts.column("problem_id").to_pylist(), source)
    verdicts = score_responses(
        rollouts.column("response_text").to_pylist(),
        gold,
        timeout_s=config.reward_timeout_s,
        judge=process_judge(config.reward_workers or None),
    )
    rewards = _response_rewards(rollouts, verdicts, max_response_tokens=max_response_tokens, config=config)

    group_keys = group_keys_of(rollouts)
    advantages = estimate_advantages(config.advantage_estimator, rewards.reward, group_keys)
    reasons, decision_counts = _group_reasons(group_keys, rewards.correct, rewards.reward, config)
    filter_reason = [reasons[k] for k in group_keys]
    first_problem: dict[str, str] = {}
    for key, pid in zip(group_keys, rollouts.column("problem_id").to_pylist()):
        first_problem.setdefault(key, pid)
    decisions = [GroupDecision(key, reason, first_problem[key]) for key, reason in reasons.items()]

    scored = rollouts
    for name, column in _scored_columns(gold, verdicts, rewards, advantages, filter_reason, config).items():
        scored = scored.append_column(name, column)
    zero_signal = zero_signal_groups(group_keys, rewards.reward)
    return scored, _score_stats(rollouts.num_rows, verdicts, rewards, decisions, decision_counts, zero_signal, start)


def score_shards(
    rollout_paths: list[str],
    problem_paths: list[str],
    out_path: str,
    *,
    max_response_tokens: int,
    config: ScoreConfig,
) -> ScoreStats:
    """Read Rollout and Problem shards, score, and write one ScoredRollout shard atomically."""
    rollouts = schemas.read_shards(rollout_paths, schemas.Rollout)
    problems = schemas.read_shards(problem_paths, schemas.Problem)
    scored, stats = score_table(
        rollouts, problems, max_response_tokens=max_response_tokens, config=config, source=", ".join(rollout_paths)
    )
    schemas.write_shard(scored, out_path, schemas.ScoredRollout)
    return stats
