"""Flyte's local records of a run folder: WAL without a sync per commit, kept across kill -9 (infra/flyte_local_db.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from infra.flyte_local_db import sync_normally_if_wal, use_wal
from storage.run_layout import RunLayout
from workflows.run_records import action_records, db_path

REPO = Path(__file__).resolve().parents[2]
SYNCHRONOUS_NORMAL, SYNCHRONOUS_FULL = "1", "2"


def test_a_runs_flyte_connection_commits_without_a_sync_and_its_records_survive_kill_9(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(REPO / "tests" / "integration" / "flyte_records_main.py"), str(run_dir)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -9, done.stderr[-3000:]  # it killed itself after the task call
    settings = json.loads(done.stdout.strip().splitlines()[-1])
    assert settings == {"synchronous": SYNCHRONOUS_NORMAL, "journal_mode": "wal"}
    layout = RunLayout(str(run_dir))
    records = [r for r in action_records(layout) if r.task_name.endswith("flyte_connection_settings")]
    assert records and {r.status for r in records} == {"succeeded"}  # the end records were not taken back
    with sqlite3.connect(f"file:{db_path(layout)}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM task_cache").fetchone()[0] == 1  # nor the cache entry


def test_a_rollback_journal_database_keeps_its_full_syncs(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    with sqlite3.connect(db) as conn:
        assert not sync_normally_if_wal(conn)  # NORMAL with a rollback journal can corrupt on power loss
        assert str(conn.execute("PRAGMA synchronous").fetchone()[0]) == SYNCHRONOUS_FULL
    assert use_wal(db) == "wal"
    with sqlite3.connect(db) as conn:
        assert sync_normally_if_wal(conn)
        assert str(conn.execute("PRAGMA synchronous").fetchone()[0]) == SYNCHRONOUS_NORMAL
