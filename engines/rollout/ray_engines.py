"""Long-lived engine actors: named, detached Ray actors that outlive the task processes using them.

On a cluster every Flyte task is a process of its own (a fresh RayJob on open-source Flyte), so engines
owned by the task die with it and the next rollout or evaluation starts every engine again. With
``EngineHosting.ray_address`` set (settings/rollout.py), the engines are instead detached actors of a
long-lived Ray cluster, named ``rollout-engine-<i>-tp<gpus>`` in the hosting's namespace: a task looks
each one up by name and starts it only when none lives (the first call, or after the actor died), and
an engine keeps its weights between calls; a new checkpoint reaches it through the in-place reload the
in-process engine uses (engines/rollout/vllm_engine.py: get_engine). Every request carries its own
seed, so which engine (warm, reloaded or fresh) samples a request changes nothing it samples.

Detached actors outlive their creator by design: a run removes its own at its end (``release``,
``hosted_for_run``), and ``dapo engines release`` removes a namespace's by hand after a crash; both remove
the namespace's train host too (engines/train/ray_host.py), the warm training group kept beside the engines.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from typing import Any

from engines.runtime import ray_actors
from engines.runtime.environ import overlay
from settings.rollout import EngineHosting

ENGINE_NAME = ray_actors.ENGINE_PREFIX + "{index}-tp{gpus}"  # {gpus}: GPUs per engine, so a new shape never reuses an old actor


def run_namespace(run_dir: str) -> str:
    """The Ray namespace of one run's engines: its folder's name and a digest of its full path (two runs
    of one name in two roots get two namespaces, so one run's end never removes the other's engines)."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", run_dir.rstrip("/").rsplit("/", 1)[-1])[:80] or "run"
    return f"dapo-{name}-{hashlib.sha256(run_dir.encode()).hexdigest()[:8]}"


def named_actors(actor_class: type, count: int, gpus_per_engine: int, namespace: str) -> list[tuple[str, Any]]:
    """``(name, handle)`` of engines 0..count-1 in ``namespace``: the live actor of each name, else a new
    detached one (engines/runtime/ray_actors.py: named)."""
    names = [ENGINE_NAME.format(index=index, gpus=gpus_per_engine) for index in range(count)]
    return [(name, ray_actors.named(actor_class, name, namespace, num_gpus=gpus_per_engine)) for name in names]


def release(hosting: EngineHosting) -> list[str]:
    """Kill every hosted actor of the hosting's namespace (the engines and the train host,
    engines/train/ray_host.py); returns their names (none: nothing to do). Attaches to the cluster only
    when it is set; a hosting without an address has nothing to release."""
    if not hosting.persistent:
        return []
    ray_actors.attach(hosting)
    names = ray_actors.hosted_names(hosting.ray_namespace)
    for name in names:
        ray_actors.forget(name, hosting.ray_namespace)
    return names


@contextlib.contextmanager
def hosted_for_run(run_dir: str, hosting: EngineHosting | None = None) -> Iterator[EngineHosting]:
    """For the length of a run: its engines and train host in its own namespace, all removed when the run
    ends, failed or not. The namespace is the one the environment names, else the run's (``run_namespace``), exported to
    this process's rollout calls and the processes it starts (a cluster's task pods get theirs from their
    deployment: name one there). Without a Ray address it changes nothing and yields the hosting as it is."""
    hosting = hosting if hosting is not None else EngineHosting.from_environ(os.environ)
    if not hosting.persistent:
        yield hosting
        return
    hosting = EngineHosting(ray_address=hosting.ray_address, namespace=hosting.namespace or run_namespace(run_dir))
    with overlay(hosting.environ()):
        try:
            yield hosting
        finally:
            release(hosting)
