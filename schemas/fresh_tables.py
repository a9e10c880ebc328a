"""Tables this process just wrote, handed back when it reads the same file again.

In local Flyte mode the driver runs every task in-process, and a step reads back much of what it
wrote moments before: the scorer reads the rollout shard, the batch task and the driver read the
scored shards, the driver reads the batch twice. Each such read parsed the file again, checked
its page checksums and hashed it (~2-3 ms a shard on 2 cores) to get the table the process
already held. ``read_shard`` now returns that table while the file is still the one written: the
same device, inode, size and modification time (ns) as right after the rename. Another writer's
atomic replace (a new inode) or any write into the file (a new mtime) makes the read parse and
check the file as before; a file this process did not write is always parsed and checked.

Bounded by bytes (``MAX_BYTES``, oldest dropped first) so that paper-scale shards are not kept
alive; a table larger than the bound is never kept. A lock guards the table: local Flyte runs
tasks on threads (the pipelined mode's rollout beside training).
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path

import pyarrow as pa

MAX_BYTES = 64 * 1024 * 1024  # Arrow bytes of the tables kept, all together

Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns

_kept: collections.OrderedDict[tuple[str, type], tuple[Identity, pa.Table]] = collections.OrderedDict()
_kept_bytes = 0
_lock = threading.Lock()


def identity(st: os.stat_result) -> Identity:
    """What says a file is still the one written: a rename keeps all four, any write changes one."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _identity(path: Path) -> Identity | None:
    try:
        return identity(os.stat(path))
    except OSError:
        return None


def _drop(key: tuple[str, type]) -> None:
    global _kept_bytes
    entry = _kept.pop(key, None)
    if entry is not None:
        _kept_bytes -= entry[1].nbytes


def keep(path: Path, table: pa.Table, model: type, written: Identity) -> None:
    """Remember ``table`` as the content of ``path``, which this process renamed into place from a
    file whose identity was ``written`` (taken from the open file before the rename, so another
    writer's file renamed over it in between is never mistaken for it)."""
    global _kept_bytes
    key = (os.path.abspath(path), model)
    with _lock:
        _drop(key)
        if table.nbytes > MAX_BYTES:
            return
        _kept[key] = (written, table)
        _kept_bytes += table.nbytes
        while _kept_bytes > MAX_BYTES:
            _drop(next(iter(_kept)))


def recall(path: Path, model: type) -> pa.Table | None:
    """The table this process wrote to ``path`` as ``model``, if the file is still that one."""
    key = (os.path.abspath(path), model)
    with _lock:
        entry = _kept.get(key)
    if entry is None:
        return None
    if _identity(path) != entry[0]:
        with _lock:
            if _kept.get(key) is entry:
                _drop(key)
        return None
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
    return entry[1]


def forget() -> None:
    """Keep nothing (tests; the next read of each shard parses its file)."""
    global _kept_bytes
    with _lock:
        _kept.clear()
        _kept_bytes = 0
