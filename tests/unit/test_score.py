"""The score/filter stage on hand-made rollouts: rewards, eq. 13 penalty, advantages, group decisions, counts."""

import pyarrow as pa
import pytest

import schemas
from engines.score.stage import score_table
from settings.score import ScoreConfig

PID_A, PID_B = "a" * 16, "b" * 16


def _rollouts(texts_a: list[str], texts_b: list[str], lengths: list[int]) -> pa.Table:
    rows = []
    for i, (pid, text) in enumerate([(PID_A, t) for t in texts_a] + [(PID_B, t) for t in texts_b]):
        n = lengths[i]
        rows.append({
            "rollout_id": f"{pid}-r0-s{i}", "problem_id": pid, "sample_index": i, "prompt_token_ids": [5, 6],
            "response_token_ids": [7] * n, "response_text": text, "rollout_log_probs": [-0.5] * n,
            "response_length": n, "finish_reason": "length" if n == 10 else "stop", "truncated": n == 10,
            "checkpoint_id": "bootstrap-0000-x", "policy_version": 0, "seed": i, "generation_round": 0,
        })
    return pa.Table.from_pylist(rows, schema=schemas.arrow_schema(schemas.Rollout))


PROBLEMS = pa.Table.from_pylist(
    [{"problem_id": PID_A, "answer": 34}, {"problem_id": PID_B, "answer": 7}],
)


def test_rewards_penalty_advantages_and_group_decisions() -> None:
    # group A: one right, one wrong -> informative ("kept"); group B: both wrong -> "all_wrong"
    rollouts = _rollouts(["Answer: 34", "Answer: 35"], ["Answer: 8", "no answer"], lengths=[4, 9, 4, 10])
    config = ScoreConfig(overlong_buffer_tokens=4, overlong_filtering=True, reward_timeout_s=2.0)
    scored, stats = score_table(rollouts, PROBLEMS, max_response_tokens=10, config=config)
    schemas.validate_table(scored, schemas.ScoredRollout)
    rows = scored.to_pylist()
    assert [r["correct"] for r in rows] == [True, False, False, False]
    assert [r["rule_reward"] for r in rows] == [1.0, -1.0, -1.0, -1.0]
    # eq. 13 with L_max=10, L_cache=4: penalty starts after 6 tokens; 9 tokens -> (6-9)/4 = -0.75; 10 -> -1
    assert [r["overlong_penalty"] for r in rows] == [0.0, -0.75, 0.0, -1.0]
    assert [r["reward"] for r in rows] == [1.0, -1.75, -1.0, -2.0]
    # group A rewards (1, -1.75): mean -0.375, unbiased std 1.9445 -> advantages +-0.7071
    assert rows[0]["advantage"] == pytest.approx(0.70710, abs=1e-4)
    assert rows[1]["advantage"] == pytest.approx(-0.70710, abs=1e-4)
    assert [r["filter_reason"] for r in rows] == ["kept", "kept", "all_wrong", "all_wrong"]
    assert [r["kept"] for r in rows] == [True, True, False, False]
    # overlong filtering masks the truncated sample only
    assert [r["loss_masked"] for r in rows] == [False, False, False, True]
    assert stats.samples == 4 and stats.groups == 2 and stats.informative_groups == 1
    assert stats.decisions == {"all_wrong": 1, "kept": 1}
    assert stats.accuracy == 0.25 and stats.truncation_ratio == 0.25


def test_verifier_timeouts_are_counted_and_wrong() -> None:
    rollouts = _rollouts(["\\boxed{9^{9^{9^{9}}}}", "Answer: 34"], ["Answer: 7", "Answer: 7"], lengths=[4, 4, 4, 4])
    scored, stats = score_table(rollouts, PROBLEMS, max_response_tokens=10, config=ScoreConfig(reward_timeout_s=1.0, overlong_buffer_tokens=4))
    assert scored.column("verdict_status").to_pylist()[0] == "timeout"
    assert scored.column("rule_reward").to_pylist()[0] == -1.0
    assert stats.verdict_timeouts == 1 and stats.verdict_errors == 0
    # group B is all correct: no signal, dropped by dynamic sampling
    assert scored.column("filter_reason").to_pylist()[2:] == ["all_correct", "all_correct"]


def test_without_dynamic_sampling_every_group_is_kept_and_unknown_problems_are_errors() -> None:
    rollouts = _rollouts(["Answer: 34", "Answer: 34"], ["Answer: 8", "Answer: 8"], lengths=[4, 4, 4, 4])
    scored, stats = score_table(rollouts, PROBLEMS, max_response_tokens=10, config=ScoreConfig(dynamic_sampling=False, overlong_buffer_tokens=4))
    assert all(scored.column("kept").to_pylist())
    assert stats.decisions == {"all_correct": 1, "all_wrong": 1}  # still reported
    with pytest.raises(ValueError, match="not in the problem shards"):
        score_table(rollouts, PROBLEMS.slice(0, 1), max_response_tokens=10, config=ScoreConfig(overlong_buffer_tokens=4), source="r.parquet")


def _groups_from_shard(scored: pa.Table) -> list[tuple[str, str, str]]:
    """(group key, filter reason, problem id) per group in first-row order, read from the rows:
    what the driver used to re-read the scored shard for."""
    from engines.score.stage import group_keys_of

    seen: dict[str, tuple[str, str]] = {}
    for key, reason, pid in zip(group_keys_of(scored), scored.column("filter_reason").to_pylist(),
                                scored.column("problem_id").to_pylist()):
        seen.setdefault(key, (reason, pid))
    return [(key, reason, pid) for key, (reason, pid) in seen.items()]


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_score_stats_carry_the_group_decisions_the_shard_holds(dynamic_sampling: bool) -> None:
    # Interleaved rows (B before A, A's rows apart): first-row order, one entry per group.
    rows = _rollouts(["Answer: 34", "Answer: 35"], ["Answer: 7", "Answer: 8"], lengths=[4, 4, 4, 4])
    rollouts = rows.take(pa.array([2, 0, 3, 1]))
    config = ScoreConfig(overlong_buffer_tokens=4, dynamic_sampling=dynamic_sampling)
    scored, stats = score_table(rollouts, PROBLEMS, max_response_tokens=10, config=config)
    got = [(d.group_key, d.filter_reason, d.problem_id) for d in stats.group_decisions]
    assert got == _groups_from_shard(scored)
    assert [pid for _, _, pid in got] == [PID_B, PID_A]
    assert len(got) == stats.groups


def test_zero_signal_groups_are_the_groups_with_all_equal_rewards_whatever_the_filter_rule() -> None:
    # A: both correct, one penalised (9 tokens: 1 - 0.75) -> "all_correct" by eq. 11, but its rewards
    # differ, so it has signal; B: both wrong, equal rewards -> zero signal (TRL's frac_reward_zero_std).
    rollouts = _rollouts(["Answer: 34", "Answer: 34"], ["Answer: 8", "Answer: 9"], lengths=[4, 9, 4, 4])
    _, stats = score_table(rollouts, PROBLEMS, max_response_tokens=10, config=ScoreConfig(overlong_buffer_tokens=4))
    assert stats.decisions == {"all_correct": 1, "all_wrong": 1} and stats.informative_groups == 0
    assert stats.zero_signal_groups == 1
