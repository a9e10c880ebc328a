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

On several nodes (the plan's ``train_nodes`` > 1) the train host is a group of actors, one per node: the lead
(named as above, with the node count) runs the step as on one node, and a peer on each other node (``-node<i>``)
owns its node's agent of the same warm group and takes every request the lead relays (engines/train/node_group.py).
The group is one unit: a member found dead, or a group that lost a node's agent, is replaced whole and the step
runs once more on a fresh one, from the published parent.

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
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from engines.runtime import ray_actors
from engines.runtime.environ import overlay
from engines.train import node_group
from engines.train.dist import free_port
from engines.train.node_group import NodeGroup
from engines.train.publish import NodeGroupLost, TrainStepError, TrainStepResult
from settings.rollout import EngineHosting
from settings.train import TrainConfig
from storage import checkpoints, run_store

REFORMED = "node_group_reformed"  # in a step's timings: its group of nodes was formed again before it
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
    nodes: int = 1  # the plan's train nodes: a host on each, config.num_processes split between them

    @property
    def nproc_per_node(self) -> int:
        return self.config.num_processes // self.nodes


@dataclass(frozen=True)
class HostStatus:
    """Where a train host runs and what its group did (tests, diagnostics)."""

    pid: int
    node_id: str
    steps: int  # steps this actor ran
    history: list[str] = field(default_factory=list)  # its group's "continued" / "reloaded", one per request
    rank_pids: list[int] = field(default_factory=list)  # torchrun and its ranks; empty without a group
    node_rank: int = 0  # its place in a group spanning nodes (0: the lead, or one node)


class TrainHost:
    """The actor: owns this process's warm worker group and runs each step on it, one at a time.

    ``run`` and ``start`` are launch.py's ``train_step_in_store`` and ``start_workers``, handed over by
    reference (this module sits below launch.py, which calls it), and called here with a local hosting."""

    def __init__(self) -> None:
        self._steps = 0
        self._held: tuple[str, Any] | None = None  # (checkpoint id, object ref of its export's tensors)
        self._token = uuid.uuid4().hex  # this actor, not another of its name (a replaced peer)
        self._peer_tokens: list[str] = []  # the lead's peers, in node order, when its group was formed
        self._relay: _PeerRelay | None = None

    def train(self, run: Callable[..., TrainStepResult], call: HostedStep, peers: tuple[Any, ...] = (),
              serve: Callable[..., None] | None = None) -> TrainStepResult:
        self._steps += 1
        reformed = False
        if peers:
            try:
                reformed = self._lead(call, list(peers), serve)
            except ray.exceptions.RayError as err:
                raise NodeGroupLost(f"step {call.step}: a peer of the train host group is gone ({type(err).__name__})") from err
        with _rank_threads(call.rank_threads):
            result = run(call.checkpoint_dir, call.scored_shards, call.out_dir, step=call.step, config=call.config,
                         hosting=EngineHosting())
        self._held = _put_export(call.out_dir, result.checkpoint_id)
        if reformed:
            result.timings[REFORMED] = 1.0
        return result

    @ray.method(concurrency_group=WEIGHTS_GROUP)
    def held_weights(self, checkpoint_id: str) -> list[Any]:
        """``[ref]`` to the tensors of ``checkpoint_id``'s export when this host holds them, else ``[]`` (the
        ref in a list, so the caller gets the ref and fetches the tensors itself, from any node)."""
        held = self._held
        return [held[1]] if held is not None and held[0] == checkpoint_id else []

    def identity(self) -> tuple[str, str]:
        """``(node id, token)``: where this actor runs, and which actor it is."""
        return ray.get_runtime_context().get_node_id(), self._token

    def _lead(self, call: HostedStep, peers: list[Any], serve: Callable[..., None] | None) -> bool:
        """Lead ``peers`` (node 1, 2, ...): a group of other members than last time gets a new rendezvous
        on this node, and a group with the old one is stopped first, here and on each peer. True when a
        group this lead had was formed again (a member was replaced)."""
        tokens = [token for _node, token in ray.get([p.identity.remote() for p in peers])]
        reformed = bool(self._peer_tokens) and tokens != self._peer_tokens
        if tokens != self._peer_tokens:
            _discard_group()
            address = ray.util.get_node_ip_address()
            port, nproc = free_port(address), call.nproc_per_node
            ray.get([p.join.remote(NodeGroup(call.nodes, i, nproc, address, port)) for i, p in enumerate(peers, 1)])
            self._relay = _PeerRelay(peers)
            node_group.join(NodeGroup(call.nodes, 0, nproc, address, port), self._relay)
            self._peer_tokens = tokens
        assert self._relay is not None and serve is not None
        self._relay.step(call, serve)
        return reformed

    def join(self, node: NodeGroup) -> None:
        """Be node ``node.node_rank`` of a lead's group (its rendezvous); a group of another one is stopped."""
        _discard_group()
        node_group.join(node, None)

    def serve_part(self, serve: Callable[..., None], n: int, key: str, engine_spec: dict[str, Any],
                   request: dict[str, Any], out_uri: str, continue_in_memory: bool, timeout_s: float,
                   rank_threads: str) -> None:
        """A peer's part of the lead's request ``n``, run by ``serve`` (launch.py: serve_node_part)."""
        self._steps += 1
        with _rank_threads(rank_threads):
            serve(n, key, engine_spec, request, out_uri=out_uri, continue_in_memory=continue_in_memory,
                  timeout_s=timeout_s)

    def start_workers(self, start: Callable[..., None], config: TrainConfig, rank_threads: str) -> None:
        with _rank_threads(rank_threads):
            start(config, hosting=EngineHosting())

    def status(self) -> HostStatus:
        from engines.train import server

        group = server.active_group()
        node = node_group.joined()
        return HostStatus(pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id(), steps=self._steps,
                          history=list(group.history) if group else [], rank_pids=group.pids() if group else [],
                          node_rank=node.node_rank if node is not None else 0)


class _PeerRelay:
    """The lead's :class:`node_group.Relay`: each request goes to every peer's ``serve_part``, its paths named
    as the run store names them (a URI for a mirror's copy), so each node reads its own copies."""

    def __init__(self, peers: list[Any]) -> None:
        self._peers = peers
        self._refs: list[Any] = []
        self._call: HostedStep | None = None
        self._serve: Callable[..., None] | None = None

    def step(self, call: HostedStep, serve: Callable[..., None]) -> None:
        self._call, self._serve = call, serve

    def send(self, n: int, key: str, engine_spec: dict[str, Any], request: dict[str, Any],
             continue_in_memory: bool, timeout_s: float) -> None:
        assert self._call is not None
        named = node_group.renamed(request, run_store.source_name)
        spec = node_group.renamed(engine_spec, run_store.source_name)
        # Where the lead publishes this request's output: the step's, or a replayed step's (launch.py: train_steps).
        target = run_store.source_name(checkpoints.published_dir_of(request["out_dir"]))
        self._refs = [p.serve_part.remote(self._serve, n, key, spec, named, target, continue_in_memory, timeout_s,
                                          self._call.rank_threads) for p in self._peers]

    def failure(self, wait_s: float = 0.0) -> Exception | None:
        done, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=wait_s) if self._refs else ([], [])
        return next(filter(None, (_peer_failure(node, ref) for node, ref in enumerate(self._refs, 1)
                                  if ref in done)), None)

    def finish(self) -> None:
        failed = next(filter(None, (_peer_failure(node, ref) for node, ref in enumerate(self._refs, 1))), None)
        if failed is not None:
            raise failed


