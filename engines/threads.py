"""How many CPU threads a stage may use: one rule for every engine in the process.

The vLLM CPU engine, the tiny-policy warm-up and the DeepSpeed workers share one process
tree on a small machine; oversubscribing threads is catastrophic there (10x slower), and vLLM's
CPU attention aborts when torch's thread count differs from the OMP_NUM_THREADS it read.
"""

from __future__ import annotations

import os


def available_cpus() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_threads(requested: int = 0) -> int:
    """``requested`` if > 0, else ``OMP_NUM_THREADS`` if the user set it, else every available core."""
    if requested > 0:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return available_cpus()
