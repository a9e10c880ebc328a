"""Flyte's local run records and task cache as SQLite in WAL mode with normal syncs.

Run locally, Flyte 2 (2.12) records every task call in one SQLite file (``<run>/flyte/local-cache/
cache.db``): the action's start and end, its attempt's start and end, and its cache entry, five
commits a call and four calls a DAPO step. SQLite's defaults (a rollback journal, ``synchronous=
FULL``) create, sync and delete a journal file on every commit: 1.5 ms a bare commit measured here
with a training run beside it (0.04 ms in WAL without syncs); a trivial task call took 11-28 ms
(4 ms after), and Flyte's bookkeeping 0.17 s of a steady main-job step under that load
(benchmarks/journal/2026-11-21_to_2026-11-27.md, "Flyte's local records in WAL mode ...").

In WAL mode with ``synchronous=NORMAL`` a commit appends to the write-ahead log without syncing
(the log is synced when it is checkpointed into the database). A commit still survives the
process being killed (kill -9, Ctrl-C); only a power loss or an operating-system crash can take
back the last commits, and the database stays consistent even then. Losing a cache entry costs
nothing but time: that task runs again and rewrites its outputs atomically, and a missing run
record only leaves a gap in ``flyte start tui``. ``NORMAL`` is applied only to connections whose
database is in WAL mode: with a rollback journal it could corrupt the file on a power loss.

Journal mode is a property of the database file, so ``use_wal`` sets it once with a connection of
its own before Flyte opens the file. The synchronous level belongs to each connection and cannot
change inside a transaction, so ``infra/flyte_patches.py: sync_flyte_connections_normally`` (a
patch of the SDK's private opener) sets it on Flyte's connections as Flyte opens them, before
anything else can use them. (With ``aiosqlite``
installed, which this project does not install, Flyte writes its cache entries through an async
connection that keeps full syncs; the run records still go through the tuned one.)
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path


def use_wal(db_path: Path) -> str:
    """Put the SQLite database at ``db_path`` (created if absent) in WAL mode; returns the mode now in force.

    The mode stays ``delete`` where the file system cannot hold a WAL's shared memory (some
    network file systems); Flyte's connections then keep their full syncs.
    """
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(db_path, timeout=30)) as conn:
        return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()


def sync_normally_if_wal(conn: sqlite3.Connection) -> bool:
    """``PRAGMA synchronous=NORMAL`` on ``conn`` when its database is in WAL mode; True when set."""
    if conn.in_transaction:
        return False
    if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        return False
    conn.execute("PRAGMA synchronous=NORMAL")
    return True
