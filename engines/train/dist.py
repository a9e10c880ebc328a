"""The process group of a training launch, as every worker rank sees it.

Joining the group (gloo on CPU, NCCL with one GPU per rank), this rank's device, and the one
collective the step code uses to agree on scalars (token counts, finiteness, metric sums). Shared
by the step (``engines/train/step.py``) and the process entry points (``engines/train/worker.py``,
``engines/train/rank.py``).

Also the launcher of a one-node group (``python -m engines.train.dist``: torchrun with its
rendezvous on one address, :func:`single_node_launch`). ``torchrun --standalone`` listened on all
interfaces: its rendezvous store and the agent's store for the ranks are ``TCPStore`` servers,
which bind the wildcard address whatever host they are given, so any machine on the network could
reach them during a step. The launcher hands those stores a socket bound to the given address
instead (``TCPStore(master_listen_fd=...)``) and names it as the rendezvous endpoint and the
ranks' ``MASTER_ADDR``; the ranks' NCCL and gloo sockets stay on the loopback interface too (on
an H200 machine NCCL's bootstrap otherwise listened on its network address). A cluster's
multi-node group is started by its own elastic agent (engines/train/rank.py), on the address that
cluster gives it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from types import ModuleType

import torch
import torch.distributed as dist


def init_process() -> int:
    """Join the process group torchrun (or an elastic agent) describes; returns this rank."""
    torch.set_flush_denormal(True)  # 3-10x slower small models on CPU without it
    deepspeed = import_deepspeed()

    if torch.cuda.is_available():
        # One GPU per rank, chosen before NCCL creates its communicators on the current device.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        skip_shm_comm_build()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


def import_deepspeed() -> ModuleType:
    """``import deepspeed``, without the MLflow client DeepSpeed's autotuner would import with it.

    ``import deepspeed`` loads its autotuner (deepspeed/autotuning/autotuner.py), which imports
    ``mlflow`` whenever it is installed, to log tuning trials; this project never runs the
    autotuner, and with ``mlflow-skinny`` installed (tracking.mlflow) that import is ~1.3-2 s of every
    rank's start: each cold launch, and each step of a cluster run, whose ranks start afresh.
    ``mlflow`` is hidden for the import only (DeepSpeed then records it as absent) and importable
    again afterwards; where it is already imported, nothing is hidden.
    """
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide = "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
    try:
        import deepspeed
    finally:
        if hide and sys.modules.get("mlflow", False) is None:
            del sys.modules["mlflow"]
    return deepspeed


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed's CPU comm backend from JIT-compiling its ``deepspeed_shm_comm`` op.

    ``deepspeed.comm.torch.TorchBackend`` builds the op whenever DeepSpeed's probe calls it
    compatible (``deepspeed.ops.__compatible_ops__``): ~50 s of C++ on a fresh machine (5 min on a
    loaded 2-core one, benchmarks/RESULTS.md), charged to the first training step. The op only
    serves ``inference_all_reduce`` (tensor-parallel inference kernels); training's collectives
    go through ``torch.distributed`` over gloo either way, so marking it incompatible changes no
    number. DeepSpeed keeps the probe's dict in its module, so the edit holds for this process.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def rank_device() -> torch.device:
    """The device this rank computes on: its local GPU, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def comm_device() -> torch.device:
    """The device of tensors handed to collectives."""
    # NCCL only moves CUDA tensors; gloo only CPU ones.
    return rank_device() if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_scalars(values: list[float], op: dist.ReduceOp = dist.ReduceOp.SUM) -> list[float]:
    """All-reduce a few scalars at once (one collective). fp64 so token counts stay exact."""
    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=op)
    return t.tolist()


# ----------------------------------------------------------------------------- one-node launch

LOOPBACK = "127.0.0.1"  # a one-node group's rendezvous: nothing outside this machine reaches it
LOOPBACK_INTERFACE = "lo"  # Linux's name for the loopback interface


def single_node_launch(num_processes: int, *, host: str = LOOPBACK) -> list[str]:
    """The command that starts a one-node torchrun group of ``num_processes`` ranks whose rendezvous
    listens on ``host`` only; the caller appends torchrun's other options and the worker.

    The endpoint's port 0 picks a free port; the rendezvous id only names it to the ranks (the store
    is this launch's own). ``--local-addr`` makes ``host`` the ranks' ``MASTER_ADDR`` (else the
    machine's host name, whose address the store no longer listens on).
    """
    return [sys.executable, "-m", "engines.train.dist", f"--listen-host={host}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host}:0", "--rdzv-id=dapo-single-node", "--nnodes=1", f"--local-addr={host}",
            f"--nproc_per_node={num_processes}"]


def free_port(address: str = LOOPBACK) -> int:
    """A port free on ``address`` now (a rendezvous's: the agent binds it moments later)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def multi_node_launch(*, nodes: int, node_rank: int, nproc_per_node: int, master_addr: str, master_port: int
                      ) -> list[str]:
    """The command that starts node ``node_rank``'s agent of a group of ``nodes`` (a static rendezvous held
    by node 0's agent at ``master_addr:master_port``); the caller appends torchrun's other options and the
    worker. A failed rank is not restarted: the group's owners start a fresh group instead. The store listens
    on every interface of node 0 (the other nodes' agents reach it there)."""
    return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=static",
            f"--master-addr={master_addr}", f"--master-port={master_port}", f"--nnodes={nodes}",
            f"--node-rank={node_rank}", "--max-restarts=0", f"--nproc-per-node={nproc_per_node}"]


def bind_store_servers(host: str) -> None:
    """Make every ``TCPStore`` server this process creates (torchrun's) listen on ``host`` only.

    A server store is given a socket bound to ``host`` at the port it asked for (0: a free one), which
    it listens on instead of the wildcard address; a client store, or one given its own socket,
    is created as it was asked.
    """
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    unbound = dist.TCPStore

    class BoundTCPStore(unbound):  # type: ignore[misc, valid-type]
        def __init__(self, host_name: str, port: int, *args: object, is_master: bool = False,
                     master_listen_fd: int | None = None, **kwargs: object) -> None:
            if is_master and master_listen_fd is None:
                listener = socket.create_server((host, port), backlog=128)
                port, master_listen_fd = listener.getsockname()[1], listener.detach()
            super().__init__(host_name, port, *args, is_master=is_master, master_listen_fd=master_listen_fd, **kwargs)

    dist.TCPStore = BoundTCPStore  # dynamic_rendezvous and elastic.utils.distributed look it up here
    c10d_rendezvous_backend.TCPStore = BoundTCPStore  # imported by name there


def keep_collectives_on_loopback(host: str) -> None:
    """For a group on the loopback address, the ranks' NCCL and gloo sockets on the loopback interface
    too (values the user set win): else NCCL's bootstrap listens on the machine's first network
    interface, and gloo on the address of its host name, for a group that never leaves the machine."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        loopback = host == "localhost"
    if loopback:
        for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            os.environ.setdefault(variable, LOOPBACK_INTERFACE)


def _launch(argv: list[str]) -> None:
    """``torchrun`` with ``argv`` after ``--listen-host=HOST`` (see :func:`single_node_launch`)."""
    host = argv[0].removeprefix("--listen-host=")
    bind_store_servers(host)
    keep_collectives_on_loopback(host)
    from torch.distributed.run import main

    main(argv[1:])


if __name__ == "__main__":
    _launch(sys.argv[1:])
