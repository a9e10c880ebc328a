"""The warm worker group's wake-ups (engines/train/mailbox_wake.py): a poke ends a wait, a lost poke is harmless."""

from __future__ import annotations

import select
import threading
from pathlib import Path

from engines.train import mailbox_wake


def test_a_poke_ends_a_long_wait_and_is_drained(tmp_path: Path) -> None:
    fifo = mailbox_wake.rank_fifo(tmp_path, 0)
    mailbox_wake.make(fifo)
    fd = mailbox_wake.listen(fifo)
    assert fd is not None
    done = threading.Event()

    def waiter() -> None:
        mailbox_wake.wait(fd, 60.0)
        done.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    mailbox_wake.poke(fifo)
    assert done.wait(10.0), "the poke did not end the wait"
    # Drained: nothing is left to read, so the next wait sleeps instead of returning at once.
    assert select.select([fd], [], [], 0)[0] == []


def test_a_fifo_nobody_pokes_does_not_read_as_end_of_file(tmp_path: Path) -> None:
    fifo = mailbox_wake.owner_fifo(tmp_path)
    mailbox_wake.make(fifo)
    fd = mailbox_wake.listen(fifo)
    assert fd is not None
    # Opened read-write: with no poker connected select reports nothing (a read-only open would
    # report end-of-file as readable forever, a busy loop).
    assert select.select([fd], [], [], 0.05)[0] == []


def test_a_poke_without_a_listener_or_fifo_neither_blocks_nor_raises(tmp_path: Path) -> None:
    fifo = mailbox_wake.rank_fifo(tmp_path, 1)
    mailbox_wake.poke(fifo)  # no FIFO yet
    mailbox_wake.make(fifo)
    mailbox_wake.make(fifo)  # kept if it exists
    mailbox_wake.poke(fifo)  # a FIFO nobody listens on
    fd = mailbox_wake.listen(fifo)
    assert fd is not None
    for _ in range(70_000):  # more than a pipe holds (64 KiB): later pokes are dropped, not blocking
        mailbox_wake.poke(fifo)
    mailbox_wake.wait(fd, 0.0)
    assert select.select([fd], [], [], 0)[0] == [], "one wait drains every poke"
