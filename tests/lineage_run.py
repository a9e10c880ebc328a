"""A small finished run folder built from shards directly (no model, no Flyte), for the lineage and
audit tests: three training steps with the shapes a real run writes, carried surplus included.

G = 4 samples per group, 2 groups per step. Problem names are single letters (ids are 16 hex chars):

- step 1, round 0: A (mixed) and B (mixed) are trained on; C is all correct (dropped); D (mixed)
  is surplus, carried into step 2.
- step 2, round 0: E (mixed, trained), F (all wrong); round 1: A (all correct). Its batch is D
  (carried from ``steps/step-0001/scored/round-00.parquet``) and E.
- step 3, round 0: A (mixed) and B (mixed), both trained; nothing carried.

A mixed group has 3 of 4 correct (sample indices 0-2). Shards are written with ``schemas.write_shard``
(validated), checkpoints as their ``dapo_checkpoint.json`` alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import schemas
from storage import checkpoints
from storage.run_layout import RunLayout

G = 4
PROBLEM_NAMES = "ABCDEF"
TEST_PROBLEM_NAMES = "XY"


def problem_id(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def checkpoint_id(step: int) -> str:
    return f"{'train' if step else 'import'}-{step:04d}-{step:016x}"


@dataclass(frozen=True)
class Group:
    """One group of G samples: its problem, how many are correct, and what dynamic sampling did."""

    name: str
    correct: int  # 0..G: samples 0..correct-1 are correct
    decision: str  # a ScoredRollout filter_reason of the scored shard: kept | all_correct | all_wrong


# step -> round -> groups generated in it
ROUNDS: dict[int, list[list[Group]]] = {
    1: [[Group("A", 3, "kept"), Group("B", 3, "kept"), Group("C", 4, "all_correct"), Group("D", 3, "kept")]],
    2: [[Group("E", 3, "kept"), Group("F", 0, "all_wrong")], [Group("A", 4, "all_correct")]],
    3: [[Group("A", 3, "kept"), Group("B", 3, "kept")]],
}
# step -> (step, round, problem) of the groups it trained on; the surplus it carried on
TRAINED: dict[int, list[tuple[int, int, str]]] = {1: [(1, 0, "A"), (1, 0, "B")], 2: [(1, 0, "D"), (2, 0, "E")],
                                                   3: [(3, 0, "A"), (3, 0, "B")]}
SURPLUS: dict[int, list[tuple[int, int, str]]] = {1: [(1, 0, "D")], 2: [], 3: []}
STEPS = sorted(ROUNDS)


def rollout_id(step: int, generation_round: int, name: str, index: int) -> str:
    return f"{problem_id(name)}-t{step}-r{generation_round}-s{index}"


def _sample(step: int, generation_round: int, group: Group, index: int) -> dict:
    correct = index < group.correct
    response = f"{name_answer(group.name) if correct else -1}"
    return {
        "rollout_id": rollout_id(step, generation_round, group.name, index), "problem_id": problem_id(group.name),
        "sample_index": index, "prompt_token_ids": [1, 2], "response_token_ids": [3], "response_text": response,
        "rollout_log_probs": [-0.5], "response_length": 1, "finish_reason": "stop", "truncated": False,
        "checkpoint_id": checkpoint_id(step - 1), "policy_version": step - 1, "seed": 1000 * step + index,
        "generation_round": generation_round, "gold_answer": name_answer(group.name),
        "extracted_answer": response, "correct": correct, "verdict_status": "ok",
        "rule_reward": 1.0 if correct else -1.0, "overlong_penalty": 0.0, "reward": 1.0 if correct else -1.0,
        "advantage": 0.0, "loss_masked": False, "kept": group.decision == "kept", "filter_reason": group.decision,
        "reward_version": "reward-test",
    }


def name_answer(name: str) -> int:
    return ord(name)


def _rows_of(step: int, generation_round: int, name: str) -> list[dict]:
    group = next(g for g in ROUNDS[step][generation_round] if g.name == name)
    return [_sample(step, generation_round, group, i) for i in range(G)]


def _problem(name: str, split: str, row: int) -> dict:
    return {"problem_id": problem_id(name), "source": "synthetic", "source_row": row, "problem": f"{name}?",
            "answer": name_answer(name), "original_answer": str(name_answer(name)), "prompt": f"{name}?=\n",
            "split": split, "answer_rule": "integer"}


def _write_checkpoint(layout: RunLayout, step: int) -> None:
    folder = Path(layout.checkpoint(step))
    folder.mkdir(parents=True)
    info = checkpoints.CheckpointInfo(checkpoint_id=checkpoint_id(step), step=step,
                                      parent_checkpoint_id=checkpoint_id(step - 1) if step else None,
                                      produced_by="train" if step else "import")
    (folder / checkpoints.METADATA_FILE).write_text(json.dumps(asdict(info)))


def _metrics(step: int) -> dict:
    carried = sum(1 for source_step, _, _ in TRAINED[step] if source_step < step)
    return schemas.StepStats.blank(step, checkpoint_id(step), checkpoint_id(step - 1), samples=G * len(TRAINED[step]),
                                   generation_rounds=len(ROUNDS[step]), trained_groups=len(TRAINED[step]),
                                   carried_groups=carried, loss=0.1 * step, accuracy=math.nan).row()


def _eval(step: int) -> list[dict]:
    return [{"eval_set": "held-out", "problem_id": problem_id(name), "checkpoint_id": checkpoint_id(step), "step": step,
             "k": 4, "num_correct": step % 5, "avg_at_k": (step % 5) / 4, "pass_at_k": step % 5 > 0,
             "maj_answer": None, "maj_correct": False, "verdict_timeouts": 0, "verdict_errors": 0,
             "temperature": 1.0, "top_p": 0.7, "seed": 7} for name in TEST_PROBLEM_NAMES]


def build(root: Path) -> RunLayout:
    """Write the run described above into ``root`` (a new folder) and return its layout."""
    layout = RunLayout(root)
    root.mkdir(parents=True)
    Path(layout.run_record).write_text("{}")
    problems_dir = Path(layout.problems_dir)
    problems_dir.mkdir(parents=True)
    schemas.write_shard([_problem(n, "train", i) for i, n in enumerate(PROBLEM_NAMES)], problems_dir / "train-00000.parquet",
                        schemas.Problem)
    schemas.write_shard([_problem(n, "test", i) for i, n in enumerate(TEST_PROBLEM_NAMES)], problems_dir / "test-00000.parquet",
                        schemas.Problem)
    schemas.write_shard([], Path(layout.rejected_dir) / "part-00000.parquet", schemas.RejectedProblem)  # curate writes it, empty
    _write_checkpoint(layout, 0)
    for step in STEPS:
        for generation_round, groups in enumerate(ROUNDS[step]):
            rows = [row for g in groups for row in _rows_of(step, generation_round, g.name)]
            Path(layout.scored_shard(step, generation_round)).parent.mkdir(parents=True, exist_ok=True)
            schemas.write_shard(rows, layout.scored_shard(step, generation_round), schemas.ScoredRollout)
        batch = [row for key in TRAINED[step] for row in _rows_of(*key)]
        schemas.write_shard(batch, layout.batch_shard(step), schemas.ScoredRollout)
        surplus = [{**row, "kept": False, "filter_reason": "surplus"} for key in SURPLUS[step] for row in _rows_of(*key)]
        schemas.write_shard(surplus, layout.surplus_shard(step), schemas.ScoredRollout)
        schemas.write_shard([_metrics(step)], layout.metrics_shard(step), schemas.StepMetrics)
        _write_checkpoint(layout, step)
    Path(layout.eval_shard(0)).parent.mkdir(parents=True)
    for step in (0, STEPS[-1]):
        schemas.write_shard(_eval(step), layout.eval_shard(step), schemas.EvalResult)
    return layout
