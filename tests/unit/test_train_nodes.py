"""The cluster topology's two switches, run here: the plan's training nodes and the Ray cluster to attach to.

The train task (tasks/train.py) trains on the deployment plan's ``train_nodes`` local elastic agents
(engines/train/nodes.py) when it is not a rank itself, and launches its own torchrun otherwise; the
rollout (engines/rollout/stage.py) joins the Ray cluster that ``RAY_ADDRESS`` names before it counts GPUs, so
the cluster's GPUs decide the engines. Both are parameters of the one code path; the end-to-end run
is tests/e2e/test_cluster_shape.py.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from engines.train import nodes as train_nodes
from engines.train.publish import TrainStepResult
from settings.rollout import RolloutConfig

REPO = Path(__file__).resolve().parents[2]
from settings.train import TrainConfig
from storage import run_store

_ELASTIC_VARS = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE")


def _result(out_dir: str) -> TrainStepResult:
    return TrainStepResult(out_dir, "train-0001-abc", {"checkpoint_id": "train-0001-abc"}, {}, [])


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Which launch the train task picked: (name, nodes or None), recorded instead of training."""
    import engines.train.launch as train_launch

    called: list[tuple[str, Any]] = []
    for name in _ELASTIC_VARS:
        monkeypatch.delenv(name, raising=False)

    def on_nodes(checkpoint_dir, scored_shards, out_dir, *, step, config, layout):
        called.append(("nodes", layout))
        return _result(out_dir)

    def in_store(checkpoint_dir, scored_shards, out_dir, *, step, config):
        called.append(("torchrun", None))
        return _result(out_dir)

    monkeypatch.setattr(train_nodes, "train_step_on_nodes", on_nodes, raising=False)
    monkeypatch.setattr(train_launch, "train_step_in_store", in_store)
    monkeypatch.setattr(importlib.import_module("tasks.train"), "train_step_in_store", in_store)
    return called


def _run_train_task() -> None:
    import asyncio
    import inspect

    from tasks.train import train

    out = train.func("/ckpt/step-0000", ["/steps/batch.parquet"], "/ckpt/step-0001", 1, TrainConfig(num_processes=2))
    if inspect.isawaitable(out):
        asyncio.run(out)


