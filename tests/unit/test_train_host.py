"""Which training steps go to the train host (engines/train/ray_host.py), and how the host is named.

With a long-lived Ray cluster named (settings/rollout.py: EngineHosting) the warm DeepSpeed group lives in a
named actor; a cold config, or no Ray address, trains in the task process as before. The host's name follows
the settings that shape the engine only (a new time limit must not strand a warm group in an old host).
The behaviour on a real cluster: tests/integration/test_persistent_engines.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engines.runtime import ray_actors
from engines.train import launch, ray_host
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV, EngineHosting
from settings.train import TrainConfig

ON_CLUSTER = EngineHosting(ray_address="127.0.0.1:6379", namespace="run-a")


def test_only_warm_steps_with_a_ray_address_go_to_the_train_host() -> None:
    warm, cold = TrainConfig(), TrainConfig(keep_workers_warm=False)
    assert launch._hosted(warm, ON_CLUSTER) == ON_CLUSTER
    assert launch._hosted(cold, ON_CLUSTER) is None  # a cold step has no group to keep
    assert launch._hosted(warm, EngineHosting()) is None  # no cluster: the task's own group, as before


def test_the_hosting_defaults_to_the_one_the_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINES_RAY_ADDRESS_ENV, "auto")
    monkeypatch.setenv(ENGINES_NAMESPACE_ENV, "run-b")
    assert launch._hosted(TrainConfig(), None) == EngineHosting(ray_address="auto", namespace="run-b")
    monkeypatch.delenv(ENGINES_RAY_ADDRESS_ENV)
    assert launch._hosted(TrainConfig(), None) is None


def test_one_host_per_engine_settings_named_for_removal() -> None:
    name = ray_host.host_name(launch.engine_key(TrainConfig()))
    assert name.startswith(ray_actors.HOSTED_PREFIXES) and len(name) == len("train-group-") + 12
    # Neither the time limit nor the warm switch shapes the engine: the same host.
    assert ray_host.host_name(launch.engine_key(TrainConfig(timeout_s=5.0))) == name
    assert ray_host.host_name(launch.engine_key(replace(TrainConfig(), lr=2e-3))) != name


def test_the_host_claims_a_gpu_per_rank_only_for_a_cuda_caller_or_a_deployed_client_pod(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from infra import environments

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(environments, "flyte_target", lambda: "local")
    assert ray_host.host_gpus(4) == 0  # a CPU cluster: its logical GPUs belong to the engines
    monkeypatch.setattr(environments, "flyte_target", lambda: "cluster")
    monkeypatch.setattr(environments, "cluster_settings", lambda: {"train_on_host": False})
    assert ray_host.host_gpus(4) == 0
    monkeypatch.setattr(environments, "cluster_settings", lambda: {"train_on_host": True})
    assert ray_host.host_gpus(4) == 4  # the deployed train task: a GPU-less client of a GPU host
    monkeypatch.setattr(environments, "flyte_target", lambda: "local")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ray_host.host_gpus(4) == 4  # `dapo run` on a GPU machine
