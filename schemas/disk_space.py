"""Say "no space left on device" with the path, whatever library was writing when the disk filled.

A full disk reaches the user in many disguises: ``OSError(ENOSPC)`` from a plain write, an
``ArrowIOError`` from Parquet, a ``RuntimeError: PytorchStreamWriter failed writing file`` from
``torch.save``, a safetensors "I/O error". :func:`writing` wraps a write and turns any failure
that happened while the target's file system is (almost) full, or whose cause chain holds
ENOSPC/EDQUOT, into one :class:`DiskFullError` naming what was written where and how much space
is left. Outputs are published by rename, so nothing half-written is left behind; re-running the
same command after freeing space resumes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

# Below this many free bytes a failed write is taken to be a full disk (writers buffer at least
# this much, so a write that failed for another reason almost never finds so little space).
NEARLY_FULL_BYTES = 1 << 20
MARKER = "no space left on device"


class DiskFullError(OSError):
    """A write failed because the file system holding ``path`` is full; the message names it."""

    def __str__(self) -> str:
        return str(self.strerror)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the file system holding ``path`` (its nearest existing parent); None if unknown."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def error_chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and its causes (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def is_disk_full(err: BaseException, path: str | os.PathLike[str]) -> bool:
    """True when ``err`` (raised writing under ``path``) comes from a full file system."""
    if isinstance(err, (KeyboardInterrupt, SystemExit)):
        return False
    for link in error_chain(err):
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if MARKER in str(link).lower():
            return True
    free = free_bytes(path)
    return free is not None and free < NEARLY_FULL_BYTES


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Run a write of ``what`` under ``path``; a full disk surfaces as :class:`DiskFullError`."""
    try:
        yield
    except DiskFullError:
        raise
    except BaseException as err:
        if not is_disk_full(err, path):
            raise
        free = free_bytes(path)
        left = "unknown" if free is None else f"{free:,} bytes"
        raise DiskFullError(
            errno.ENOSPC,
            f"{MARKER} writing {what} to {path} ({left} free there); free some space (or use another "
            "--run-root) and re-run the same command to resume",
        ) from err
