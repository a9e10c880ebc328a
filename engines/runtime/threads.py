"""How many CPU threads a stage may use: one rule for every engine in the process.

The vLLM CPU engine, the tiny-policy warm-up and the DeepSpeed workers share one process
tree on a small machine; oversubscribing threads is catastrophic there (10x slower), and vLLM's
CPU attention aborts when torch's thread count differs from the OMP_NUM_THREADS it read.

Pipelined steps (``run.pipelined``) run generation (the vLLM engine, in this process) and training
(the DeepSpeed workers) at the same time on one machine: the driver then says so with
:func:`sharing_cores`, and every stage left to choose takes its share of the cores (each side one
core of two) instead of all of them. On a cluster the stages run in pods of their own and the
driver's setting does not reach them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from engines.runtime.environ import overlay

SHARING_ENV = "DAPO_STAGES_SHARING_CORES"  # how many stages run side by side on this machine's cores


def available_cpus() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def stage_cpus() -> int:
    """The cores one stage may use: all available ones, or its share while stages run side by side."""
    raw = os.environ.get(SHARING_ENV, "").strip()
    stages = int(raw) if raw.isdigit() and int(raw) > 0 else 1
    return max(1, available_cpus() // stages)


@contextlib.contextmanager
def sharing_cores(stages: int) -> Iterator[None]:
    """Within the block (and in processes started in it), ``stages`` stages share the cores evenly."""
    with overlay({SHARING_ENV: str(stages)}):
        yield


def cpu_threads(requested: int = 0) -> int:
    """``requested`` if > 0, else ``OMP_NUM_THREADS`` if set, else this stage's cores (:func:`stage_cpus`)."""
    if requested > 0:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return stage_cpus()
