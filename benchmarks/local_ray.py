"""A local Ray cluster for the benchmarks: ``count`` nodes of one CPU and one logical GPU each (``ray.cluster_utils``).

Imported by the scripts in this folder as ``from local_ray import logical_gpu_nodes`` (a script's own folder is
first on ``sys.path``). The test suite's twin, with pytest's environment handling, is tests/ray_nodes.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.runtime.environ import overlay  # noqa: E402


@contextmanager
def logical_gpu_nodes(count: int) -> Iterator[str]:
    """A head and ``count - 1`` worker nodes; yields the address to attach to (this process is not attached).

    vLLM's in-process engine core is set before the nodes start, so every Ray worker inherits it."""
    from ray.cluster_utils import Cluster

    with overlay({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}):
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
        try:
            for _ in range(count - 1):
                nodes.add_node(num_cpus=1, num_gpus=1)
            nodes.wait_for_nodes()
            yield nodes.address
        finally:
            nodes.shutdown()
