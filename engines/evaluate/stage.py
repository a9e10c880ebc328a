"""The evaluation stage: avg@k, pass@k and maj@k of a checkpoint on a problem set.

k samples per problem are drawn with the rollout engine (paper sec. 4.1: temperature 1.0,
top_p 0.7, avg@32 on AIME 2024) and judged with the same reward code as training. The problem set
is our Problem shards or a raw file such as DAPO's AIME 2024 x32, whose 32 copies of a problem are
one problem (engines/evaluate/eval_sets.py). Writes one EvalResult row per problem; the returned summary
averages them over problems.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import schemas
from dapo_core.answers import DAPO_PROMPT_TEMPLATE
from dapo_core.eval_metrics import pass_at_k, problem_outcome
from dapo_core.rewards import Verdict, score_responses
from engines.evaluate.eval_sets import EvalProblem, EvalSet, load_eval_set
from engines.rollout.stage import generate_rollouts
from engines.score.verifier_pool import process_judge
from settings.evaluate import EvalConfig
from settings.rollout import RolloutConfig
from storage import checkpoints


@dataclass(frozen=True)
class EvalSummary:
    """One evaluation of a checkpoint (the per-problem rows are in its EvalResult shard)."""

    eval_set: str
    checkpoint_id: str
    problems: int
    k: int  # samples per problem (the largest, when copies of a problem differ: see k_values)
    k_values: list[int]
    input_rows: int
    rejected_rows: dict[str, int]  # reason code -> rows that cannot be scored
    avg_at_k: float
    pass_at_k: float
    maj_at_k: float
    verdict_timeouts: int
    verdict_errors: int
    seconds: float


def _problems_by_k(problems: list[EvalProblem], samples_per_problem: int) -> dict[int, list[EvalProblem]]:
    """Problems grouped by k, in first-seen order of k."""
    # k per problem: the configured k, or (0) as many samples as the input had copies (AIME x32).
    by_k: dict[int, list[EvalProblem]] = {}
    for p in problems:
        by_k.setdefault(samples_per_problem or p.copies, []).append(p)
    return by_k


def _sample(
    checkpoint_dir: str, by_k: dict[int, list[EvalProblem]], step: int, config: EvalConfig,
    engine_config: RolloutConfig,
) -> list[dict[str, Any]]:
    """Rollout rows of k samples per problem, one ``generate_rollouts`` call per k."""
    rows: list[dict[str, Any]] = []
    for k, members in by_k.items():
        rollout_config = dataclasses.replace(
            engine_config,
            samples_per_prompt=k,
            temperature=config.temperature,
            top_p=config.top_p,
            max_response_tokens=config.max_response_tokens,
        )
        part, _ = generate_rollouts(
            checkpoint_dir, [{"problem_id": p.problem_id, "prompt": p.prompt} for p in members], rollout_config,
            seed=config.seed, policy_version=step, generation_round=0,
        )
        rows.extend(part)
    return rows


def _result_rows(
    problem_ids: list[str], rows: list[dict[str, Any]], verdicts: list[Verdict], *, checkpoint_id: str, step: int,
    config: EvalConfig,
) -> list[dict[str, Any]]:
    """One EvalResult row per problem (in ``problem_ids`` order) from the verdicts of its samples."""
    by_problem: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_problem.setdefault(r["problem_id"], []).append(i)
    out_rows = []
    for pid in problem_ids:
        outcome = problem_outcome([verdicts[i] for i in by_problem[pid]])
        out_rows.append(
            {
                "eval_set": config.eval_set,
                "problem_id": pid,
                "checkpoint_id": checkpoint_id,
                "step": step,
                **dataclasses.asdict(outcome),
                "temperature": config.temperature,
                "top_p": config.top_p,
                "seed": config.seed,
            }
        )
    return out_rows


def _summary(
    out_rows: list[dict[str, Any]], eval_set: EvalSet, *, checkpoint_id: str, config: EvalConfig, started: float
) -> EvalSummary:
    """The per-problem rows averaged over problems (``started``: perf_counter at the start)."""
    n = len(out_rows)
    ks = sorted({r["k"] for r in out_rows})
    return EvalSummary(
        eval_set=config.eval_set,
        checkpoint_id=checkpoint_id,
        problems=n,
        k=ks[-1],
        k_values=ks,
        input_rows=eval_set.input_rows,
        rejected_rows=eval_set.rejected,
        avg_at_k=sum(r["avg_at_k"] for r in out_rows) / n,
        pass_at_k=sum(pass_at_k(r["k"], r["num_correct"], r["k"]) for r in out_rows) / n,
        maj_at_k=sum(r["maj_correct"] for r in out_rows) / n,
        verdict_timeouts=sum(r["verdict_timeouts"] for r in out_rows),
        verdict_errors=sum(r["verdict_errors"] for r in out_rows),
        seconds=round(time.perf_counter() - started, 3),
    )


def evaluate_checkpoint(
    checkpoint_dir: str,
    problem_paths: list[str],
    out_path: str,
    step: int,
    config: EvalConfig,
    engine_config: RolloutConfig = RolloutConfig(),
) -> EvalSummary:
    """Sample, judge, write EvalResult rows to ``out_path``; returns the summary over problems.

    ``engine_config`` supplies the engine fields (dtype, threads, KV cache...): pass the run's
    rollout config so evaluation reuses the rollout engine instead of starting a second one in
    the same process (vLLM's in-process engines disturb each other).
    """
    started = time.perf_counter()
    eval_set = load_eval_set(problem_paths, prompt_template=config.prompt_template or DAPO_PROMPT_TEMPLATE)
    problems = eval_set.problems[: config.max_problems] if config.max_problems else eval_set.problems
    gold = {p.problem_id: p.answer for p in problems}
    rows = _sample(checkpoint_dir, _problems_by_k(problems, config.samples_per_problem), step, config, engine_config)
    verdicts = score_responses(
        [r["response_text"] for r in rows], [gold[r["problem_id"]] for r in rows], timeout_s=config.reward_timeout_s,
        judge=process_judge(),
    )
    checkpoint_id = checkpoints.read_info(checkpoint_dir).checkpoint_id  # a URI: its metadata file alone
    out_rows = _result_rows([p.problem_id for p in problems], rows, verdicts, checkpoint_id=checkpoint_id, step=step,
                            config=config)
    schemas.write_shard(out_rows, out_path, schemas.EvalResult)
    return _summary(out_rows, eval_set, checkpoint_id=checkpoint_id, config=config, started=started)