def _peer_failure(node: int, ref: Any) -> Exception | None:
    """What node ``node``'s part of the request failed with, as the lead's group raises it: ``GroupStepFailed``
    when it failed in its step, ``GroupUnavailable`` when its actor or agent is gone; None when it finished
    (waits for it)."""
    from engines.train.server import GroupStepFailed, GroupUnavailable

    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        kind = GroupStepFailed if isinstance(cause, GroupStepFailed) else GroupUnavailable
        return kind(f"node {node}: {cause if cause is not None else err}")
    except ray.exceptions.RayError as err:
        return GroupUnavailable(f"node {node}: its train host is gone ({type(err).__name__})")
    return None


def _discard_group() -> None:
    """Stop this process's warm group, if any (another group of nodes is formed)."""
    from engines.train import server

    group = server.active_group()
    if group is not None:
        server.discard(group)


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


def host_name(engine_key: str, nodes: int = 1) -> str:
    """``train-group-<12 hex of the engine key>``: one host per engine settings (another config, another host);
    the lead of a group on several nodes adds ``-<nodes>nodes``, its peers ``-node<i>`` after that."""
    name = ray_actors.TRAIN_HOST_PREFIX + hashlib.sha256(engine_key.encode()).hexdigest()[:12]
    return name if nodes == 1 else f"{name}-{nodes}nodes"


