"""The train stage as a Flyte task: one DeepSpeed DAPO update per pipeline step (paper sec. 3-4).

The body only unpacks its inputs and calls the training engine (engines/train/launch.py: worker
launch, warm groups; engines/train/publish.py: publishing, reuse); under the PyTorch Elastic
plugin it is itself a rank (engines/train/rank.py). Settings: settings/train.py. ``dapo train``:
cli/train.py.
"""

from __future__ import annotations

from engines.train.launch import on_train_host, train_step_in_store
from engines.train.publish import TrainedStep
from infra.environments import stage_cache, train_env
from settings.train import TrainConfig


@train_env.task(
    cache=stage_cache("train", __name__)
)
def train(checkpoint_dir: str, scored_shards: list[str], out_dir: str, step: int, config: TrainConfig,
          upstream_digest: str = "") -> TrainedStep:  # upstream_digest: cache key of the parent's and batch's content
    """Flyte task: one training step; returns the published checkpoint (its metrics row inside it).

    Under the PyTorch Elastic plugin (multi-node, cluster target) this body runs once per rank and
    is the worker itself (engines/train/rank.py). With a long-lived Ray cluster and warm workers it hands the
    step to the train host, on one node or the plan's several (engines/train/ray_host.py). Otherwise, when the
    deployment plan trains on several nodes, it starts their elastic agents here, each running that same rank
    body (engines/train/nodes.py); else it launches its own torchrun.
    """
    from engines.train.node_group import planned_nodes
    from engines.train.nodes import train_step_on_nodes
    from engines.train.rank import running_as_elastic_rank, train_step_as_rank

    layout = planned_nodes()
    if running_as_elastic_rank():
        ranked = train_step_as_rank(checkpoint_dir, scored_shards, out_dir, step=step, config=config)
        if ranked is None:
            return TrainedStep("", "", step)  # not rank 0: the plugin returns rank 0's output
        result = ranked
    elif layout.nodes > 1 and not on_train_host(config):
        result = train_step_on_nodes(checkpoint_dir, scored_shards, out_dir, step=step, config=config, layout=layout)
    else:
        result = train_step_in_store(checkpoint_dir, scored_shards, out_dir, step=step, config=config)
    return TrainedStep(result.checkpoint_dir, result.metrics["checkpoint_id"], step)
