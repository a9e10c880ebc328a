"""Flyte's local run records and task cache as SQLite in WAL mode with normal syncs.

Run locally, Flyte 2 records every task call in one SQLite file (``<run>/flyte/local-cache/
cache.db``), five commits a call; SQLite's defaults sync a journal file on every commit. In WAL
mode with ``synchronous=NORMAL`` a commit still survives the process being killed; only a power
loss or an OS crash can take back the last commits, which costs a re-run, never consistency.
``use_wal`` sets the journal mode once per database file; ``infra/flyte_patches.py:
sync_flyte_connections_normally`` sets NORMAL on Flyte's connections (only those in WAL mode) as
Flyte opens them.

Design notes (measurements, safety, aiosqlite): docs/ARCHITECTURE.md,
"Flyte's local database (infra/flyte_local_db.py)".
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
