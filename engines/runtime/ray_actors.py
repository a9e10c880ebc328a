"""Named, detached Ray actors of a long-lived cluster: join it, find or start an actor by name, free a name.

The long-lived rollout engines (engines/rollout/ray_engines.py) and the train host (engines/train/ray_host.py)
both outlive the task processes that use them: each is a detached actor named in the hosting's namespace
(settings/rollout.py: EngineHosting), looked up by name by every task and started only when none lives. This
module is what they share; ``HOSTED_PREFIXES`` lists every kind of actor a hosting's namespace holds, so
removal (``hosted_names``) never misses one.
"""

from __future__ import annotations

import os
import time
from typing import Any

from settings.rollout import EngineHosting

# Every kind of actor a hosting keeps in its namespace: what a run's end and `dapo engines release` remove.
ENGINE_PREFIX = "rollout-engine-"
TRAIN_HOST_PREFIX = "train-group-"
HOSTED_PREFIXES = (ENGINE_PREFIX, TRAIN_HOST_PREFIX)
_NAME_RELEASE_S = 30.0  # how long a killed actor's name may take to become free again


def attach(hosting: EngineHosting) -> None:
    """Join the long-lived cluster ``hosting`` names (once per process; a process already attached
    stays where it is, e.g. through RAY_ADDRESS on a cluster's Ray head)."""
    import ray

    if not ray.is_initialized():
        address = None if hosting.ray_address == "auto" and os.environ.get("RAY_ADDRESS") else hosting.ray_address
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)


def named(actor_class: type, name: str, namespace: str, *, num_gpus: int, num_cpus: int | None = None,
          concurrency_groups: dict[str, int] | None = None, node_id: str | None = None) -> Any:
    """The live actor ``name`` of ``namespace``, else a new detached one of ``actor_class`` (``get_if_exists``:
    two tasks asking at once get the same actor, never two). A dead actor whose name is not yet freed is
    returned as it is: its first call raises, and the caller ``forget``s it and asks again. ``num_cpus``
    None: Ray's default for an actor (one CPU held while it lives). ``concurrency_groups``: threads for the
    methods ``ray.method`` puts in a group (answered while a call of the default group runs). ``node_id``: a
    new actor starts on that node only (a live one stays where it is)."""
    import ray

    resources: dict[str, Any] = {"num_gpus": num_gpus}
    if num_cpus is not None:
        resources["num_cpus"] = num_cpus
    if concurrency_groups:
        resources["concurrency_groups"] = concurrency_groups
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        resources["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    remote = ray.remote(**resources)(actor_class)
    return remote.options(name=name, namespace=namespace, lifetime="detached", get_if_exists=True,
                          max_restarts=0).remote()


def forget(name: str, namespace: str) -> None:
    """Kill the actor of ``name`` (dead or not) and wait until the name is free, so the next lookup starts
    a fresh actor instead of returning the dead one."""
    import ray

    deadline = time.monotonic() + _NAME_RELEASE_S
    while time.monotonic() < deadline:
        try:
            handle = ray.get_actor(name, namespace=namespace)
        except ValueError:  # no live actor of that name
            return
        ray.kill(handle, no_restart=True)
        time.sleep(0.1)
    raise TimeoutError(f"Ray actor {namespace}/{name} still registered {_NAME_RELEASE_S:.0f} s after it was killed")


def hosted_names(namespace: str) -> list[str]:
    """The names of every hosted actor (``HOSTED_PREFIXES``) that lives in ``namespace``, sorted."""
    import ray

    return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry["namespace"] == namespace and entry["name"].startswith(HOSTED_PREFIXES))
