"""What each tracker already holds: ``<run>/tracking/logged.json``, written atomically after each item.

``{"tensorboard": {"steps": [1, 2], "evals": [0]}, "wandb": {"run_id": "...", "steps": [...], ...}}``.
A resumed run (or a re-run that is all cache hits) replays every step through the driver; this
record, not cache-hit detection, decides what is new, per tracker: a tracker turned on later gets
the whole run so far, and the others nothing twice. It also keeps each tracker's run id, so a
resume continues the same W&B / MLflow run. A process killed between a tracker's write and this
record's can log that one item again on resume (at-least-once; the window is one item).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from storage import run_store

STATE_FILE = "logged.json"


def read_state(folder: Path) -> dict[str, dict[str, Any]]:
    """The logged-state record in ``folder`` (empty when nothing was logged yet)."""
    path = folder / STATE_FILE
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); delete it to log the whole run again") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a mapping of tracker -> record, got {type(state).__name__}")
    return state


def write_state(folder: Path, state: dict[str, dict[str, Any]]) -> None:
    """Replace ``folder``'s record atomically (temp file, fsync, rename)."""
    folder.mkdir(parents=True, exist_ok=True)
    run_store.write_text(str(folder / STATE_FILE), json.dumps(state, indent=1, sort_keys=True) + "\n")


def is_logged(record: dict[str, Any], kind: str, step: int) -> bool:
    """Whether ``record`` (one tracker's) holds the ``kind`` (``steps`` / ``evals``) item of ``step``."""
    return step in record.get(kind, [])


def mark_logged(record: dict[str, Any], kind: str, step: int) -> None:
    record.setdefault(kind, []).append(step)
