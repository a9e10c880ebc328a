"""Ctrl-C while `dapo run` trains a DAPO step: prompt stop, exit 130, one line, nothing published; the folder stays bound to its config."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from storage import checkpoints
from storage.run_layout import RunLayout
from tests.e2e.test_pipeline import DAPO, REPO, SHIPPED, _env
from workflows.run_records import action_records

pytestmark = pytest.mark.slow


def _args(run_root: Path, *extra: str) -> list[str]:
    """SMALL on the shipped step-0 policy: these runs stop in step 1 or before it, and the warm-up is
    test_pipeline.py's to cover."""
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(run_root)]
    for item in [*SHIPPED, "run.name=intr", *extra]:
        args += ["--set", item]
    return args


def _run_until_step_1_trains(tmp_path: Path, layout: RunLayout, system_temp: Path) -> subprocess.Popen[str]:
    """`dapo run` in a session of its own (TMPDIR ``system_temp``), returned once step 1's DAPO update has
    begun: its staging folder exists (made before the workers start updating, renamed into place only
    when the step is published)."""
    proc = subprocess.Popen(_args(tmp_path), cwd=REPO, env=_env(system_temp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not list(Path(layout.checkpoints_dir).glob(".step-0001.staging-*")):
            assert proc.poll() is None, "the run ended before step 1 trained"
            assert time.monotonic() < deadline, "step 1 never started training"
            time.sleep(0.01)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc


def test_ctrl_c_during_a_train_step_exits_130_publishes_nothing_then_a_changed_config_is_refused(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "intr")
    system_temp = tmp_path / "system-temp"  # the run's TMPDIR, to see what the stop leaves there
    system_temp.mkdir()
    # Own process group, signalled as a terminal does: the driver and every child get SIGINT.
    proc = _run_until_step_1_trains(tmp_path, layout, system_temp)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        signalled = time.monotonic()
        rc = proc.wait(timeout=30)
        stop_s = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = proc.stderr.read()
    assert rc == 130, stderr[-3000:]
    assert stop_s < 10, f"took {stop_s:.1f} s to stop"
    tail = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    # Progress goes to stdout and the libraries' chatter to the run's log file: stderr is the stop itself.
    assert len(tail) <= 3 and "cold launch" not in stderr, tail
    assert "dapo run: interrupted during step 1/2 (training)" in tail[-1] and "re-run" in tail[-1], tail[-1]
    # Nothing new published: no step-1 checkpoint, no step-1 metrics; the staging copy is hidden.
    assert not checkpoints.is_complete(layout.checkpoint(1))
    assert not Path(layout.checkpoint(1)).exists()
    assert not Path(layout.metrics_shard(1)).exists()
    # The run records do not show the interrupted actions as still running.
    records = action_records(layout)
    assert records and not [r for r in records if r.status == "running"], [(r.task_name, r.status) for r in records]
    assert any(r.task_name.endswith("train") and r.status == "failed" for r in records)
    # The stop skips the interpreter's exit, so what vLLM's exit would remove (the rendezvous file of
    # the in-process engine's process group) stayed in the temp folder; now the stop removes it.
    # torch's compile cache is kept on purpose.
    assert [p.name for p in system_temp.iterdir() if not p.name.startswith("torchinductor_")] == []

    # The interrupted folder is bound to its config: another lr is refused at once, in one line.
    again = subprocess.run(_args(tmp_path, "train.lr=2e-4"), cwd=REPO, env=_env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 2, again.stderr[-3000:]
    assert again.stderr.strip().splitlines() == [again.stderr.strip()]
    assert "holds a run of another config (train.lr 0.0001 -> 0.0002)" in again.stderr
    assert "note: taking over" not in again.stderr  # the interrupted run released its lock


def test_sigterm_to_the_driver_during_a_train_step_stops_it_as_ctrl_c_does(tmp_path: Path) -> None:
    """`kill PID`, or Kubernetes stopping the driver's pod (SIGTERM to the driver alone, then SIGKILL after
    a grace period): the workers are stopped, nothing is half-published, the run's records are closed and
    the temp folder is left clean, exit 143. Before, the driver ended where it stood and left its warm
    group's temp folder and vLLM's rendezvous file behind."""
    layout = RunLayout(tmp_path / "intr")
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    proc = _run_until_step_1_trains(tmp_path, layout, system_temp)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = proc.stderr.read()
    assert rc == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert "dapo run: stopped by SIGTERM: interrupted during step 1/2 (training)" in last, last
    assert not Path(layout.checkpoint(1)).exists() and not Path(layout.metrics_shard(1)).exists()
    records = action_records(layout)
    assert records and not [r for r in records if r.status == "running"], [(r.task_name, r.status) for r in records]
    assert [p.name for p in system_temp.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_a_prompt_too_long_for_the_context_stops_the_run_after_curation(tmp_path: Path) -> None:
    # The tiny model has 256 positions; the synthetic prompts ~7 tokens: a 250-token held-out cap overflows.
    started = time.monotonic()
    proc = subprocess.run(_args(tmp_path, "evaluate.max_response_tokens=250"), cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dapo run: ") and "prompts do not fit the context" in last, last
    assert "evaluate.max_response_tokens=250 > max_model_len=256" in last, last
    layout = RunLayout(tmp_path / "intr")
    assert not Path(layout.root, "steps").exists() and not Path(layout.eval_shard(0)).exists()  # no rollout, no eval
    assert not Path(layout.checkpoint(0)).exists()  # refused right after curation, before the step-0 policy
    print(f"refused after {time.monotonic() - started:.1f} s (curation only)")


def test_a_bootstrap_source_folder_that_does_not_exist_is_refused_in_one_line_after_curation(tmp_path: Path) -> None:
    # Before, the driver failed reading the folder's config.json: a traceback and exit 1, as for a crash.
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(_args(tmp_path, f"bootstrap.source={missing}"), cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dapo run: bootstrap source {missing}: not a folder"), last
    assert not Path(RunLayout(tmp_path / "intr").checkpoint(0)).exists()


def test_a_failing_stage_prints_its_traceback_and_names_the_log_file(tmp_path: Path) -> None:
    # An engine that cannot start (here: vLLM's KV-cache size in the environment is not a number) fails
    # the step-0 evaluation, a code path with no one-line user error.
    env = {**_env(), "VLLM_CPU_KVCACHE_SPACE": "lots"}
    proc = subprocess.run(_args(tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr
    # The traceback of the task that failed, down to the frame that raised, reaches the terminal...
    assert "Traceback (most recent call last)" in err, err[-3000:]
    assert "in create_engine_config" in err and "invalid literal for int() with base 10: 'lots'" in err, err[-3000:]
    # ...with the log file that holds the rest (Flyte's own error log lines are there, not here).
    log = tmp_path / "intr" / "logs" / "dapo.log"
    assert err.rstrip().splitlines()[-1] == f"dapo run: full log: {log}", err[-3000:]
    assert "Task failed with error" not in proc.stdout + err and "Task failed with error" in log.read_text()