def host_gpus(num_processes: int) -> int:
    """GPUs the train host claims: one per rank where this process sees CUDA (`dapo run` on a GPU machine),
    or where the deployment plan makes this GPU-less pod its client (infra/environments.py: train_on_host);
    none otherwise (a CPU cluster's logical GPUs belong to the engines)."""
    import torch

    from infra.environments import cluster_settings, flyte_target

    client_pod = flyte_target() == "cluster" and bool(cluster_settings()["train_on_host"])
    return num_processes if torch.cuda.is_available() or client_pod else 0


def _host(engine_key: str, num_processes: int, hosting: EngineHosting, nodes: int = 1) -> tuple[str, Any]:
    """(name, handle) of the live train host for ``engine_key``, else a fresh one, claiming ``host_gpus`` and
    no Ray CPU: its ranks are processes of its own, which Ray does not count, and it waits between steps.
    ``nodes`` > 1: the lead of a group on that many nodes, ``num_processes`` its node's ranks."""
    ray_actors.attach(hosting)
    name = host_name(engine_key, nodes)
    gpus = host_gpus(num_processes)
    return name, ray_actors.named(TrainHost, name, hosting.ray_namespace, num_gpus=gpus, num_cpus=0,
                                  concurrency_groups={WEIGHTS_GROUP: 1})


def _members(call: HostedStep, hosting: EngineHosting) -> list[tuple[str, Any]]:
    """The train host group for ``call``: ``[(name, handle)]``, the lead first, then a peer on each other node
    (found, else started on a node no member runs on). On one node, the host alone."""
    lead = _host(call.engine_key, call.nproc_per_node, hosting, call.nodes)
    if call.nodes == 1:
        return [lead]
    gpus = host_gpus(call.nproc_per_node)
    members, used = [lead], {ray.get(lead[1].identity.remote())[0]}
    for name in member_names(call.engine_key, call.nodes)[1:]:
        peer, node = _peer(name, used, gpus, call, hosting)
        if node in used:  # a live peer of an earlier group, on the node a fresh lead took: one member a node
            ray_actors.forget(name, hosting.ray_namespace)
            peer, node = _peer(name, used, gpus, call, hosting)
        used.add(node)
        members.append((name, peer))
    return members


def _peer(name: str, used: set[str], gpus: int, call: HostedStep, hosting: EngineHosting) -> tuple[Any, str]:
    """(handle, node id) of the live peer ``name``, else of a fresh one on a node no member runs on."""
    peer = ray_actors.named(TrainHost, name, hosting.ray_namespace, num_gpus=gpus, num_cpus=0,
                            concurrency_groups={WEIGHTS_GROUP: 1}, node_id=_free_node(used, gpus, call))
    return peer, ray.get(peer.identity.remote())[0]


def _free_node(used: set[str], gpus: int, call: HostedStep) -> str:
    """An alive node of the cluster no member of the group runs on, with ``gpus`` GPUs (the first by id)."""
    free = sorted(n["NodeID"] for n in ray.nodes()
                  if n["Alive"] and n["NodeID"] not in used and n["Resources"].get("GPU", 0) >= gpus)
    if not free:
        raise TrainStepError(f"step {call.step}: the plan trains on {call.nodes} nodes, but the Ray cluster has no "
                             f"node besides the group's {len(used)} with {gpus} GPU(s) for another train host")
    return free[0]


