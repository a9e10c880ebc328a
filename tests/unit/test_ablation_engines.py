"""The ablation ladder's long-lived engines (settings/rollout.py: EngineHosting): the ladder runs inside
the same per-run hosting ``dapo run`` uses (engines/rollout/ray_engines.py: hosted_for_run), so its
shared step-0 work and every rung's steps use the ladder's engines and nothing detached outlives it,
even when a rung fails. Before, the ladder never entered it: its engines were left on the cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.rollout import ray_engines
from workflows import ablation, driver
from workflows.config import load_config

REPO = Path(__file__).resolve().parents[2]


class RungFailed(RuntimeError):
    pass


def test_the_ladder_runs_inside_its_engine_hosting_and_leaves_it_when_a_rung_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    hosted: list[str] = []

    @contextlib.contextmanager
    def fake_hosted_for_run(run_dir: str, hosting: Any = None) -> Iterator[None]:
        hosted.append(run_dir)
        events.append("hosting entered")
        try:
            yield None
        finally:
            events.append("hosting left")  # where the real one releases the run's engines

    async def fake_prepare_run(cfg: Any, layout: Any) -> dict[str, Any]:
        events.append("shared step-0 work")
        return {}

    async def failing_rung(cfg: Any, layout: Any, prepared: Any, **kwargs: Any) -> dict[str, Any]:
        events.append("rung steps")
        raise RungFailed("a rung's step failed")

    monkeypatch.setattr(ray_engines, "hosted_for_run", fake_hosted_for_run)
    monkeypatch.setattr(driver, "prepare_run", fake_prepare_run)
    monkeypatch.setattr(driver, "train_and_report", failing_rung)
    config = load_config(REPO / "configs" / "ablation-tiny.yaml")
    ladder_dir = str(tmp_path / "ladder")

    with pytest.raises(RungFailed):
        asyncio.run(ablation.dapo_ablation.func(config, ladder_dir, [1], [0]))

    assert hosted == [ladder_dir]  # one hosting for the ladder: its namespace is the ladder folder's
    assert events == ["hosting entered", "shared step-0 work", "rung steps", "hosting left"]
