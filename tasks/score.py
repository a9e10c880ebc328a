"""The score stage as a Flyte task: reward, overlong shaping, advantages and the dynamic-sampling decision.

The work is engines/score/stage.py; settings: settings/score.py; ``dapo score``: cli/score.py.
"""

from __future__ import annotations

from engines.score.stage import ScoreStats, score_shards
from infra.environments import cpu_env, stage_cache
from settings.score import ScoreConfig
from storage import outputs, run_store


@cpu_env.task(
    cache=stage_cache("score", __name__)
)
def score(
    rollout_paths: list[str], problem_paths: list[str], out_path: str, max_response_tokens: int, config: ScoreConfig,
    upstream_digest: str = "",  # cache key of the inputs' content (workflows/verified_calls.py)
) -> ScoreStats:
    """Flyte task: score Rollout shards into ``out_path``; returns the round's counts."""
    with outputs.output(out_path) as local:
        return score_shards(
            run_store.fetch_all(rollout_paths), run_store.fetch_all(problem_paths), str(local),
            max_response_tokens=max_response_tokens, config=config,
        )
