"""Entry point for tests/unit/test_remakes.py: ``python remake_flyte_main.py RUN_DIR``.

Points Flyte at RUN_DIR's cache the way ``dapo run`` does (workflows/local_run.py: init_flyte_for_run)
and calls a cached task through ``call_verified`` from a parent task, as the driver does: twice, then
once after its output was damaged (made again), then once more (a resume). Its output file and its
returned value both carry the count of body runs. Prints each call's result and what the file then
held, as JSON. A process of its own: Flyte's local database connection is process-wide.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import flyte

from storage import outputs
from storage.run_layout import RunLayout
from workflows.local_flyte import run_local
from workflows.local_run import init_flyte_for_run
from workflows.verified_calls import call_verified

env = flyte.TaskEnvironment(name="remake-probe")


@env.task(cache=flyte.Cache(behavior="auto", version_override="remake-probe-v1"))
async def made(out: str, upstream_digest: str = "") -> str:
    """Write ``made-<n>`` to ``out`` (n: body runs so far, counted in a file beside it) and return it."""
    counter = Path(out).with_name("body-runs.txt")
    runs = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(runs))
    with outputs.output(out) as local:
        local.write_text(f"made-{runs}")
    return f"made-{runs}"


@env.task
async def stage(out: str) -> str:
    """The driver's view: the cached task called through call_verified."""
    return await call_verified(made, [out], out, upstream=[])


def main() -> int:
    layout = RunLayout(sys.argv[1])
    init_flyte_for_run(layout)
    out = Path(layout.root) / "steps" / "out.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    calls = []
    for n, damage in enumerate((False, False, True, False)):
        if damage:
            out.write_text("made-9")  # behind the pipeline's back
        result = run_local(stage, {"out": str(out)}, raw_data=Path(layout.flyte_dir) / f"raw-{n}",
                           actions=Path(layout.flyte_dir) / f"actions-{n}")
        calls.append({"returned": result, "file": out.read_text()})
    print(json.dumps(calls), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
