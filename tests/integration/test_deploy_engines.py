"""``dapo deploy --engines-ray-address``: a cluster user gets long-lived engines without editing the
task environments by hand (issue 50). Every pod (the driver, rollout, evaluate, train) gets the
DAPO_ENGINES_* variables (settings/rollout.py: EngineHosting), with the run folder's namespace derived as
a local run derives it, or the one named; rollout and evaluate become plain pods joining the long-lived
cluster (a RayJob's task would join its own Ray instead). A bad value is refused in one line naming the
option, exit 2, before anything is registered. The CLI cases run in their own process, as in
test_deploy.py (~10 s for the dry run, well under 1 s for a refusal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.deploy import DeployInputError, engine_hosting
from engines.rollout.ray_engines import run_namespace
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV, EngineHosting

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"
ADDRESS = "ray://head:10001"


def _deploy(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    for name in ("DAPO_FLYTE_TARGET", "DAPO_CLUSTER_PLAN", ENGINES_RAY_ADDRESS_ENV, ENGINES_NAMESPACE_ENV):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "cli.main", "deploy", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def test_every_pod_gets_the_engines_variables_and_rollout_joins_the_long_lived_cluster(tmp_path: Path) -> None:
    out = tmp_path / "deploy.json"
    result = _deploy("--dry-run", "--config", str(TINY), "--run-root", "s3://bucket/runs", "--engines-ray-address",
                     ADDRESS, "--json-out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    namespace = run_namespace("s3://bucket/runs/tiny-cpu")  # the driver's default run folder's, as locally
    assert f"engines: long-lived named actors on {ADDRESS}, namespace {namespace}" in result.stdout
    tasks = {row["task"]: row for row in json.loads(out.read_text())["tasks"]}
    for task in ("dapo-cpu.dapo_pipeline", "dapo-rollout.rollout", "dapo-rollout.evaluate", "dapo-train.train"):
        assert EngineHosting.from_environ(tasks[task]["env"]) == EngineHosting(ADDRESS, namespace), task
    for task in ("dapo-rollout.rollout", "dapo-rollout.evaluate"):
        assert tasks[task]["type"] != "ray" and not tasks[task]["plugin"], task  # a plain pod, no RayJob of its own
    # A one-node train plan with warm workers: the train task is the train host's client, a pod without GPUs.
    assert "gpu" not in tasks["dapo-train.train"]["resources"]
    assert json.loads(out.read_text())["cluster_plan_env"]["train_on_host"]
    assert "train: a client pod of the train host, a warm DeepSpeed group of 1 rank(s)" in result.stdout


def test_the_train_task_stays_a_pytorch_elastic_job_without_a_long_lived_cluster(tmp_path: Path) -> None:
    plain = tmp_path / "plain.json"
    result = _deploy("--dry-run", "--config", str(TINY), "--json-out", str(plain))
    assert result.returncode == 0, result.stderr[-3000:]
    tasks = {row["task"]: row for row in json.loads(plain.read_text())["tasks"]}
    assert tasks["dapo-train.train"]["resources"]["gpu"] == "1"  # the elastic job's pod holds its rank's GPU
    assert not json.loads(plain.read_text())["cluster_plan_env"]["train_on_host"]
    # Without a long-lived cluster, a state written every 10 steps would be replayed by fresh pods every step:
    # refused, before anything is built.
    refused = _deploy("--dry-run", "--config", str(TINY), "--run-root", "s3://bucket/runs", "--set",
                      "train.optimizer_state_every=10")
    assert refused.returncode == 2 and "starts fresh pods every step" in refused.stderr, refused.stderr[-2000:]
    # The paper plan trains on 2 nodes: with a long-lived cluster its train task is the client of a host group of
    # two members, one per node (no Elastic plugin, no GPU in the pod), which keeps the state warm (K = 10 accepted).
    paper = REPO / "configs" / "qwen2.5-32b-dapo.yaml"
    grouped = tmp_path / "paper.json"
    on_nodes = _deploy("--dry-run", "--config", str(paper), "--run-root", "s3://bucket/runs", "--engines-ray-address",
                       ADDRESS, "--set", "train.optimizer_state_every=10", "--json-out", str(grouped))
    assert on_nodes.returncode == 0, on_nodes.stderr[-3000:]
    paper_tasks = {row["task"]: row for row in json.loads(grouped.read_text())["tasks"]}
    assert "gpu" not in paper_tasks["dapo-train.train"]["resources"] and not paper_tasks["dapo-train.train"]["plugin"]
    assert "a warm DeepSpeed group of 8 rank(s) on each of 2 nodes" in on_nodes.stdout
    assert "row d: the train task is a client of the train host (a group of 2 members, one per train node) on the " \
        "long-lived Ray cluster (--engines-ray-address), with train.optimizer_state_every=10" in on_nodes.stdout
    # One node with a long-lived cluster keeps the ranks warm and replays a lost state: the setting is accepted.
    on_host = _deploy("--dry-run", "--config", str(TINY), "--run-root", "s3://bucket/runs", "--engines-ray-address",
                      ADDRESS, "--set", "train.optimizer_state_every=10")
    assert on_host.returncode == 0, on_host.stderr[-3000:]


def test_a_named_namespace_is_kept_and_needs_no_run_folder() -> None:
    assert engine_hosting(ADDRESS, "team-a", run_dir="", target="cluster") == EngineHosting(ADDRESS, "team-a")
    assert engine_hosting(ADDRESS, "", run_dir="/runs/x", target="cluster") == EngineHosting(ADDRESS, run_namespace("/runs/x"))
    assert engine_hosting("", "", run_dir="/runs/x", target="cluster") is None  # no option: no hosting, as before


@pytest.mark.parametrize(("address", "namespace", "run_dir", "target", "named"), [
    ("head", "", "/runs/x", "cluster", "--engines-ray-address 'head'"),
    ("auto", "", "/runs/x", "cluster", "--engines-ray-address 'auto'"),  # a pod has no Ray of its own to find
    ("head:6379", "", "/runs/x", "cluster", "ray://HOST:PORT"),  # a pod joins only through Ray's client
    ("ray://head", "", "/runs/x", "cluster", "--engines-ray-address 'ray://head'"),
    (ADDRESS, "two words", "", "cluster", "--engines-namespace 'two words'"),
    (ADDRESS, "", "", "cluster", "--engines-namespace NAME"),  # no namespace and no run folder to derive one
    ("", "team-a", "", "cluster", "--engines-namespace 'team-a'"),  # a namespace without a cluster
    (ADDRESS, "team-a", "", "local", "--target cluster"),
])
def test_a_bad_engines_option_is_refused_naming_it(address: str, namespace: str, run_dir: str, target: str,
                                                   named: str) -> None:
    with pytest.raises(DeployInputError, match=named.replace("(", r"\(").replace("*", r"\*")) as refused:
        engine_hosting(address, namespace, run_dir=run_dir, target=target)
    assert len(str(refused.value).splitlines()) == 1


def test_the_cli_refuses_a_bad_address_in_one_line_before_registering() -> None:
    # Not a dry run, and no backend: the refusal comes before the backend's config is even read.
    result = _deploy("--flyte-config", "/nonexistent/config.yaml", "--engines-ray-address", "head",
                     "--engines-namespace", "team-a")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("dapo deploy: error: --engines-ray-address 'head'")
