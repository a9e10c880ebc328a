"""`dapo run` refuses a bad config before any work: one line on stderr, exit code 2, no run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.temperature=0.7", "--set rollout.temperature=0.7: rollout.temperature=0.7 must be 1.0: the trainer"),
        ("rollout.samples_per_prompt=1", "--set rollout.samples_per_prompt=1: rollout.samples_per_prompt=1 must be >= 2"),
        ("train.eps_high=0.1", "--set train.eps_high=0.1: train.eps_high=0.1 must be >= eps_low=0.2"),
        ("run.on_max_rounds=retry", "--set run.on_max_rounds=retry: run.on_max_rounds='retry' must be one of"),
        ("train.lr=fast", "--set train.lr=fast: expected a number"),
    ],
)
def test_dapo_run_refuses_a_bad_config_in_one_line(tmp_path: Path, override: str, message: str) -> None:
    run_root = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"),
         "--run-root", str(run_root), "--set", override],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"dapo run: config error: {lines[0].split('config error: ', 1)[-1]}"], proc.stderr
    assert message in lines[0], lines[0]
    assert not run_root.exists(), "refused after work had started"
