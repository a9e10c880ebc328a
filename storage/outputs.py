"""Publishing a task output: written where the stage code can, put in the run store, its digests recorded.

Stage code writes local files. ``output`` gives it the place to write (the path itself, or a mirror
location for an object store: storage/run_store.py ``staged``) and, when the block ends without an
error, publishes what was written and then records the sha256 and size of each of its files beside
it (storage/digests.py), so the record is always written after the output it describes. Every task
output (a shard, a JSON manifest, a checkpoint folder, the report) is published this way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from storage import digests, run_store


@contextlib.contextmanager
def output(path: str | os.PathLike[str], *, folder: bool = False, others_fill: bool = False) -> Iterator[Path]:
    """A local path to write ``path``'s content to; published with its digest record when the block ends
    without error (``folder=True``: a folder, uploaded with its marker last; ``others_fill``: as
    ``run_store.staged``)."""
    with run_store.staged(path, folder=folder, others_fill=others_fill) as local:
        yield local
    digests.record(path, local)
