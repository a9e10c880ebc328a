"""Tables this process wrote or already read and checked, handed back while their file is unchanged.

In local Flyte mode the driver runs every task in-process, and a step reads back much of what it
wrote moments before: the scorer reads the rollout shard, the batch task and the driver read the
scored shards, the driver reads the batch twice and each checkpoint's metrics shard (written in a
staging folder that is then renamed into place), and every step reads the curated problems again.
Each such read parsed the file, checked its page checksums and hashed it (~2-5 ms a shard on 2
cores) to get a table the process already held. ``read_shard`` now returns that table while the
file is the same file object: the same device, inode, size and modification time (ns). A rename of
the file or of a folder above it keeps all four; another writer's atomic replace (a new inode) or
any write into the file (a new mtime) makes the next read parse and check the file as before.

Tables are keyed by that identity, not by path, so a shard published by renaming its folder is
recognised at its new path. The identity of a table this process wrote is taken from the open
file before the rename (another writer's file renamed over ours right after is never mistaken for
it); of a table it read, from the path before and after the read, kept only when both agree (a
file replaced while it was read is parsed again next time).

A write into a file within one tick of the filesystem's clock could keep its mtime on kernels
with coarse timestamps; the pipeline never writes a shard in place (every write is a new file
renamed into place), so this only matters for files edited by hand, which then are parsed again
from the next tick on.

Bounded by bytes (``MAX_BYTES``, oldest dropped first) so that paper-scale shards are not kept
alive; a table larger than the bound is never kept. A lock guards the table: local Flyte runs
tasks on threads (the pipelined mode's rollout beside training).
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import pyarrow as pa

from schemas.file_identity import Identity, identity_of

MAX_BYTES = 64 * 1024 * 1024  # Arrow bytes of the tables kept, all together

_Key = tuple[Identity, type]
_kept: collections.OrderedDict[_Key, pa.Table] = collections.OrderedDict()
_kept_bytes = 0
_lock = threading.Lock()


def _drop(key: _Key) -> None:
    global _kept_bytes
    table = _kept.pop(key, None)
    if table is not None:
        _kept_bytes -= table.nbytes


def keep(table: pa.Table, model: type, seen: Identity) -> None:
    """Remember ``table`` as the ``model`` content of the file whose identity is ``seen`` (taken
    from the open file this process wrote, or before and after a read that checked the file)."""
    global _kept_bytes
    key = (seen, model)
    with _lock:
        _drop(key)
        if table.nbytes > MAX_BYTES:
            return
        _kept[key] = table
        _kept_bytes += table.nbytes
        while _kept_bytes > MAX_BYTES:
            _drop(next(iter(_kept)))


def recall(path: Path, model: type) -> pa.Table | None:
    """The table kept for the file now at ``path`` as ``model``, if that file is one seen."""
    now = identity_of(path)
    if now is None:
        return None
    key = (now, model)
    with _lock:
        table = _kept.get(key)
        if table is not None:
            _kept.move_to_end(key)
    return table


def forget() -> None:
    """Keep nothing (tests; the next read of each shard parses its file)."""
    global _kept_bytes
    with _lock:
        _kept.clear()
        _kept_bytes = 0
