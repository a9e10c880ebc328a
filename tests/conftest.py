"""Shared process state and fixtures: denormals flushed, a local S3 server for the object-store tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch

from tests import s3_server


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs one worker per core), give each worker one core of its
    own, inherited by every process it starts: the engines size their thread pools from the cores a
    process may use (engines/runtime/threads.py), so two workers never oversubscribe the machine (vLLM and
    DeepSpeed slow down ~10x with more threads than free cores)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... in a worker
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


_pin_xdist_worker()


def _take_ctrl_c_back() -> None:
    """A suite started in the background (`make test &`, nohup, some CI runners) inherits SIGINT
    ignored, and every process it starts inherits that too, so the Ctrl-C tests would see a
    `dapo` that cannot be interrupted. Restore Python's handler; children then start with the
    default disposition, as they do from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_take_ctrl_c_back()

# The product flushes denormals in every process that runs a model (engines/rollout/vllm_engine.py,
# engines/train/dist.py, ...), and that FPU state is global to the process. Set it once here so
# every test runs in the same state whatever ran before it: hypothesis cannot draw subnormal
# floats then, so float strategies say allow_subnormal=False (a partial run fails as the full one).
torch.set_flush_denormal(True)


@pytest.fixture(scope="session")
def s3() -> Iterator[s3_server.S3Server]:
    """A moto S3 server for the session (skips when moto is not installed)."""
    if not s3_server.available():
        pytest.skip("moto (requirements-test.txt) is not installed")
    server = s3_server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3: s3_server.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path) -> s3_server.S3Server:
    """Point the Flyte SDK's storage config at the local S3 server; a fresh mirror folder."""
    from storage import run_store

    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    run_store._filesystem.cache_clear()
    yield s3
    run_store._filesystem.cache_clear()
