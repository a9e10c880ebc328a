"""Cached calls that were made again, recorded beside their outputs so later calls hit the re-made result.

A call whose outputs are damaged runs again (workflows/verified_calls.py). Flyte (2.12) cannot
overwrite one cache entry, so a re-make under the first key would leave the first result cached,
and the next resume's cache hit would return it: a TrainedStep naming the old checkpoint id, the
ScoreStats of the old shard. So a re-make gets a cache key of its own. Before it runs,
``record_remake`` writes ``<first output>.remade.json`` (a path or an object-store URI: the record
lives in the run folder, locally and on a cluster alike) holding, per upstream digest, the re-make's
generation and a random nonce; ``cache_key`` folds them into the upstream-digest input every call
passes, so every later call computes the re-made call's key and hits its entry. Written before the
call: a kill in between costs a run, never a stale hit; the nonce keeps a record deleted by hand
from leading a re-make into an older re-make's entry. The record is not an output: it has no digest
record and is not part of any upstream digest.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from storage import run_store

REMADE_SUFFIX = ".remade.json"


class RemakeRecordError(RuntimeError):
    """A re-make record cannot be read; names the file."""


@dataclass(frozen=True)
class Remake:
    """The latest re-make of a call under one upstream digest."""

    generation: int  # 1 for the first re-make
    nonce: str  # random: this re-make's cache key was never used before

    def key(self, upstream_digest: str) -> str:
        return f"{upstream_digest}|remade-{self.generation}-{self.nonce}"


def record_path(output: str | os.PathLike[str]) -> str:
    """The re-make record of the call whose first output is ``output`` (beside it, like its digest record)."""
    return str(output).rstrip("/") + REMADE_SUFFIX


def _remakes(outputs: Sequence[str]) -> dict[str, Remake]:
    """The call's re-makes by upstream digest (none recorded: empty)."""
    path = record_path(outputs[0])
    if not run_store.exists(path):
        return {}
    try:
        return {upstream: Remake(**fields) for upstream, fields in json.loads(run_store.read_text(path)).items()}
    except (ValueError, TypeError, AttributeError) as err:
        raise RemakeRecordError(f"{path}: not a re-make record ({err}); delete it together with {outputs[0]} "
                                "to make that output again") from err


def cache_key(outputs: Sequence[str], upstream_digest: str) -> str:
    """The cache-key input of a call publishing ``outputs``: ``upstream_digest``, with its latest re-make's mark."""
    remake = _remakes(outputs).get(upstream_digest) if outputs else None
    return upstream_digest if remake is None else remake.key(upstream_digest)


def record_remake(outputs: Sequence[str], upstream_digest: str) -> str:
    """Record that the call publishing ``outputs`` is made again; returns its new cache-key input."""
    if not outputs:
        raise ValueError("a call that publishes nothing is never made again")
    remakes = _remakes(outputs)
    previous = remakes.get(upstream_digest)
    remake = Remake(generation=(previous.generation if previous else 0) + 1, nonce=uuid.uuid4().hex[:8])
    remakes[upstream_digest] = remake
    run_store.write_text(record_path(outputs[0]),
                         json.dumps({k: asdict(v) for k, v in remakes.items()}, indent=2, sort_keys=True) + "\n")
    return remake.key(upstream_digest)
