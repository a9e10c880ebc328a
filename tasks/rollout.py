"""The rollout stage as a Flyte task: G samples per prompt with vLLM into a Rollout shard and its manifest.

The work is engines/rollout/stage.py; settings: settings/rollout.py; ``dapo rollout``: cli/rollout.py.
"""

from __future__ import annotations

from engines.rollout.stage import manifest_path, rollout_shard
from infra.environments import rollout_env, stage_cache
from settings.rollout import RolloutConfig
from storage import outputs, run_store


@rollout_env.task(
    cache=stage_cache("rollout", __name__)
)
def rollout(
    checkpoint_dir: str,
    problem_paths: list[str],
    problem_ids: list[str],
    out_path: str,
    config: RolloutConfig,
    seed: int,
    policy_version: int,
    generation_round: int,
    upstream_digest: str = "",  # cache key of the checkpoint's and problems' content (workflows/verified_calls.py)
) -> str:
    """Flyte task: G samples for each of ``problem_ids`` into the Rollout shard ``out_path``.

    ``out_path`` must be durable storage (a path, or an object-store URI: storage/run_store.py): a
    cache hit returns the path without regenerating. The manifest is uploaded before the shard.
    """
    with outputs.output(out_path) as local_shard, outputs.output(manifest_path(out_path)):
        rollout_shard(
            checkpoint_dir, run_store.fetch_all(problem_paths), problem_ids, local_shard, config,
            seed=seed, policy_version=policy_version, generation_round=generation_round,
        )
    return out_path
