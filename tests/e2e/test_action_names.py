"""A real (small, 1-step) run records each step's task calls under readable action names, inside the
step's group, and the lookup commands of docs/CLUSTER.md ("Finding and re-running one step's stage")
answer on its run folder. Local Flyte keeps the same records a cluster's UI lists (the action's short
name, its group); ~1-2 minutes.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from storage.run_layout import RunLayout
from tests.e2e.test_pipeline import SMALL, _env

REPO = Path(__file__).resolve().parents[2]
DAPO = [sys.executable, "-m", "cli.main"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunLayout:
    root = tmp_path_factory.mktemp("runs")
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(root)]
    for item in [*SMALL, "run.steps=1", "run.name=named"]:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return RunLayout(root / "named")


def test_each_steps_calls_are_named_by_step_and_round(run: RunLayout) -> None:
    db = Path(run.flyte_dir) / "local-cache" / "cache.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT short_name, task_name, group_name FROM runs WHERE task_name IS NOT NULL").fetchall()
    named = {(short, task.split(".")[-1], group or "") for short, task, group in rows}
    assert {
        ("curate", "curate", ""),
        ("evaluate-step-0000", "evaluate", ""),
        ("rollout-step-0001-round-00", "rollout", "step-0001"),
        ("score-step-0001-round-00", "score", "step-0001"),
        ("assemble_batch-step-0001", "assemble_batch", "step-0001"),
        ("train-step-0001", "train", "step-0001"),
        ("evaluate-step-0001", "evaluate", ""),
    } <= named, sorted(named)


def test_the_documented_lookup_finds_step_1s_train(run: RunLayout) -> None:
    """`dapo lineage RUN --checkpoint 1`: the checkpoint step 1's train wrote, its parent and its batch
    (the inputs its action received), as the how-to says."""
    proc = subprocess.run([*DAPO, "lineage", str(run.root), "--checkpoint", "1"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step-0001" in proc.stdout and "batch" in proc.stdout, proc.stdout
