"""Ctrl-C is honoured at once wherever it lands: on any thread of the driver, and while `dapo run` starts.

A terminal's SIGINT goes to the whole process; the kernel hands it to any thread that does not
block it, and CPython runs Python handlers on the main thread only. These tests place the signal
where a loaded machine sometimes put it (tests/e2e/test_interrupt.py sends it the way a terminal
does, at one moment of a real run):

- on a task thread of a running Flyte driver (``signal.pthread_kill`` from inside the task), while
  the task goes on for minutes: the driver must still stop within seconds, exit 130 and say so;
- while ``dapo run`` imports its modules (before any stage): exit 130 and one line, no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A driver like `dapo run`'s: an async root task awaiting a synchronous child task (run on a
# Flyte task thread, as the train task is). The child signals its own thread, then keeps busy.
_DRIVER = """
import signal, sys, threading, time
from pathlib import Path
import flyte
from storage.run_layout import RunLayout
from cli.run import exit_interrupted
from workflows.local_run import RunInterrupted, run_driver_locally

env = flyte.TaskEnvironment(name="ctrl-c-probe")

@env.task
def busy(seconds: float) -> str:
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # caught on this thread, not the main one
    print("signalled", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    return "finished"

@env.task
async def driver(seconds: float) -> str:
    return await busy.aio(seconds)

try:
    out = run_driver_locally(RunLayout(sys.argv[1]), driver, interrupted=lambda: "interrupted during the probe task",
                             seconds=float(sys.argv[2]))
except RunInterrupted as err:
    exit_interrupted("probe", err)
print("ran to the end:", out, flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def test_ctrl_c_caught_on_a_task_thread_stops_the_driver_at_once(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path / "probe"), "300"], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the task has signalled its own thread
        assert line.strip() == "signalled", line + proc.stderr.read()[-3000:] if proc.stderr else line
        signalled = time.monotonic()
        # Without the fix the main thread sleeps until the task's 300 s are over.
        out, err = proc.communicate(timeout=60)
        stop_s = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
    assert stop_s < 30, f"took {stop_s:.1f} s to stop"
    assert "ran to the end" not in out
    assert err.strip().splitlines()[-1] == "dapo probe: interrupted during the probe task", err[-3000:]


def _sigint_caught(pid: int) -> bool:
    """True once the process's Python installed its SIGINT handler (bit 2 of SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


def _importing_the_pipeline(pid: int) -> bool:
    """True once `dapo run` loads the pipeline's libraries (pydantic's core, through flyte): the CLI's main() runs."""
    try:
        return "_pydantic_core" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_ctrl_c_while_dapo_run_starts_exits_130_with_one_line(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "cli.main", "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"),
            "--run-root", str(tmp_path), "--set", "run.name=starting"]
    proc = subprocess.Popen(args, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (_sigint_caught(proc.pid) and _importing_the_pipeline(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "dapo run never began importing"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dapo run: interrupted"), lines
