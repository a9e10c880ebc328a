"""storage/pruner.py: the retention policy runs after a step without holding the step up, one
prune at a time, in order, and its errors reach the driver."""

from __future__ import annotations

import threading

import pytest

from storage import pruner as pruner_module
from storage import pruning


def test_a_prune_runs_while_the_driver_goes_on_and_reports_when_done(monkeypatch: pytest.MonkeyPatch) -> None:
    release, started = threading.Event(), threading.Event()
    calls: list[tuple[int, int]] = []

    def slow_prune(paths: dict[int, str], *, latest: int, keep_optimizer_last: int, keep_weights_every: int,
                   optimizer_state_every: int, settled: set[int]) -> list[str]:
        started.set()
        assert release.wait(10), "the prune was never released"
        calls.append((latest, len(paths)))
        return [f"{paths[latest - 2]}/model.safetensors"] if latest >= 2 else []

    monkeypatch.setattr(pruning, "apply_retention", slow_prune)
    p = pruner_module.Pruner(keep_optimizer_last=1, keep_weights_every=0)
    paths = {0: "c0", 1: "c1", 2: "c2"}
    assert p.submit(2, paths, latest=2) is None  # returns while the prune is still blocked
    assert started.wait(10) and not calls
    paths[3] = "c3"  # the driver goes on publishing; the prune under way saw its own copy
    release.set()
    previous = p.submit(3, paths, latest=3)  # waits for the one before, in order
    assert previous == pruner_module.Pruned(2, ["c0/model.safetensors"])
    assert p.close() == pruner_module.Pruned(3, ["c1/model.safetensors"])
    assert calls == [(2, 3), (3, 4)]


def test_a_failed_prune_is_raised_to_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*_args: object, **_kwargs: object) -> list[str]:
        raise PermissionError("ds_state: read-only file system")

    monkeypatch.setattr(pruning, "apply_retention", failing)
    p = pruner_module.Pruner(keep_optimizer_last=2, keep_weights_every=0)
    p.submit(3, {0: "c0", 3: "c3"}, latest=3)
    with pytest.raises(PermissionError, match="read-only"):
        p.close()


def test_keeping_every_checkpoint_starts_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pruning, "apply_retention", lambda *a, **k: pytest.fail("nothing is pruned with K=0"))
    p = pruner_module.Pruner(keep_optimizer_last=0, keep_weights_every=0)
    assert p.submit(5, {0: "c0", 5: "c5"}, latest=5) is None and p.close() is None
