"""The evaluate stage as a Flyte task: avg@k / pass@k / maj@k of a checkpoint on held-out problems.

The work is engines/evaluate/stage.py; settings: settings/evaluate.py; ``dapo eval``: cli/evaluate.py.
"""

from __future__ import annotations

from engines.evaluate.stage import EvalSummary, evaluate_checkpoint
from infra.environments import rollout_env, stage_cache
from settings.evaluate import EvalConfig
from settings.rollout import RolloutConfig
from storage import outputs, run_store


@rollout_env.task(
    cache=stage_cache("evaluate", __name__)
)
def evaluate(
    checkpoint_dir: str,
    problem_paths: list[str],
    out_path: str,
    step: int,
    config: EvalConfig,
    engine_config: RolloutConfig,
    upstream_digest: str = "",  # cache key of the checkpoint's and problems' content (workflows/verified_calls.py)
) -> EvalSummary:
    """Flyte task: evaluate ``checkpoint_dir``; writes EvalResult to ``out_path``, returns the summary."""
    with outputs.output(out_path) as local:
        return evaluate_checkpoint(checkpoint_dir, run_store.fetch_all(problem_paths), str(local), step, config,
                                   engine_config)
