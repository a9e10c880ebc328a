"""The driver task's interface: the run config goes in whole and typed, the outcome comes out typed.

A config that crosses the task boundary must arrive equal, with the same digest: the run folder's
binding (workflows/run_binding.py) refuses a folder whose recorded digest differs, so a lossy
round trip (a tuple turned list, an int turned float) would refuse every resumed run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import dataclasses, os, sys, tempfile
from pathlib import Path
import flyte
from flyte.io import Dir, File
from workflows.local_flyte import run_local
from workflows.config import RunConfig, load_config
from workflows.driver import RunOutcome, dapo_pipeline

# The interface users launch from the UI: a typed RunConfig and a typed RunOutcome.
hints = dapo_pipeline.func.__annotations__
assert hints["run_config"] in (RunConfig, "RunConfig"), hints
assert {f.name: f.type for f in dataclasses.fields(RunOutcome)}["final_checkpoint"] in (Dir, "Dir")

env = flyte.TaskEnvironment(name="driver-interface-probe")

@env.task
async def echo(run_config: RunConfig) -> RunConfig:
    return run_config

cfg = load_config(sys.argv[1], ["run.steps=7", "train.lr=3e-5"])
flyte.init()
with tempfile.TemporaryDirectory() as folder:
    out = run_local(echo, {"run_config": cfg}, raw_data=Path(folder) / "raw", actions=Path(folder) / "actions")
back = out[0] if isinstance(out, tuple) else out
assert isinstance(back, RunConfig), type(back)
assert back.to_dict() == cfg.to_dict(), (back.to_dict(), cfg.to_dict())
assert back.digest() == cfg.digest() and back.source == cfg.source
assert isinstance(back.run.data, tuple), type(back.run.data)
print("ok", back.digest())
"""


def test_run_config_crosses_a_task_boundary_unchanged(tmp_path: Path) -> None:
    for config in ("tiny-cpu.yaml", "qwen2.5-32b-dapo.yaml"):
        proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(REPO / "configs" / config)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(REPO), "DO_NOT_TRACK": "1"})
        assert proc.returncode == 0 and "ok" in proc.stdout, f"{config}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
