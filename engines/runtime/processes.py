"""Finding a process's descendants and killing them (Linux /proc), for whatever owns child processes.

Used by the DeepSpeed worker groups (engines/train/server.py), ``dapo run``'s Ctrl-C
(workflows/local_run.py) and ``dapo serve`` (engines/rollout/serving.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from engines.train.worker import process_start_ticks


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Linux /proc; just ``[pid]`` elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def identities(pids: list[int]) -> dict[int, int | None]:
    """``{pid: start ticks}``: who these pids are now (a pid alone may be reused once its process is gone)."""
    return {pid: process_start_ticks(pid) for pid in pids}


def still_running(listed: dict[int, int | None]) -> dict[int, int | None]:
    """The processes of ``listed`` (from :func:`identities`) that still run as the same process."""
    return {pid: ticks for pid, ticks in listed.items() if ticks is not None and process_start_ticks(pid) == ticks}


def kill_still_running(listed: dict[int, int | None]) -> None:
    """SIGKILL each process of ``listed`` (from :func:`identities`) that still runs as the same process."""
    for pid in still_running(listed):  # not one that is gone, nor another that took its pid
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
