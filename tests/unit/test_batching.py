"""engines/batch/stage.py: a step's batch is its kept groups, and a group is one (step, round, problem,
checkpoint) (dapo_core.sampling.group_key), also where two steps generate from one checkpoint."""

from __future__ import annotations

import pyarrow as pa

import schemas
from dapo_core.sampling import group_key
from engines.batch.stage import assemble_tables
from engines.score.stage import group_keys_of

PID, CKPT, G = "a" * 16, "bootstrap-0000-x", 4


def _scored(seed: int) -> pa.Table:
    """G scored rows of problem PID, round 0, checkpoint CKPT: one step's group (seeds tell steps apart)."""
    rows = [{
        "rollout_id": f"{PID}-r0-s{i}-{seed}", "problem_id": PID, "sample_index": i, "prompt_token_ids": [5],
        "response_token_ids": [7], "response_text": "x", "rollout_log_probs": [-0.5], "response_length": 1,
        "finish_reason": "stop", "truncated": False, "checkpoint_id": CKPT, "policy_version": 0, "seed": seed + i,
        "generation_round": 0, "gold_answer": 1, "extracted_answer": None, "correct": i % 2 == 0,
        "verdict_status": "ok", "rule_reward": 1.0 if i % 2 == 0 else -1.0, "overlong_penalty": 0.0,
        "reward": 1.0 if i % 2 == 0 else -1.0, "advantage": 0.0, "loss_masked": False, "kept": True,
        "filter_reason": "kept", "reward_version": "v",
    } for i in range(G)]
    return pa.Table.from_pylist(rows, schema=schemas.arrow_schema(schemas.ScoredRollout))


def test_two_steps_drawing_one_problem_in_one_round_from_one_checkpoint_are_two_groups() -> None:
    # Pipelined after a skipped step, steps 3 and 4 generate from one checkpoint; step 3's surplus
    # shard is read beside step 4's rounds, and both drew problem PID in round 0.
    step3, step4 = _scored(seed=300), _scored(seed=400)
    scored = [(3, step3), (4, step4)]
    (round_key,) = set(group_keys_of(step4))
    batch, surplus = assemble_tables(scored, [group_key(4, round_key)], [group_key(3, round_key)])
    assert batch.num_rows == G and surplus.num_rows == G
    assert batch.column("rollout_id").to_pylist() == step4.column("rollout_id").to_pylist()
    assert surplus.column("rollout_id").to_pylist() == step3.column("rollout_id").to_pylist()