def test_a_plan_of_two_training_nodes_trains_on_two_local_elastic_agents(
    launches: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_CLUSTER_PLAN", json.dumps({"train_nodes": 2, "train_nproc_per_node": 1}))
    _run_train_task()
    assert launches == [("nodes", train_nodes.NodeLayout(nodes=2, nproc_per_node=1))]


def test_without_a_plan_the_train_task_launches_its_own_torchrun_as_before(
    launches: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAPO_CLUSTER_PLAN", raising=False)
    _run_train_task()
    assert launches == [("torchrun", None)]


def test_each_node_has_a_mirror_of_its_own_and_the_ranks_environment_of_the_local_launch(tmp_path: Path) -> None:
    from engines.train.launch import _worker_env

    layout = train_nodes.NodeLayout(nodes=2, nproc_per_node=1)
    envs = [train_nodes._agent_env(layout, node, tmp_path) for node in (0, 1)]
    mirrors = {env[run_store.MIRROR_ENV] for env in envs}
    assert len(mirrors) == 2 and all(m.startswith(str(tmp_path)) for m in mirrors)
    expected = _worker_env(2)
    for env in envs:
        assert {k: v for k, v in env.items() if k != run_store.MIRROR_ENV} == {
            k: v for k, v in expected.items() if k != run_store.MIRROR_ENV}
    commands = [train_nodes._agent_command(layout, node, 29500, tmp_path) for node in (0, 1)]
    assert [c[c.index("--node_rank") + 1] for c in commands] == ["0", "1"]
    assert all(c[-3:-1] == ["-m", "engines.train.nodes"] for c in commands)


class _Counted(Exception):
    """Raised in place of generation: how the round would have been split and where it would run."""


def test_a_driver_given_ray_address_attaches_to_that_cluster_and_spreads_the_round_over_its_gpus(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = pytest.importorskip("ray")
    from engines.rollout import stage as ro

    joined: list[Any] = []
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(ray, "init", lambda *a, **kw: joined.append(kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 2.0, "CPU": 2.0})
    monkeypatch.setattr(ro.pruning, "require_weights", lambda source: None)
    monkeypatch.setattr(ro.checkpoints, "fetch_policy", lambda source, **kw: Path(source))
    monkeypatch.setattr(ro.checkpoints, "read_info", lambda folder: type("Info", (), {"checkpoint_id": "c"})())
    monkeypatch.setattr(ro, "tokenize_prompts", lambda folder, prompts, **kw: [[1, 2] for _ in prompts])

    def where(source, checkpoint_dir, settings, sampling, parts, *, on_ray, hosting):
        raise _Counted(on_ray, len(parts))

    monkeypatch.setattr(ro, "_generate_parts", where)
    problems = [{"problem_id": f"{i:016x}", "prompt": "1+1=\n"} for i in range(4)]
    with pytest.raises(_Counted) as counted:
        ro.generate_rollouts("/ckpt", problems, RolloutConfig(engines=2, max_model_len=256), seed=0,
                             policy_version=0, generation_round=0)
    assert counted.value.args == (True, 2)
    assert len(joined) == 1  # ray.init() reads RAY_ADDRESS itself


def test_without_ray_address_a_round_starts_no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    from engines.rollout import stage as ro

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", lambda *a, **kw: pytest.fail("ray.init called without RAY_ADDRESS"))
    monkeypatch.setattr(ro.pruning, "require_weights", lambda source: None)
    monkeypatch.setattr(ro.checkpoints, "fetch_policy", lambda source, **kw: Path(source))
    monkeypatch.setattr(ro.checkpoints, "read_info", lambda folder: type("Info", (), {"checkpoint_id": "c"})())
    monkeypatch.setattr(ro, "tokenize_prompts", lambda folder, prompts, **kw: [[1, 2] for _ in prompts])
    monkeypatch.setattr(ro.vllm_engine, "gpu_count", lambda: 0)

    def where(source, checkpoint_dir, settings, sampling, parts, *, on_ray, hosting):
        raise _Counted(on_ray, len(parts))

    monkeypatch.setattr(ro, "_generate_parts", where)
    with pytest.raises(_Counted) as counted:
        ro.generate_rollouts("/ckpt", [{"problem_id": f"{i:016x}", "prompt": "1+1=\n"} for i in range(4)],
                             RolloutConfig(engines=2, max_model_len=256), seed=0, policy_version=0, generation_round=0)
    assert counted.value.args == (False, 2)  # two parts, one after another on this process's engine


def test_a_node_that_fails_stops_the_others_and_is_the_one_named(tmp_path: Path) -> None:
    # The ranks of the surviving node would wait for the failed node's ranks until the process group
    # times out (30 min by default): the launcher stops them as soon as one agent fails.
    import subprocess
    import time

    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    failing = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"])
    started = time.monotonic()
    assert train_nodes._wait_for_agents([waiting, failing]) == 1
    assert time.monotonic() - started < train_nodes.STOP_GRACE_S
    assert waiting.returncode is not None and failing.returncode == 3
    ok = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert train_nodes._wait_for_agents(ok) is None


def test_a_run_trained_on_nodes_starts_no_local_worker_group(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The nodes' agents train; a warm local DeepSpeed group would sit unused (before: it was started anyway).
    import json
    from types import SimpleNamespace

    from storage.run_layout import RunLayout
    from workflows import driver
    from workflows.config import load_config

    started: list[str] = []
    monkeypatch.setattr(driver.flyte, "ctx", lambda: SimpleNamespace(mode="local"))
    monkeypatch.setattr(driver, "start_workers", lambda config: started.append("train"))
    monkeypatch.setattr(driver, "start_verifier_pool", lambda workers: started.append("verifiers"))
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml", [])
    layout = RunLayout(tmp_path / "run")
    monkeypatch.setenv("DAPO_CLUSTER_PLAN", json.dumps({"train_nodes": 2, "train_nproc_per_node": 1}))
    driver.start_workers_early(cfg, layout)
    assert started == ["verifiers"]
    monkeypatch.delenv("DAPO_CLUSTER_PLAN")
    driver.start_workers_early(cfg, layout)
    assert started == ["verifiers", "train", "verifiers"]
