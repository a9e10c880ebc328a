"""Cached task calls whose outputs are checked against their digest records.

Cache keys are the tasks' inputs, output paths included, not the outputs' contents: a cache hit
returns what the task returned the first time, even when the shard or checkpoint it names was
deleted or damaged since. So the driver calls every task through ``call_verified``, which checks
each output the call publishes (storage/digests.py) and, when one is missing, damaged or has no
record, deletes that call's outputs and runs the task once more with its cache disabled for this
call (``task.override(cache="disable")``: the body runs on the laptop and on a cluster alike).
The re-made outputs land at the same paths with fresh records, so later re-runs hit the
original cache entry and find them intact. What cannot be re-made is an error naming the files.
Files the retention policy pruned (storage/pruning.py) are not missing: a pruned checkpoint's
cached call stays a cache hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from storage import digests, pruning
from workflows import progress


class DamagedOutputError(RuntimeError):
    """A task's outputs are still missing or damaged after it ran again; names each file."""


def damaged_outputs(outputs: Sequence[str]) -> list[str]:
    """One line per missing or damaged file of ``outputs`` (empty when all are intact)."""
    return [problem for path in outputs for problem in pruning.check(path)]


async def call_verified(task: Any, outputs: Sequence[str], *args: Any, upstream: Sequence[str] = ()) -> Any:
    """``await task.aio(*args, upstream_digest)``, made again when the ``outputs`` it returns are not intact.

    ``upstream`` names the published outputs the call reads (shards, checkpoints, the curation
    folder); their digest (``digests.upstream_digest``) is the task's last input, so the cache
    key covers what they hold, not only where they are: when an upstream stage re-ran and wrote
    something else, this call and every call downstream of it run again.
    """
    args = (*args, digests.upstream_digest(upstream))
    result = await task.aio(*args)
    problems = damaged_outputs(outputs)
    if not problems:
        return result
    name = getattr(task, "short_name", None) or task.name
    progress.note(f"[verify] {name}: outputs not intact, making them again:\n  " + "\n  ".join(problems), warning=True)
    for path in outputs:
        digests.forget(path)
    result = await task.override(cache="disable").aio(*args)
    problems = damaged_outputs(outputs)
    if problems:
        raise DamagedOutputError(f"{name}: outputs still not intact after running again:\n  " + "\n  ".join(problems))
    return result
