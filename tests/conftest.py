"""Shared process state and fixtures: denormals flushed, a local S3 server for the object-store tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests import s3_server

# The product flushes denormals in every process that runs a model (engines/vllm_engine.py,
# engines/train_dist.py, ...), and that FPU state is global to the process. Set it once here so
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
