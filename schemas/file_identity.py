"""A file's identity: what says a file is still the one a process saw (device, inode, size, mtime ns).

A rename of the file or of a folder above it keeps all four; an atomic replace (a new inode) or
any write into the file (a new mtime) changes one. Used to hand back what this process already
holds for an unchanged file: the checked tables of shards it wrote or read (schemas/fresh_tables.py)
and the sha256s of files it hashed (storage/digests.py). A write within one tick of a filesystem's
clock could keep the mtime on coarse-timestamp filesystems; the pipeline never writes its outputs
in place (each is a new file renamed into place).
"""

from __future__ import annotations

import os
from pathlib import Path

Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def identity(st: os.stat_result) -> Identity:
    """What says a file is still the one seen: a rename keeps all four, any write changes one."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def identity_of(path: str | os.PathLike[str] | Path) -> Identity | None:
    """The identity of the file at ``path`` now; None when there is none."""
    try:
        return identity(os.stat(path))
    except OSError:
        return None
