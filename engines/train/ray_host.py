"""The train host: the warm DeepSpeed worker group in a named, detached Ray actor that outlives each task.

Locally the driver's process owns the warm worker group (engines/train/server.py) and every step of the run
reaches it. On a cluster every train task is a process of its own, and a group it owned would die with it. With
``EngineHosting.ray_address`` set (settings/rollout.py) and ``TrainConfig.keep_workers_warm``, a train task
therefore hands its step to the *train host*: a detached actor named ``train-group-<digest of the engine's
settings>`` in the hosting's namespace, found by name (``get_if_exists``) and started only when none lives.
The actor's process is the group's owner, exactly as the driver's is locally: it runs
``engines/train/launch.py: train_step_in_store`` with a local hosting, so the mailbox protocol, the exactness
rule (continue from memory only from the checkpoint this group last published), the cold fallback of a dead
group (``GroupUnavailable``) and the publishing of every step are the same code, on another host.

Failure: the ranks exit when their owner (the actor) is gone (engines/train/worker.py watches its pid). An
actor found dead by the next step (kill -9, a lost node) is forgotten and a fresh one takes its name; its new
group builds the engine from the published parent, as a cold launch does, so the ids are the same. A step whose
actor dies during the call runs once more on a fresh actor (a step it published already is reused:
engines/train/publish.py: reusable_step); twice: ``TrainStepError``. Removal with the engines: a run's
``hosted_for_run`` and ``dapo engines release`` (engines/rollout/ray_engines.py: release). Design notes:
docs/WARM_ENGINES.md, "Train host".

In-memory hand-off: after each step the host puts the export it just published (read back from its node's
disk, where the ranks wrote it) into its node's Ray object store, and answers ``held_weights`` from a thread of
its own while the next step trains; the engines take the weights from there instead of the run store
(engines/rollout/host_weights.py). The checkpoint is published as before, for lineage and resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from engines.runtime import ray_actors
from engines.runtime.environ import overlay
from engines.train.publish import TrainStepError, TrainStepResult
from settings.rollout import EngineHosting
from settings.train import TrainConfig
from storage import checkpoints, run_store

WEIGHTS_GROUP = "weights"  # the concurrency group of ``held_weights``: answered while a step trains


@dataclass(frozen=True)
class HostedStep:
    """One training step as a task hands it to the train host (the arguments of ``train_step_in_store``)."""

    checkpoint_dir: str
    scored_shards: list[str]
    out_dir: str
    step: int
    config: TrainConfig
    engine_key: str  # launch.engine_key(config): names the host, one per engine settings
    rank_threads: str  # OMP_NUM_THREADS the task would give its ranks: the host's ranks compute alike


@dataclass(frozen=True)
class HostStatus:
    """Where a train host runs and what its group did (tests, diagnostics)."""

    pid: int
    node_id: str
    steps: int  # steps this actor ran
    history: list[str] = field(default_factory=list)  # its group's "continued" / "reloaded", one per request
    rank_pids: list[int] = field(default_factory=list)  # torchrun and its ranks; empty without a group


class TrainHost:
    """The actor: owns this process's warm worker group and runs each step on it, one at a time.

    ``run`` and ``start`` are launch.py's ``train_step_in_store`` and ``start_workers``, handed over by
    reference (this module sits below launch.py, which calls it), and called here with a local hosting."""

    def __init__(self) -> None:
        self._steps = 0
        self._held: tuple[str, Any] | None = None  # (checkpoint id, object ref of its export's tensors)

    def train(self, run: Callable[..., TrainStepResult], call: HostedStep) -> TrainStepResult:
        self._steps += 1
        with _rank_threads(call.rank_threads):
            result = run(call.checkpoint_dir, call.scored_shards, call.out_dir, step=call.step, config=call.config,
                         hosting=EngineHosting())
        self._held = _put_export(call.out_dir, result.checkpoint_id)
        return result

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def held_weights(self, checkpoint_id: str) -> list[Any]:
        """``[ref]`` to the tensors of ``checkpoint_id``'s export when this host holds them, else ``[]`` (the
        ref in a list, so the caller gets the ref and fetches the tensors itself, from any node)."""
        held = self._held
        return [held[1]] if held is not None and held[0] == checkpoint_id else []

    def start_workers(self, start: Callable[..., None], config: TrainConfig, rank_threads: str) -> None:
        with _rank_threads(rank_threads):
            start(config, hosting=EngineHosting())

    def status(self) -> HostStatus:
        from engines.train import server

        group = server.active_group()
        return HostStatus(pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id(), steps=self._steps,
                          history=list(group.history) if group else [], rank_pids=group.pids() if group else [])


def _put_export(out_dir: str, checkpoint_id: str) -> tuple[str, Any] | None:
    """The step's export, read from this node's copy of ``out_dir`` (what the ranks wrote; a step reused from
    the store has none here) into the object store: ``(checkpoint_id, ref)``, else None."""
    folder = run_store.local_path(out_dir)
    if not any(folder.glob("*.safetensors")) or not (folder / checkpoints.METADATA_FILE).is_file():
        return None
    if checkpoints.read_info(folder).checkpoint_id != checkpoint_id:
        return None
    return checkpoint_id, ray.put(list(checkpoints.export_tensors(folder)))


@contextlib.contextmanager
def _rank_threads(value: str) -> Iterator[None]:
    """Within the call, the ranks get the task's thread count (the actor's own, set by Ray, may differ)."""
    with overlay({"OMP_NUM_THREADS": value}):
        yield


def host_name(engine_key: str) -> str:
    """``train-group-<12 hex of the engine key>``: one host per engine settings (another config, another host)."""
    return ray_actors.TRAIN_HOST_PREFIX + hashlib.sha256(engine_key.encode()).hexdigest()[:12]


def host_gpus(num_processes: int) -> int:
    """GPUs the train host claims: one per rank where this process sees CUDA (`dapo run` on a GPU machine),
    or where the deployment plan makes this GPU-less pod its client (infra/environments.py: train_on_host);
    none otherwise (a CPU cluster's logical GPUs belong to the engines)."""
    import torch

    from infra.environments import cluster_settings, flyte_target

    client_pod = flyte_target() == "cluster" and bool(cluster_settings()["train_on_host"])
    return num_processes if torch.cuda.is_available() or client_pod else 0


def _host(engine_key: str, num_processes: int, hosting: EngineHosting) -> tuple[str, Any]:
    """(name, handle) of the live train host for ``engine_key``, else a fresh one, claiming ``host_gpus`` and
    no Ray CPU: its ranks are processes of its own, which Ray does not count, and it waits between steps."""
    ray_actors.attach(hosting)
    name = host_name(engine_key)
    gpus = host_gpus(num_processes)
    return name, ray_actors.named(TrainHost, name, hosting.ray_namespace, num_gpus=gpus, num_cpus=0,
                                  concurrency_groups={WEIGHTS_GROUP: 1})


def train_step(run: Callable[..., TrainStepResult], call: HostedStep, hosting: EngineHosting) -> TrainStepResult:
    """Run ``call`` on the train host (found or started) with ``run`` (launch.py: train_step_in_store); a
    host that is dead, or dies during the call, is replaced and the step runs once more. A failure of the
    step itself is raised as the host raised it."""
    for _attempt in (1, 2):
        name, host = _host(call.engine_key, call.config.num_processes, hosting)
        try:
            result = ray.get(host.train.remote(run, call))
        except ray.exceptions.RayActorError as err:
            ray_actors.forget(name, hosting.ray_namespace)
            warnings.warn(f"step {call.step}: the train host {hosting.ray_namespace}/{name} is dead "
                          f"({type(err).__name__}); a fresh one runs the step from the published parent",
                          RuntimeWarning, stacklevel=2)
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            raise cause if isinstance(cause, Exception) else err
        else:
            # The host's own lines stay in its Ray worker's log: what the run's log must show is said here.
            if result.timings.get("warm_fallback"):
                warnings.warn(f"step {call.step}: the train host's warm group was gone; the step ran with a cold "
                              "launch on the host", RuntimeWarning, stacklevel=2)
            if result.timings.get("replayed_steps"):
                print(f"[train] step {call.step}: the train host replayed {int(result.timings['replayed_steps'])} "
                      "step(s) before it to rebuild the optimizer state its parent did not write "
                      "(train.optimizer_state_every)", file=sys.stderr, flush=True)
            return result
    raise TrainStepError(f"step {call.step}: the train host {hosting.ray_namespace}/{name} died twice running it "
                         "(nothing published); check the Ray cluster's nodes (memory, preemption)")


def start_workers(start: Callable[..., None], config: TrainConfig, engine_key: str, rank_threads: str,
                  hosting: EngineHosting) -> None:
    """Have the train host start its group now with ``start`` (launch.py: start_workers) and return at
    once; a host that cannot is left to the first step, which finds it dead and replaces it."""
    _name, host = _host(engine_key, config.num_processes, hosting)
    host.start_workers.remote(start, config, rank_threads)


def status(engine_key: str, hosting: EngineHosting) -> HostStatus:
    """The status of the live train host for ``engine_key`` (ValueError when none lives)."""
    ray_actors.attach(hosting)
    return ray.get(ray.get_actor(host_name(engine_key), namespace=hosting.ray_namespace).status.remote())
