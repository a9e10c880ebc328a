"""Read Flyte's local run records of a run folder (which tasks ran, which were cache hits).

``dapo run`` points Flyte's local persistence at ``<run>/flyte/`` (see workflows/local_run.py),
so every invocation's actions, timings and cache hits are recorded there; ``flyte start tui``
browses the same records. This module reads them for the summary and for tests, and closes
the records a stopped driver left open: Flyte marks an action "running" when it starts and
"succeeded"/"failed" when it ends, so a driver killed (or interrupted) in between leaves
"running" rows forever. Holding the run folder's lock (workflows/run_binding.py) means no
other driver is running, so every such row belongs to a stopped one.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from storage import run_store
from storage.run_layout import RunLayout


@dataclass(frozen=True)
class ActionRecord:
    """One task execution (or cache hit) of one Flyte run."""

    run_name: str
    task_name: str  # "<environment>.<function>", e.g. "dapo-train.train"
    status: str
    cache_enabled: bool
    cache_hit: bool
    start_time: float
    seconds: float
    group: str  # the Flyte group it ran in ("step-0007": one DAPO step), "" outside any


def action_records(layout: RunLayout) -> list[ActionRecord]:
    """Every recorded action of every Flyte run in this run folder, oldest first."""
    db = run_store.local_path(layout.flyte_dir) / "local-cache" / "cache.db"
    if not db.is_file():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT run_name, task_name, status, cache_enabled, cache_hit, start_time, end_time, group_name "
            "FROM runs WHERE task_name IS NOT NULL ORDER BY start_time"
        ).fetchall()
    return [
        ActionRecord(run, task, status, bool(enabled), bool(hit), start or 0.0, max(0.0, (end or 0.0) - (start or 0.0)),
                     group or "")
        for run, task, status, enabled, hit, start, end, group in rows
    ]


def flyte_runs(layout: RunLayout) -> list[str]:
    """Names of the Flyte runs recorded in this run folder, oldest first."""
    names: list[str] = []
    for record in action_records(layout):
        if record.run_name not in names:
            names.append(record.run_name)
    return names


def db_path(layout: RunLayout) -> Path:
    return run_store.local_path(layout.flyte_dir) / "local-cache" / "cache.db"


def close_open_actions(layout: RunLayout, why: str) -> int:
    """Mark every action still recorded as "running" as failed with ``why``; returns how many.

    Call only while holding the run folder's lock and before this driver starts its own run.
    """
    db = db_path(layout)
    if not db.is_file():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        done = conn.execute(
            "UPDATE runs SET status='failed', error=?, end_time=COALESCE(end_time, ?) WHERE status='running'",
            (why, time.time()),
        )
        return done.rowcount
