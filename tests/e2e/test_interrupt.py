"""Ctrl-C during `dapo run`: prompt stop, exit code 130, one short message; the folder then stays bound to its config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_pipeline import DAPO, REPO, SMALL, _env

pytestmark = pytest.mark.slow


def _args(run_root: Path, *extra: str) -> list[str]:
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(run_root)]
    for item in [*SMALL, "run.name=intr", *extra]:
        args += ["--set", item]
    return args


def test_ctrl_c_stops_promptly_with_one_line_then_a_changed_config_is_refused(tmp_path: Path) -> None:
    # Own process group, signalled as a terminal does: the driver and every child get SIGINT.
    proc = subprocess.Popen(_args(tmp_path), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            if "warm-up" in line or line.startswith("[step"):
                break
            assert time.monotonic() < deadline, "no warm-up line"
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = proc.stderr.read()
    assert rc == 130, stderr[-3000:]
    tail = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(tail) <= 5, stderr[-3000:]
    assert "dapo run: interrupted during the step-0 policy" in tail[-1] and "re-run" in tail[-1], tail[-1]

    # The interrupted folder is bound to its config: another lr is refused at once, in one line.
    again = subprocess.run(_args(tmp_path, "train.lr=2e-4"), cwd=REPO, env=_env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 2, again.stderr[-3000:]
    assert again.stderr.strip().splitlines() == [again.stderr.strip()]
    assert "holds a run of another config (train.lr 0.0001 -> 0.0002)" in again.stderr
    assert "note: taking over" not in again.stderr  # the interrupted run released its lock