def member_names(engine_key: str, nodes: int) -> list[str]:
    """The names of a train host group's members: the lead, then each other node's peer."""
    lead = host_name(engine_key, nodes)
    return [lead, *(f"{lead}-node{node}" for node in range(1, nodes))]


def _forget(names: list[str], hosting: EngineHosting) -> None:
    for name in names:
        ray_actors.forget(name, hosting.ray_namespace)


def train_step(run: Callable[..., TrainStepResult], call: HostedStep, hosting: EngineHosting,
               serve: Callable[..., None] | None = None) -> TrainStepResult:
    """Run ``call`` on the train host (found or started) with ``run`` (launch.py: train_step_in_store); a
    host that is dead, or dies during the call, is replaced and the step runs once more. A failure of the
    step itself is raised as the host raised it. ``serve`` (launch.py: serve_node_part): what each other
    node's member of a group on several nodes runs for its part of a request."""
    names = member_names(call.engine_key, call.nodes)
    for _attempt in (1, 2):
        try:
            members = _members(call, hosting)
            host, peers = members[0][1], tuple(handle for _name, handle in members[1:])
            result = ray.get(host.train.remote(run, call, peers, serve))
        except ray.exceptions.RayActorError as err:
            _forget(names, hosting)
            warnings.warn(f"step {call.step}: the train host {hosting.ray_namespace}/{names[0]}"
                          f"{' group' if call.nodes > 1 else ''} is dead ({type(err).__name__}); a fresh one runs the "
                          "step from the published parent", RuntimeWarning, stacklevel=2)
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if call.nodes > 1:  # the peers' groups are in an unknown state: a fresh group takes the next step
                _forget(names[1:], hosting)
            if isinstance(cause, NodeGroupLost):
                warnings.warn(f"{cause}; a fresh train host group runs the step from the "
                              "published parent", RuntimeWarning, stacklevel=2)
                continue
            raise cause if isinstance(cause, Exception) else err
        else:
            # The host's own lines stay in its Ray worker's log: what the run's log must show is said here.
            if result.timings.get(REFORMED):
                warnings.warn(f"step {call.step}: a member of the train host group on {call.nodes} nodes was "
                              "replaced; the group was formed again and the step ran from the published parent",
                              RuntimeWarning, stacklevel=2)
            if result.timings.get("warm_fallback"):
                warnings.warn(f"step {call.step}: the train host's warm group was gone; the step ran with a cold "
                              "launch on the host", RuntimeWarning, stacklevel=2)
            if result.timings.get("replayed_steps"):
                print(f"[train] step {call.step}: the train host replayed {int(result.timings['replayed_steps'])} "
                      "step(s) before it to rebuild the optimizer state its parent did not write "
                      "(train.optimizer_state_every)", file=sys.stderr, flush=True)
            return result
    raise TrainStepError(f"step {call.step}: the train host {hosting.ray_namespace}/{names[0]} died twice running it "
                         "(nothing published); check the Ray cluster's nodes (memory, preemption)")


def start_workers(start: Callable[..., None], config: TrainConfig, engine_key: str, rank_threads: str,
                  hosting: EngineHosting) -> None:
    """Have the train host start its group now with ``start`` (launch.py: start_workers) and return at
    once; a host that cannot is left to the first step, which finds it dead and replaces it."""
    _name, host = _host(engine_key, config.num_processes, hosting)
    host.start_workers.remote(start, config, rank_threads)


def status(engine_key: str, hosting: EngineHosting, nodes: int = 1, node_rank: int = 0) -> HostStatus:
    """The status of the live train host for ``engine_key`` (with ``nodes`` > 1: of node ``node_rank``'s member
    of the group); ValueError when none lives."""
    ray_actors.attach(hosting)
    name = member_names(engine_key, nodes)[node_rank]
    return ray.get(ray.get_actor(name, namespace=hosting.ray_namespace).status.remote())
