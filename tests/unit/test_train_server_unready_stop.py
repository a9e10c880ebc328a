"""Stopping a warm DeepSpeed group that never finished starting kills it at once; a ready one is asked to stop.

The local driver starts the group beside curation (workflows/driver.py: start_workers_early). A run that
ends before its first training step (a refusal after curation, a failed step-0 evaluation) stopped the
group at exit by writing a stop request and waiting for it, but ranks still importing torch and DeepSpeed
read no request until they serve: the exit waited out their start (~5 s of a 7 s refusal on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

from engines.train import server as train_server


class _StartingProc:
    """A torchrun that is still running (its ranks not yet serving)."""

    pid = -1

    def poll(self) -> int | None:
        return None


def _group(serve_dir: Path, *, ready: bool, calls: list[str]) -> train_server.WorkerGroup:
    group = train_server.WorkerGroup(key="k", num_processes=1, serve_dir=serve_dir, proc=_StartingProc(),  # type: ignore[arg-type]
                                     owner_pid=train_server.os.getpid(), log=None, started_s=0.0,  # type: ignore[arg-type]
                                     ready=ready)
    group.kill = lambda: calls.append("kill")  # type: ignore[method-assign]
    group._wait_exit = lambda timeout_s: calls.append(f"wait {timeout_s:g} s")  # type: ignore[method-assign]
    group._poke_ranks = lambda: None  # type: ignore[method-assign]
    return group


def test_a_group_that_never_finished_starting_is_killed_without_waiting(tmp_path: Path) -> None:
    calls: list[str] = []
    _group(tmp_path / "serve", ready=False, calls=calls).stop()
    assert calls == ["kill"]
    assert not (tmp_path / "serve").exists()


def test_a_ready_group_is_asked_to_stop_before_it_is_killed(tmp_path: Path) -> None:
    serve = tmp_path / "serve"
    serve.mkdir()
    calls: list[str] = []
    _group(serve, ready=True, calls=calls).stop()
    assert calls == [f"wait {train_server.STOP_TIMEOUT_S:g} s", "kill"]
    assert not serve.exists()


def test_ctrl_c_or_sigterm_removes_the_groups_temp_folder_with_the_group(tmp_path: Path, monkeypatch) -> None:
    """stop_now (Ctrl-C, SIGTERM) is followed by ``os._exit``: no atexit hook, and the task thread that
    would discard the group may never run again. Seen in the suite under load: SIGTERM while the group
    was still starting left ``dapo-train-serve-pid*`` in the system temp folder."""
    serve = tmp_path / "serve"
    serve.mkdir()
    (serve / "spec.json").write_text("{}")
    calls: list[str] = []
    monkeypatch.setattr(train_server, "_active", _group(serve, ready=False, calls=calls))
    monkeypatch.setattr(train_server, "_stopping", train_server.threading.Event())
    train_server.stop_now()
    assert calls == ["kill"]
    assert not serve.exists()
