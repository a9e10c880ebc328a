"""The cluster topology, here, end to end: the same checkpoints as the plain local run, bit for bit.

One run of the tiny pipeline (2 steps) as a cluster runs it, on this machine:
- the run folder in an object store (the suite's local S3 server), the driver with its own mirror;
- rollout and evaluation on Ray actors over a real two-node Ray cluster (``ray.cluster_utils.Cluster``,
  one logical GPU per node, so two engines of one GPU each are one per node) that the driver attaches to
  through ``RAY_ADDRESS``, as on a cluster's Ray head (engines/rollout/stage.py);
- training as 2 elastic ranks on 2 "nodes", each agent with its own mirror folder, so they share only
  the store: the deployment plan's ``train_nodes`` (``DAPO_CLUSTER_PLAN``), which the train task runs
  with engines/train/nodes.py on the rank body a cluster runs (engines/train/rank.py).
The driver is killed with SIGKILL (its whole process group, as a pod dies) while step 2 trains (step 1
published: the resume starts from it), and the run is resumed. Its checkpoint ids and held-out results
must equal those of the plain local run of the same config (same world size: 2 torchrun ranks there,
on the local default's warm worker group: the weights do not depend on how the ranks are started).
Then the reward code changes (a copy of the project with the rule revision bumped,
dapo_core/rewards.py): the run must re-score and retrain every step from the new batches, not hand
back the weights published from the old ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import schemas
from infra.versioning import LOCK_FILES, PROJECT_PACKAGES
from storage import checkpoints, run_store
from storage.run_layout import RunLayout
from tests.e2e.test_pipeline import DAPO, REPO, SHIPPED, _env

pytestmark = pytest.mark.slow

# 2 steps: the kill in step 2 finds step 1 published, so the resume starts from a published step and
# trains the last one again; every cluster step costs ~20 s of cold 2-node launch on 2 cores (a third
# step added ~25 s to each of the three runs and checked nothing the second does not).
STEPS = 2
# SMALL (tests/e2e/test_pipeline.py) with 2 steps, two engines and two training ranks (the local run
# splits each round in two parts on its one engine and launches 2 torchrun ranks: the same requests and
# the same gloo world as the cluster's), one thread per engine, and every checkpoint kept whole (a
# retrain needs the weights). The step-0 policy is the default's shipped one, on the default's data (its
# warm-up is test_pipeline.py's to cover).
CONFIG = [item for item in SHIPPED if not item.startswith("run.steps=")] + [
    f"run.steps={STEPS}", "rollout.engines=2", "rollout.cpu_threads=1", "train.num_processes=2",
    "run.keep_optimizer_checkpoints=0", "run.keep_weights_every_steps=0",
]
# The cluster topology starts its ranks per step (no warm worker group); the local run keeps the default
# warm group, which starts while it curates and evaluates step 0 and saves ~15 s of launch a step.
COLD_RANKS = ["train.keep_workers_warm=false"]
PLAN = {"train_nodes": 2, "train_nproc_per_node": 1}


def _run_args(run_root: str, extra: tuple[str, ...] = tuple(COLD_RANKS)) -> list[str]:
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", run_root]
    for item in [*CONFIG, *extra, "run.name=shape"]:
        args += ["--set", item]
    return args


def _dapo_run(args: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"dapo run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@contextmanager
def _reading(env: dict[str, str]) -> Iterator[None]:
    """This test process pointed at the run's store and the driver's mirror."""
    keys = [k for k in env if k.startswith("FLYTE_") or k.startswith("AWS_") or k == run_store.MIRROR_ENV]
    with pytest.MonkeyPatch.context() as patch:
        for key in keys:
            patch.setenv(key, env[key])
        run_store._filesystem.cache_clear()
        try:
            yield
        finally:
            run_store._filesystem.cache_clear()


def _outcome(layout: RunLayout) -> dict[str, Any]:
    """What must not depend on the topology: each checkpoint's id and the held-out results."""
    ids = [checkpoints.read_info(layout.checkpoint(step)).checkpoint_id for step in range(STEPS + 1)]
    evals = {step: schemas.read_shard(run_store.fetch(layout.eval_shard(step)), schemas.EvalResult)
             for step in (0, STEPS)}
    return {"ids": ids, "evals": evals}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plain local run: a run folder on disk, in-process engine, 2 torchrun ranks kept warm."""
    root = tmp_path_factory.mktemp("local")
    started = time.monotonic()
    _dapo_run(_run_args(str(root), extra=()), _env())
    outcome = _outcome(RunLayout(root / "shape"))
    print(f"local run: {time.monotonic() - started:.0f} s")
    return outcome


@pytest.fixture(scope="module")
def ray_cluster(s3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two Ray nodes on this machine, one CPU and one logical GPU each; yields the head's address.

    Each node is set up as a cluster's Ray worker pod is: the store's endpoint and credentials, and a
    mirror folder of its own (the engines fetch the checkpoints from the store)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Inherited by every worker of the nodes: the store, and vLLM's engine core in the actor's own process.
    common = {**s3.env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in common.items():
            patch.setenv(key, value)

        def node(index: int) -> dict[str, Any]:
            mirror = str(tmp_path_factory.mktemp(f"ray-node-{index}-mirror"))
            return {"num_cpus": 1, "num_gpus": 1, "env_vars": {**common, run_store.MIRROR_ENV: mirror}}

        two_nodes = Cluster(initialize_head=True, head_node_args={**node(0), "include_dashboard": False})
        try:
            two_nodes.add_node(**node(1))
            two_nodes.wait_for_nodes()
            yield two_nodes.address
        finally:
            two_nodes.shutdown()
            ray.shutdown()


def _train_staging(system_temp: Path, step: int) -> list[Path]:
    """Step ``step``'s staging folders in the local training nodes' mirrors (engines/train/nodes.py)."""
    try:
        return list(system_temp.glob(f"dapo-train-nodes-pid*/node-*-mirror/**/.step-{step:04d}.staging-rank-*"))
    except FileNotFoundError:  # a folder removed while the walk was in it (an earlier step's staging)
        return []


def _kill_while_step_trains(args: list[str], env: dict[str, str], system_temp: Path, step: int) -> None:
    """Start the run; SIGKILL the driver's process group (the driver, its agents and ranks) once step
    ``step`` is training on the nodes."""
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 1200
        while not _train_staging(system_temp, step):
            if proc.poll() is not None:
                raise AssertionError(f"the run ended before step {step} trained:\n{proc.stderr.read()[-6000:]}")
            assert time.monotonic() < deadline, f"step {step} never started training"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already: it failed
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


@pytest.fixture(scope="module")
def cluster_run(s3, ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The cluster-shaped run: killed while step 2 trains, then resumed to the end."""
    system_temp = tmp_path_factory.mktemp("system-temp")  # the driver's TMPDIR: the nodes' folders are there
    root = f"s3://dapo-test/shape-{uuid.uuid4().hex[:8]}"
    env = {**_env(system_temp), **s3.env, run_store.MIRROR_ENV: str(tmp_path_factory.mktemp("driver-mirror")),
           "RAY_ADDRESS": ray_cluster, "DAPO_CLUSTER_PLAN": json.dumps(PLAN), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    layout = RunLayout(run_store.join(root, "shape"))
    started = time.monotonic()
    _kill_while_step_trains(_run_args(root), env, system_temp, step=2)
    killed_s = time.monotonic() - started
    with _reading(env):
        published_at_kill = [checkpoints.is_complete(layout.checkpoint(step)) for step in range(STEPS + 1)]
    resumed = _dapo_run(_run_args(root), env)
    print(f"cluster-shaped run: {killed_s:.0f} s to the kill in step 2, {time.monotonic() - started:.0f} s resumed")
    with _reading(env):
        outcome = _outcome(layout)
    return {"env": env, "layout": layout, "system_temp": system_temp, "published_at_kill": published_at_kill,
            "resumed": resumed, **outcome}


def test_the_cluster_topology_resumed_after_kill_9_gives_the_local_runs_checkpoints_and_accuracy(
    local_run: dict[str, Any], cluster_run: dict[str, Any]
) -> None:
    assert cluster_run["published_at_kill"] == [True, True, False]  # killed in step 2, before its publish
    assert cluster_run["ids"] == local_run["ids"]
    for step, table in local_run["evals"].items():
        assert cluster_run["evals"][step].equals(table), f"held-out results of step {step} differ"
    layout: RunLayout = cluster_run["layout"]
    with _reading(cluster_run["env"]):
        # It was the cluster topology: every step trained by 2 elastic ranks, every round on the Ray actors.
        for step in range(1, STEPS + 1):
            timings = json.loads(run_store.read_text(run_store.join(layout.checkpoint(step), "train_timings.json")))
            assert timings.get("elastic_ranks") == 2.0, (step, timings)
            manifests = run_store.glob(layout.step_dir(step), "rollouts/*.manifest.json")
            assert manifests
            for manifest in manifests:
                record = json.loads(run_store.read_text(manifest))
                assert (record["engine_backend"], record["engines"]) == ("ray", 2), manifest
    # The resume removed the killed run's node folders from the temp folder (its pid is in their name).
    assert not list(cluster_run["system_temp"].glob("dapo-train-nodes-*"))


def _project_with_new_reward_revision(dest: Path) -> Path:
    """A copy of the project whose rule reward names a new revision (``_RULE_REVISION`` + 1, which
    dapo_core/rewards.py says to bump on any change that can alter a verdict)."""
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", *LOCK_FILES):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "assets" / "policies", dest / "assets" / "policies")  # the shipped step-0 policy
    rewards = dest / "dapo_core" / "rewards.py"
    text = rewards.read_text()
    revision = int(re.search(r"^_RULE_REVISION: int = (\d+)$", text, re.M).group(1))
    rewards.write_text(text.replace(f"_RULE_REVISION: int = {revision}\n", f"_RULE_REVISION: int = {revision + 1}\n"))
    return dest


def _reward_versions(layout: RunLayout) -> dict[int, str]:
    """Each step's reward version, as its batch records it (one per step)."""
    versions = {}
    for step in range(1, STEPS + 1):
        (versions[step],) = set(schemas.read_shard(run_store.fetch(layout.batch_shard(step)), schemas.ScoredRollout)
                                .column("reward_version").to_pylist())
    return versions


def test_after_a_reward_code_change_the_cluster_topology_rescores_and_retrains_every_step(
    local_run: dict[str, Any], cluster_run: dict[str, Any], tmp_path: Path
) -> None:
    from engines.train.publish import batch_sha256_of

    layout: RunLayout = cluster_run["layout"]
    env = cluster_run["env"]
    with _reading(env):
        before = [checkpoints.read_info(layout.checkpoint(step)).inputs["batch_sha256"] for step in range(1, STEPS + 1)]
        old_versions = _reward_versions(layout)
    project = _project_with_new_reward_revision(tmp_path / "project")
    started = time.monotonic()
    _dapo_run(_run_args(layout.root.rsplit("/", 1)[0]), {**env, "PYTHONPATH": str(project)}, cwd=project)
    print(f"after the reward change: {time.monotonic() - started:.0f} s")
    with _reading(env):
        (old,) = set(old_versions.values())
        revision = int(re.search(r"-r(\d+)\+", old).group(1))
        new = old.replace(f"-r{revision}+", f"-r{revision + 1}+")
        assert _reward_versions(layout) == dict.fromkeys(range(1, STEPS + 1), new)  # every step re-scored
        for step in range(1, STEPS + 1):
            batch = batch_sha256_of([str(run_store.fetch(layout.batch_shard(step)))])
            info = checkpoints.read_info(layout.checkpoint(step))
            # Retrained from the new batch: the published step records it, not the old one.
            assert batch != before[step - 1], f"step {step}: the batch did not change"
            assert info.inputs["batch_sha256"] == batch, f"step {step}: the checkpoint was not retrained"
        after = _outcome(layout)
    # The revision changes no verdict here: the retrained weights are the same, bit for bit.
    assert after["ids"] == local_run["ids"]
