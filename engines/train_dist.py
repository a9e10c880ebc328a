"""The process group of a training launch, as every worker rank sees it.

Joining the group (gloo on CPU, NCCL with one GPU per rank), this rank's device, and the one
collective the step code uses to agree on scalars (token counts, finiteness, metric sums). Shared
by the step (``engines/train_step.py``) and the process entry points (``engines/train_worker.py``,
``engines/train_rank.py``).
"""

from __future__ import annotations

import os
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
