"""The in-memory weight hand-off, engine side: a long-lived engine takes a new checkpoint's weights from the
train host's memory instead of the run store.

After each step the train host (engines/train/ray_host.py) holds the export it just published in its node's
Ray object store. A long-lived engine asked to generate from a checkpoint it does not hold fetches the
checkpoint without its weight files (config, tokenizer, metadata), asks the hosts of its namespace for that
checkpoint id's tensors, and reloads from them: the weights cross the interconnect once, node to node, and
no node downloads them from the store. Anything else reads the files as before: an engine that starts (vLLM
builds it from the folder), an engine core in another process, a host that holds another checkpoint (a
pipelined run's older policy), a dead host or a lost object. The tensors are the published files' own, so
the samples are the same either way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engines.rollout import vllm_engine
from engines.runtime import ray_actors
from storage import checkpoints

_log = logging.getLogger(__name__)


def policy_for_engine(source: str, settings: vllm_engine.EngineSettings,
                      namespace: str) -> tuple[Path, list[tuple[str, Any]] | None]:
    """``(local folder, weights)`` for this process's engine to generate from ``source``: the weights in
    memory when a train host of ``namespace`` holds them and the engine would reload (the folder then
    lacks the weight files), else None and a folder with them. ``namespace`` "": no hand-off."""
    if namespace and vllm_engine.reloads_in_process():
        folder = checkpoints.fetch_policy(source, weights=False)
        if vllm_engine.holds_engine(folder, settings):
            if not vllm_engine.needs_weights(folder, settings):
                return folder, None  # the engine holds this checkpoint already
            weights = held_weights(namespace, checkpoints.read_info(folder).checkpoint_id)
            if weights is not None:
                return folder, weights
    return checkpoints.fetch_policy(source), None


def load(folder: Path, settings: vllm_engine.EngineSettings, weights: list[tuple[str, Any]] | None) -> str:
    """Reload this process's engine from ``weights`` now (``policy_for_engine``'s), so that the caller can drop
    them before generating; returns ``get_engine``'s "how" ("" for None: nothing to load)."""
    if weights is None:
        return ""
    with vllm_engine.engine_in_use():
        return vllm_engine.get_engine(folder, settings, weights)[1]


def held_weights(namespace: str, checkpoint_id: str) -> list[tuple[str, Any]] | None:
    """The tensors of ``checkpoint_id``'s export from a train host of ``namespace`` that holds them, else
    None (no host, another checkpoint held, the host or its object lost: the caller reads the files)."""
    import ray

    for name in ray_actors.hosted_names(namespace):
        if not name.startswith(ray_actors.TRAIN_HOST_PREFIX):
            continue
        try:
            refs = ray.get(ray.get_actor(name, namespace=namespace).held_weights.remote(checkpoint_id))
            if refs:
                return ray.get(refs[0])
        except (ValueError, ray.exceptions.RayError) as err:  # gone since listed, dead, or its object lost
            _log.warning("train host %s/%s could not hand over %s in memory (%s); the engine reads the files",
                         namespace, name, checkpoint_id, type(err).__name__)
    return None
