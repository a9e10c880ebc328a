"""Tables this process wrote or already read and checked, handed back while their file is unchanged.

In local Flyte mode a step reads back much of what it wrote moments before, and each read parsed,
checked and hashed the file (~2-5 ms a shard). ``read_shard`` returns the table already held while
the file is the same file object (device, inode, size, mtime in ns): a rename keeps it, another
writer's atomic replace or any write makes the next read parse and check the file as before.
Bounded by bytes (``MAX_BYTES``, oldest dropped first); a lock guards it (local Flyte runs tasks
on threads).

Design notes (identity of a file, coarse timestamps): docs/ARCHITECTURE.md,
"Fresh tables (schemas/fresh_tables.py)".
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
