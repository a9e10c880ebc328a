"""Where the rollout engines live (settings/rollout.py: EngineHosting; engines/rollout/ray_engines.py).

The hosting changes where engines run, never what they sample, so it travels in the task process's
environment and in no task input, config section or cache key; unset, nothing changes. The behaviour on a
real Ray cluster: tests/integration/test_persistent_engines.py.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import typing

import pytest

from engines.rollout import ray_engines
from settings.checks import FieldError
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV, EngineHosting


@pytest.mark.parametrize("address", ["", "auto", "10.0.0.5:6379", "ray://head.ray.svc:10001", "[::1]:6379"])
def test_a_ray_address_of_each_form_is_taken(address: str) -> None:
    hosting = EngineHosting(ray_address=address)
    assert hosting.persistent == bool(address)
    assert EngineHosting.from_environ(hosting.environ()) == hosting


@pytest.mark.parametrize(("fields", "field"), [
    ({"ray_address": "head"}, "ray_address"),  # no port
    ({"ray_address": "ray://head"}, "ray_address"),
    ({"ray_address": "http://head:8265"}, "ray_address"),  # the dashboard's address, not the cluster's
    ({"namespace": "my run"}, "namespace"),
    ({"namespace": "x" * 129}, "namespace"),
])
def test_a_bad_hosting_names_the_field(fields: dict[str, str], field: str) -> None:
    with pytest.raises(FieldError) as err:
        EngineHosting(**fields)
    assert err.value.field == field


def test_a_bad_variable_is_named_by_the_variable() -> None:
    with pytest.raises(FieldError, match=f"^{ENGINES_RAY_ADDRESS_ENV}='head' must be"):
        EngineHosting.from_environ({ENGINES_RAY_ADDRESS_ENV: "head"})
    with pytest.raises(FieldError, match=f"^{ENGINES_NAMESPACE_ENV}='a b' must be"):
        EngineHosting.from_environ({ENGINES_NAMESPACE_ENV: "a b"})


def test_the_environment_without_the_variables_is_todays_hosting() -> None:
    assert EngineHosting.from_environ({}) == EngineHosting()
    assert not EngineHosting().persistent
    assert EngineHosting().ray_namespace == "dapo-engines"
    assert EngineHosting.from_environ({ENGINES_RAY_ADDRESS_ENV: "auto", ENGINES_NAMESPACE_ENV: "n1"}) == EngineHosting("auto", "n1")


def test_each_run_folder_gets_a_namespace_of_its_own() -> None:
    names = {ray_engines.run_namespace(d) for d in ("/runs/tiny", "s3://b/runs/tiny", "/other/tiny", "/runs/tiny-2")}
    assert len(names) == 4
    for name in names:
        EngineHosting(namespace=name)  # each a valid namespace
    assert ray_engines.run_namespace("/runs/tiny/") == ray_engines.run_namespace("/runs/tiny/")
    assert ray_engines.run_namespace("/a/my run!").startswith("dapo-my-run--")


def test_a_run_without_a_ray_address_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINES_RAY_ADDRESS_ENV, raising=False)
    monkeypatch.delenv(ENGINES_NAMESPACE_ENV, raising=False)
    before = dict(os.environ)
    with ray_engines.hosted_for_run("/runs/tiny") as hosting:
        assert hosting == EngineHosting()
        assert dict(os.environ) == before
    assert dict(os.environ) == before
    assert ray_engines.release(EngineHosting()) == []  # nothing to release, and no Ray started for it


def _types_within(annotation: typing.Any, seen: set[type]) -> set[type]:
    """Every class reachable from ``annotation``: itself, its type arguments and dataclass fields."""
    found: set[type] = set()
    for arg in typing.get_args(annotation):
        found |= _types_within(arg, seen)
    if isinstance(annotation, type) and annotation not in seen:
        seen.add(annotation)
        found.add(annotation)
        if dataclasses.is_dataclass(annotation):
            for hint in typing.get_type_hints(annotation).values():
                found |= _types_within(hint, seen)
    return found


def test_no_task_input_and_no_run_config_section_carries_the_hosting() -> None:
    # Flyte's cache key of a task is its inputs (and code version); the run's digest is RunConfig's.
    # The hosting must reach the engines only through the task process's environment, so turning it on
    # neither misses a cached rollout or evaluation nor changes the run's digest.
    pytest.importorskip("flyte")
    from tasks.evaluate import evaluate
    from tasks.rollout import rollout
    from workflows.config import RunConfig

    reached: set[type] = set()
    for task in (rollout, evaluate):
        for hint in typing.get_type_hints(inspect.unwrap(task.func)).values():
            reached |= _types_within(hint, set())
    reached |= _types_within(RunConfig, set())
    assert EngineHosting not in reached
    assert {"settings.rollout"} <= {t.__module__ for t in reached}  # the walk did reach RolloutConfig


class _Routed(Exception):
    """Raised in place of generation: where the round would have run."""


def _stub_round_inputs(monkeypatch: pytest.MonkeyPatch, ro: typing.Any) -> None:
    from pathlib import Path

    monkeypatch.setattr(ro.pruning, "require_weights", lambda source: None)
    monkeypatch.setattr(ro.checkpoints, "fetch_policy", lambda source, **kw: Path(source))
    monkeypatch.setattr(ro.checkpoints, "read_info", lambda folder: type("Info", (), {"checkpoint_id": "c"})())
    monkeypatch.setattr(ro, "tokenize_prompts", lambda folder, prompts, **kw: [[1, 2] for _ in prompts])


@pytest.mark.parametrize("persistent", [False, True])
def test_with_a_ray_address_even_one_engine_runs_on_the_long_lived_actors(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    # A machine without GPUs runs one engine: today in the task's process; with the hosting set, on the
    # long-lived actor (the engine must outlive the task), attached to the named cluster, not RAY_ADDRESS's.
    pytest.importorskip("ray")
    from engines.rollout import stage as ro
    from settings.rollout import RolloutConfig

    _stub_round_inputs(monkeypatch, ro)
    attached: list[EngineHosting] = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ro.ray_actors, "attach", attached.append)
    monkeypatch.setattr(ro.vllm_engine, "gpu_count", lambda: 0)

    def where(source, checkpoint_dir, settings, sampling, parts, *, on_ray, hosting):
        raise _Routed(on_ray, len(parts), hosting)

    monkeypatch.setattr(ro, "_generate_parts", where)
    hosting = EngineHosting("auto", "ns") if persistent else EngineHosting()
    with pytest.raises(_Routed) as routed:
        ro.generate_rollouts("/ckpt", [{"problem_id": f"{i:016x}", "prompt": "1+1=\n"} for i in range(4)],
                             RolloutConfig(max_model_len=256), seed=0, policy_version=0, generation_round=0,
                             hosting=hosting)
    assert routed.value.args == (persistent, 1, hosting)
    assert attached == ([hosting] if persistent else [])


@pytest.mark.parametrize(("cluster_gpus", "held"), [(0, 0), (4, 2)])
def test_a_long_lived_engine_holds_gpus_only_where_the_cluster_has_them(
    monkeypatch: pytest.MonkeyPatch, cluster_gpus: int, held: int
) -> None:
    ray = pytest.importorskip("ray")
    from engines.rollout import stage as ro

    asked: list[tuple[int, int, str]] = []

    class Method:
        def remote(self, *args: typing.Any) -> str:
            return "part"

    class Actor:
        generate = Method()

    def named(count: int, gpus_per_engine: int, namespace: str) -> list[typing.Any]:
        asked.append((count, gpus_per_engine, namespace))
        return [ro._RayEngine(Actor(), None, f"rollout-engine-{i}", namespace) for i in range(count)]

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get", lambda future: future)
    monkeypatch.setattr(ro.vllm_engine, "gpu_count", lambda: cluster_gpus)
    monkeypatch.setattr(ro, "_named_engines", named)
    monkeypatch.setattr(ro, "_ray_engines", lambda count, gpus: pytest.fail("a process-local actor was started"))
    settings = ro.vllm_engine.EngineSettings(tensor_parallel_size=2)
    hosting = EngineHosting("auto", "ns")
    assert ro._ray_generate("ck", settings, {}, [[{}], [{}]], hosting) == ["part", "part"]
    assert asked == [(2, held, "ns")]
