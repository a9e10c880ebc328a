"""A warm worker group that spans several nodes: one torchrun agent per node, each owned by its node's train host.

On one node the train host's process owns the whole warm group (engines/train/server.py). When the deployment
plan trains on ``nodes`` > 1 (infra/environments.py: ``train_nodes``), the train host is a group of actors,
one per node (engines/train/ray_host.py): the *lead* (node 0) runs the step as on one node, and every other
node's *peer* owns its node's agent of the same static rendezvous. Each request the lead writes into its
node's mailbox is relayed to the peers (:class:`Relay`), which write it into theirs, with the paths in it
named as the run store names them, so a node with a mirror of its own reads its own copies. The ranks of
all nodes then run the step together; a peer on an object store uploads its ranks' files (no marker) before
the lead publishes, the marker last, as the elastic ranks do (engines/train/rank.py).

:func:`join` records this process's place in such a group (one per process, as the warm group is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from engines.train.spec import DS_STATE_DIR


@dataclass(frozen=True)
class NodeLayout:
    """The training topology of the deployment plan: ``nodes`` nodes of ``nproc_per_node`` ranks (elastic agents,
    or a train host group's members)."""

    nodes: int
    nproc_per_node: int


def planned_nodes() -> NodeLayout:
    """The plan's training topology (infra/environments.py: cluster_settings, read from ``DAPO_CLUSTER_PLAN``)."""
    from infra.environments import cluster_settings

    plan = cluster_settings()
    return NodeLayout(int(plan["train_nodes"]), int(plan["train_nproc_per_node"]))


@dataclass(frozen=True)
class NodeGroup:
    """This node's place in a warm group of ``nodes`` agents of ``nproc_per_node`` ranks each."""

    nodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str  # the lead's node: its agent holds the static rendezvous
    master_port: int

    @property
    def world(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def ranks(self) -> range:
        """The global ranks of this node's agent (torchrun's contiguous block per node)."""
        return range(self.node_rank * self.nproc_per_node, (self.node_rank + 1) * self.nproc_per_node)


class Relay(Protocol):
    """The lead's link to its peers for one warm group (engines/train/ray_host.py implements it)."""

    def send(self, n: int, key: str, engine_spec: dict[str, Any], request: dict[str, Any],
             continue_in_memory: bool, timeout_s: float) -> None:
        """Hand request ``n`` to every peer; returns at once."""

    def failure(self, wait_s: float = 0.0) -> Exception | None:
        """What a peer failed request ``n`` with, as the lead's group raises it (engines/train/server.py:
        ``GroupStepFailed`` in its step, ``GroupUnavailable`` when lost), else None; ``wait_s``: how long to
        wait for the peers to end the request first."""

    def finish(self) -> None:
        """Wait until every peer finished request ``n`` (its files uploaded); raises as :meth:`failure` says."""


_joined: tuple[NodeGroup, Relay | None] | None = None


def join(node: NodeGroup, relay: Relay | None) -> None:
    """This process owns ``node``'s agent of a multi-node group; ``relay``: the lead's link to its peers."""
    global _joined
    _joined = (node, relay)


def joined() -> NodeGroup | None:
    """This process's place in a multi-node group, None on one node."""
    return _joined[0] if _joined is not None else None


def relay() -> Relay | None:
    """The lead's relay (None on a peer, or on one node)."""
    return _joined[1] if _joined is not None else None


def other_ranks_state(world: int, mine: range) -> tuple[str, ...]:
    """``run_store.fetch`` skip patterns for the optimizer-state files of ranks not in ``mine``.

    ZeRO writes one partition file per data-parallel rank (``[bf16_]zero_pp_rank_<r>_mp_rank_..``) and each
    rank loads only its own (DeepSpeed without ``elastic_checkpoint``, which this project never sets), so a
    node needs its own ranks' files of ``ds_state/``, besides the shared ones: at paper scale half of the
    393 GB per node on 2 train nodes."""
    if len(mine) >= world:
        return ()
    return tuple(f"{DS_STATE_DIR}/*/*zero_pp_rank_{r}_mp_rank_*" for r in range(world) if r not in mine)


# The request's fields that name files (engines/train/launch.py: _worker_spec), besides each step's shards.
PATH_FIELDS = ("parent_checkpoint", "resume_ds_state", "out_dir", "probe_path")


def renamed(request: dict[str, Any], rename: Any) -> dict[str, Any]:
    """``request`` with every path in it (:data:`PATH_FIELDS`, each step's shards) passed through ``rename``."""
    out = {**request, **{k: rename(request[k]) for k in PATH_FIELDS if request.get(k)}}
    if request.get("steps"):
        out["steps"] = [{**s, "shards": [rename(p) for p in s["shards"]]} for s in request["steps"]]
    return out
