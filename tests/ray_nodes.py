"""A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), the cluster shape the Ray tests share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def two_gpu_nodes(node_env: tuple[dict[str, str], dict[str, str]] | None = None) -> Iterator[Any]:
    """A head and a worker node of one CPU and one logical GPU each, this process attached as the driver.

    vLLM's in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is set before the nodes start, so every
    worker inherits it; the variable is restored after. ``node_env``: variables of the head's and the worker
    node's processes (e.g. a mirror folder of each node's own, as separate machines have)."""
    import ray
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        head_env, worker_env = node_env or ({}, {})
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False,
                                                              "env_vars": head_env})
        try:
            nodes.add_node(num_cpus=1, num_gpus=1, env_vars=worker_env)
            nodes.wait_for_nodes()
            ray.init(address=nodes.address, include_dashboard=False)
            yield nodes
        finally:
            ray.shutdown()
            nodes.shutdown()
