"""Entry point for tests/integration/test_flyte_records.py: ``python flyte_records_main.py RUN_DIR``.

Points Flyte at RUN_DIR's records the way ``dapo run`` does (workflows/local_run.py:
init_flyte_for_run), runs one cached task that reports the synchronous level and journal mode of
Flyte's own connection, prints them as JSON, then kills itself with SIGKILL so that nothing is
closed or checkpointed cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import flyte

from infra.environments import cpu_env
from storage.run_layout import RunLayout
from workflows.local_flyte import run_local
from workflows.local_run import init_flyte_for_run


@cpu_env.task(cache=flyte.Cache(behavior="override", version_override="records-test"))
def flyte_connection_settings(tag: str) -> list[str]:
    """The (synchronous, journal_mode) of Flyte's local database connection, as seen inside a task."""
    from flyte._persistence._db import LocalDB

    conn = LocalDB.get_sync()
    return [str(conn.execute("PRAGMA synchronous").fetchone()[0]), str(conn.execute("PRAGMA journal_mode").fetchone()[0])]


def main() -> int:
    layout = RunLayout(sys.argv[1])
    init_flyte_for_run(layout)
    flyte_dir = Path(layout.flyte_dir)
    settings = run_local(flyte_connection_settings, {"tag": "one"}, raw_data=flyte_dir / "raw",
                         actions=flyte_dir / "actions")
    print(json.dumps({"synchronous": settings[0], "journal_mode": settings[1]}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main())
