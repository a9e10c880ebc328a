"""After Ctrl-C (train_server.stop_now) no DeepSpeed worker group starts, not even one whose start was under way."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from engines.train import server as train_server


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's stop flag and active group, as a new driver has them."""
    monkeypatch.setattr(train_server, "_stopping", threading.Event())
    monkeypatch.setattr(train_server, "_active", None)


class _FakeProc:
    pid = -1

    def poll(self) -> int | None:
        return None


def _fake_group(killed: list[str]) -> train_server.WorkerGroup:
    group = train_server.WorkerGroup(key="k", num_processes=1, serve_dir=Path("/nonexistent-dapo-serve-dir"),
                                     proc=_FakeProc(), owner_pid=train_server.os.getpid(),  # type: ignore[arg-type]
                                     log=None, started_s=0.0)  # type: ignore[arg-type]
    group.kill = lambda: killed.append("killed")  # type: ignore[method-assign]
    return group


def test_no_group_starts_after_ctrl_c(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(train_server, "start_group", lambda **kw: started.append(kw))
    train_server.stop_now()
    with pytest.raises(train_server.GroupUnavailable, match="interrupted"):
        train_server.acquire(key="k", num_processes=1, engine_spec={}, env={})
    assert not started


def test_a_group_whose_start_a_ctrl_c_overtook_is_killed(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[str] = []

    def start_then_ctrl_c(**_: Any) -> train_server.WorkerGroup:
        train_server.stop_now()  # lands while the group starts: nothing recorded yet to kill
        return _fake_group(killed)

    monkeypatch.setattr(train_server, "start_group", start_then_ctrl_c)
    with pytest.raises(train_server.GroupUnavailable, match="interrupted"):
        train_server.acquire(key="k", num_processes=1, engine_spec={}, env={})
    assert killed == ["killed"] and train_server.active_group() is None
