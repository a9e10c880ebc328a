"""Cached task calls whose outputs are checked against their digest records.

Cache keys are the tasks' inputs, output paths included, not the outputs' contents: a cache hit
returns what the task returned the first time, even when the shard or checkpoint it names was
deleted or damaged since. So the driver calls every task through ``call_verified``, which checks
each output the call publishes (storage/digests.py) and, when one is missing, damaged or has no
record, deletes that call's outputs and runs the task once more under a cache key of its own
(storage/remakes.py: a record beside the outputs marks the upstream-digest input), so the body runs
on the laptop and on a cluster alike, and its result is cached under that key: every later call
(a resume) computes the same key and returns the re-made result, never the first one, which the
cache still holds under the old key. The re-made outputs land at the same paths with fresh
records. What cannot be re-made is an error naming the files.
What a cache hit points to is checked by presence and size, and a local file modified since its
digest record was written is hashed again (storage/digests.py: modified_since_record): a resume
costs a ``stat`` a file, not a re-hash of every checkpoint of the run (``dapo verify`` is the deep
check); an output the call itself just wrote is checked by size only, since its bytes were hashed
into its digest record as they were written.
Files the retention policy pruned (storage/pruning.py) are not missing: a pruned checkpoint's
cached call stays a cache hit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from storage import digests, pruning, remakes
from workflows import progress


class DamagedOutputError(RuntimeError):
    """A task's outputs are still missing or damaged after it ran again; names each file."""


def damaged_outputs(outputs: Sequence[str], *, just_made: Collection[str] = ()) -> list[str]:
    """One line per missing or damaged file of ``outputs`` (empty when all are intact).

    Outputs in ``just_made`` were written by the call being checked, which hashed their bytes as
    it wrote them into their digest records: their files' presence and sizes are checked, not
    their sha256 again (the checkpoint's ~16 MB a step). Of any other local output, the files
    modified since their record was written are hashed, the rest checked by presence and size.
    """
    return [problem for path in outputs
            for problem in pruning.check(path, deep=False if path in just_made else None, modified_only=True)]


async def call_verified(task: Any, outputs: Sequence[str], *args: Any, upstream: Sequence[str] = ()) -> Any:
    """``await task.aio(*args, upstream_digest)``, made again when the ``outputs`` it returns are not intact.

    ``upstream`` names the published outputs the call reads (shards, checkpoints, the curation
    folder); their digest (``digests.upstream_digest``) is the task's last input, so the cache
    key covers what they hold, not only where they are: when an upstream stage re-ran and wrote
    something else, this call and every call downstream of it run again. A call made again gets
    a key of its own (storage/remakes.py), so later calls return the re-made result.
    """
    upstream_digest = digests.upstream_digest(upstream)
    stamps = record_stamps(outputs)
    result = await task.aio(*args, remakes.cache_key(outputs, upstream_digest))
    name = getattr(task, "short_name", None) or getattr(task, "name", repr(task))
    if not must_remake(name, outputs, stamps):
        return result
    result = await task.aio(*args, remakes.record_remake(outputs, upstream_digest))
    check_remade(name, outputs)
    return result


Stamps = Mapping[str, "tuple[int, int, int] | None"]  # output -> its digest record's stamp (storage/digests.py)


def record_stamps(outputs: Sequence[str]) -> Stamps:
    """The outputs' digest-record stamps, taken before a call for :func:`must_remake`."""
    return {path: digests.record_stamp(path) for path in outputs}


def must_remake(name: str, outputs: Sequence[str], stamps: Stamps) -> bool:
    """True (said as a warning, the outputs' remembered digests forgotten) when a call of the task
    ``name`` left ``outputs`` missing or damaged: run it once more under the key
    ``remakes.record_remake`` returns, then :func:`check_remade`. ``stamps``: :func:`record_stamps`
    from before the call.
    """
    # A record this call wrote (a new stamp) describes bytes hashed as they were written; a cache
    # hit leaves the old record, and the files it names are hashed again.
    just_made = {path for path in outputs if digests.record_stamp(path) not in (None, stamps[path])}
    problems = damaged_outputs(outputs, just_made=just_made)
    if not problems:
        return False
    progress.note(f"[verify] {name}: outputs not intact, making them again:\n  " + "\n  ".join(problems), warning=True)
    for path in outputs:
        digests.forget(path)
    return True


def check_remade(name: str, outputs: Sequence[str]) -> None:
    """Raise :class:`DamagedOutputError` naming each file still missing or damaged after the re-run."""
    problems = damaged_outputs(outputs)
    if problems:
        raise DamagedOutputError(f"{name}: outputs still not intact after running again:\n  " + "\n  ".join(problems))
