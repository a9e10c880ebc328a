"""A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), the cluster shape the Ray tests share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def two_gpu_nodes() -> Iterator[Any]:
    """A head and a worker node of one CPU and one logical GPU each, this process attached as the driver.

    vLLM's in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is set before the nodes start, so every
    worker inherits it; the variable is restored after."""
    import ray
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
        try:
            nodes.add_node(num_cpus=1, num_gpus=1)
            nodes.wait_for_nodes()
            ray.init(address=nodes.address, include_dashboard=False)
            yield nodes
        finally:
            ray.shutdown()
            nodes.shutdown()
