"""Put a written file, or a folder's entries (new names, renames), on disk before it is relied on.

Outputs are written to a temporary name and renamed into place; the rename is atomic either way,
but only after the file and then its folder are fsynced does a power loss leave either the old
state or the whole new one. Used by the shard writer (schemas/shards.py) and the checkpoint
publish (storage/checkpoints.py).
"""

from __future__ import annotations

import errno
import os

# A folder fsync that the filesystem does not support (some network and FUSE filesystems): the
# rename is still atomic there, only not forced to disk.
_UNSUPPORTED = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EISDIR)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync the file at ``path`` (opened read-only: the bytes of any writer are flushed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(path: str | os.PathLike[str]) -> None:
    """fsync a folder's entries, where the filesystem allows opening and syncing a folder."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not allow opening a directory
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _UNSUPPORTED:
            raise
    finally:
        os.close(fd)
