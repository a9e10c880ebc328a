"""The batch stage as a Flyte task: a step's kept groups into the batch shard, the surplus into the carried shard.

The work is engines/batch/stage.py (dynamic sampling, paper sec. 3.2).
"""

from __future__ import annotations

from engines.batch.stage import assemble_shards
from infra.environments import cpu_env, stage_cache
from storage import outputs, run_store


@cpu_env.task(cache=stage_cache("batch", __name__))
def assemble_batch(
    scored_paths: list[str], scored_steps: list[int], kept_groups: list[str], surplus_groups: list[str],
    batch_path: str, surplus_path: str,
    upstream_digest: str = "",  # cache key of the scored shards' content (workflows/verified_calls.py)
) -> int:
    """Flyte task: materialise one step's batch and surplus shards (``scored_steps[i]``: the step
    that generated ``scored_paths[i]``; a group is one step's, engines/batch/stage.py)."""
    with outputs.output(batch_path) as batch_local, outputs.output(surplus_path) as surplus_local:
        return assemble_shards(run_store.fetch_all(scored_paths), scored_steps, kept_groups, surplus_groups,
                               str(batch_local), str(surplus_local))
