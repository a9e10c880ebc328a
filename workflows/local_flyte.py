"""One local Flyte call whose folders live where the caller says, never in ``/tmp/flyte``.

Local Flyte gives every run two folders and removes neither: its raw data under
``/tmp/flyte/raw_data/<run>`` and its actions under ``/tmp/flyte/metadata/<run>`` (one folder per
task call, plus the HTML of a task with ``report=True``). Both paths are written out in the SDK,
so ``TMPDIR`` does not move them: a 150-step ``dapo run`` left ~600 folders there, and they
piled up run after run. ``flyte.with_runcontext`` takes the raw-data folder but not the actions'
one; the runner it builds (``flyte._run._Runner``, flyte 2.12.1 as pinned) takes both, so the
call is made through it.

The action folders of a finished call are all empty but for a report page; the empty ones are
removed after the call, so what stays is what a user can open (the driver's Flyte report).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def run_local(task: Any, inputs: dict[str, Any], *, raw_data: Path, actions: Path) -> Any:
    """Run ``task`` to its end in local Flyte, its raw data in ``raw_data`` and its action folders
    under ``actions``; returns the task's output (our tasks have one). Empty action folders are
    removed afterwards, also when the task fails."""
    from flyte._run import _Runner

    raw_data.mkdir(parents=True, exist_ok=True)
    actions.mkdir(parents=True, exist_ok=True)
    try:
        run = _Runner(force_mode="local", raw_data_path=str(raw_data), metadata_path=str(actions)).run(task, **inputs)
        run.wait()
        outputs = run.outputs()
        return outputs[0] if isinstance(outputs, tuple) else outputs
    finally:
        remove_empty_folders(actions)


def remove_empty_folders(root: Path) -> None:
    """Remove every folder under ``root`` (not ``root`` itself) that holds nothing, deepest first."""
    for folder, subfolders, files in os.walk(root, topdown=False):
        if Path(folder) != root and not files:
            try:
                os.rmdir(folder)  # fails, and is kept, when a kept subfolder is still in it
            except OSError:
                pass
