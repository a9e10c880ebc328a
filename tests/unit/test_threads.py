"""CPU thread counts: every engine in the process follows one rule, and pipelined stages share the cores."""

from __future__ import annotations

import threading
import time

import pytest

from engines.runtime import threads


@pytest.fixture
def no_omp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.SHARING_ENV, raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)


def test_a_stage_alone_takes_every_core_and_an_explicit_count_wins(no_omp, monkeypatch) -> None:
    assert threads.cpu_threads() == 2
    assert threads.cpu_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.cpu_threads() == 1


def test_stages_running_side_by_side_split_the_cores(no_omp, monkeypatch) -> None:
    import os

    with threads.sharing_cores(2):
        assert threads.cpu_threads() == 1  # the vLLM engine's share, and each trainer rank's
        from engines.train.launch import _worker_env

        assert _worker_env(1)["OMP_NUM_THREADS"] == "1"
        assert threads.cpu_threads(2) == 2  # an explicit count still wins
    assert threads.SHARING_ENV not in os.environ and threads.cpu_threads() == 2
    monkeypatch.setattr(threads, "available_cpus", lambda: 1)
    with threads.sharing_cores(2):
        assert threads.cpu_threads() == 1  # never fewer than one


def test_trainer_ranks_split_the_cores_without_an_engine_having_run(no_omp, monkeypatch) -> None:
    from engines.train.launch import _worker_env

    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    assert _worker_env(2)["OMP_NUM_THREADS"] == "4"
    with threads.sharing_cores(2):
        assert _worker_env(2)["OMP_NUM_THREADS"] == "2"


def test_one_thread_at_a_time_uses_the_process_engine() -> None:
    from engines.rollout import vllm_engine

    inside: list[int] = []
    overlaps: list[int] = []

    def use() -> None:
        with vllm_engine.engine_in_use():
            inside.append(1)
            overlaps.append(len(inside))
            time.sleep(0.02)
            inside.pop()

    workers = [threading.Thread(target=use) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert overlaps == [1, 1, 1, 1]
