"""The main job's pipeline with long-lived engine actors: the same checkpoints as the plain local run.

`dapo run` of a short run (tests/e2e/test_cluster_shape.py's config at 2 steps: two engines, two
training ranks kept warm) twice: plain (in-process engine, the warm DeepSpeed group in the driver), and
with ``DAPO_ENGINES_RAY_ADDRESS`` naming a two-node ``ray.cluster_utils.Cluster`` (one logical GPU per
node), where every rollout and evaluation round runs on the run's named, detached engine actors
(engines/rollout/ray_engines.py) and every training step on its train host (engines/train/ray_host.py).
The checkpoint ids and held-out results must be equal, bit for bit; every round's manifest must name the
long-lived engines; step 2 must continue the train host's group in memory, a group the driver never
started, and its rollout must take step 1's weights from the host's memory; and when the run ends no
actor of its namespace may be left on the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray_nodes import two_gpu_nodes

import schemas
from engines.train.publish import TIMINGS_FILE
from storage import checkpoints, run_store
from storage.run_layout import RunLayout
from tests.e2e.test_cluster_shape import CONFIG as SHAPE_CONFIG
from tests.e2e.test_pipeline import DAPO, REPO, _env
from workflows.run_output import LOG_NAME

pytestmark = pytest.mark.slow

STEPS = 2
CONFIG = [item for item in SHAPE_CONFIG if not item.startswith(("run.steps=", "train.keep_workers_warm="))] + [
    f"run.steps={STEPS}", "train.keep_workers_warm=true"]  # warm: the persistent run's steps go to the train host


def _dapo_run(root: Path, env: dict[str, str]) -> RunLayout:
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(root)]
    for item in [*CONFIG, "run.name=warm"]:
        args += ["--set", item]
    started = time.monotonic()
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"dapo run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    print(f"{root.name}: {time.monotonic() - started:.0f} s")
    return RunLayout(root / "warm")


def _outcome(layout: RunLayout) -> dict[str, Any]:
    ids = [checkpoints.read_info(layout.checkpoint(step)).checkpoint_id for step in range(STEPS + 1)]
    evals = {step: schemas.read_shard(layout.eval_shard(step), schemas.EvalResult) for step in (0, STEPS)}
    timings = json.loads(run_store.read_text(run_store.join(layout.checkpoint(STEPS), TIMINGS_FILE)))
    # The driver's own warm group writes its start into the run's log (engines/train/server.py: WorkerLog).
    driver_group = "warm group of" in (run_store.local_path(layout.root) / LOG_NAME).read_text()
    return {"ids": ids, "evals": evals, "continued": timings["continued_in_memory"], "driver_group": driver_group}


def _plain_env() -> dict[str, str]:
    from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV

    env = _env()
    for key in ("RAY_ADDRESS", ENGINES_RAY_ADDRESS_ENV, ENGINES_NAMESPACE_ENV):
        env.pop(key, None)
    return {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    with two_gpu_nodes() as nodes:
        yield nodes


def test_a_run_on_long_lived_engine_actors_gives_the_plain_runs_checkpoints_and_leaves_none(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import ray

    from settings.rollout import ENGINES_RAY_ADDRESS_ENV

    plain = _outcome(_dapo_run(tmp_path_factory.mktemp("plain"), _plain_env()))
    layout = _dapo_run(tmp_path_factory.mktemp("persistent"), {**_plain_env(), ENGINES_RAY_ADDRESS_ENV: cluster.address})
    warm = _outcome(layout)

    assert warm["ids"] == plain["ids"]
    # Step 2 continued a warm group in memory in both runs: the driver's own, or the train host's.
    assert (plain["continued"], plain["driver_group"]) == (1.0, True)
    assert (warm["continued"], warm["driver_group"]) == (1.0, False)
    for step, table in plain["evals"].items():
        assert warm["evals"][step].equals(table), f"held-out results of step {step} differ"
    for step in range(1, STEPS + 1):
        manifests = run_store.glob(layout.step_dir(step), "rollouts/*.manifest.json")
        assert manifests
        weights_from = set()
        for manifest in manifests:
            record = json.loads(run_store.read_text(manifest))
            assert (record["engine_backend"], record["engines"]) == ("ray-persistent", 2), manifest
            weights_from.update(record["engine_weights"])
        # After step 1 every new checkpoint reached the engines from the train host's memory, never the files.
        if step > 1:
            assert "reloaded from memory" in weights_from and weights_from <= {"reloaded from memory", "reused"}, \
                (step, weights_from)
    # The cluster is this test's alone: after the run, no engine actor or train host in any namespace.
    left = ray.util.list_named_actors(all_namespaces=True)
    assert left == [], f"the run left actors behind: {left}"
    assert os.environ.get(ENGINES_RAY_ADDRESS_ENV) is None
