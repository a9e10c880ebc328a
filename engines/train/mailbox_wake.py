"""Wake-ups for the warm worker group's file mailbox (engines/train/server.py, engines/train/worker.py).

The mailbox's files stay the protocol: a request or a result is there or it is not. A waiter
used to look for its file every 10-20 ms, so each step paid ~15 ms on average between a file
being written and being seen (the ranks waiting for a request, the owner waiting for a result).
Now each waiter has a FIFO in the serve folder and sleeps in ``poll`` on it; whoever writes a
file pokes the FIFO of the one waiting for it, and the wait ends at once. A poke is only a hint:
a waiter that is not listening yet, or a full pipe, loses it harmlessly, because the waiter
still looks for its file after every timed-out ``poll`` (the old polling interval).

FIFOs are opened read-write by their waiter (Linux), so a FIFO never reads as end-of-file when
no poker has it open, and opened write-only and non-blocking by a poker, which fails at once
(and is ignored) when no waiter has it open.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

OWNER = "wake-owner"  # the FIFO the owner waits on for results (and errors)


def rank_fifo(serve_dir: str | Path, rank: int) -> Path:
    """The FIFO rank ``rank`` waits on for requests."""
    return Path(serve_dir) / f"wake-rank{rank}"


def owner_fifo(serve_dir: str | Path) -> Path:
    return Path(serve_dir) / OWNER


def make(path: Path) -> None:
    """Create the FIFO at ``path`` (kept if it exists)."""
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        pass


def listen(path: Path) -> int | None:
    """Open ``path`` to wait on; None when it cannot be (the waiter then sleeps on a timer)."""
    try:
        return os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return None


def wait(fd: int | None, timeout_s: float) -> None:
    """Sleep until poked or ``timeout_s`` passed; drains the pokes so the next wait sleeps again."""
    if fd is None:
        time.sleep(timeout_s)
        return
    poller = select.poll()  # not select(): a busy process's descriptors can lie beyond FD_SETSIZE
    poller.register(fd, select.POLLIN)
    ready = bool(poller.poll(timeout_s * 1000.0))
    while ready:
        try:
            ready = len(os.read(fd, 65536)) == 65536
        except BlockingIOError:
            ready = False


def poke(path: Path) -> None:
    """End the wait of whoever listens on ``path``, if anyone does (never blocks, never raises)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no such FIFO, or no waiter has it open (ENXIO)
        return
    try:
        os.write(fd, b"\0")
    except OSError:  # a full pipe: the waiter has pokes to read already
        pass
    finally:
        os.close(fd)
