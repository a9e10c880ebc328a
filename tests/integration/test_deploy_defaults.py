"""``dapo deploy --config``: the config becomes the driver task's default inputs (the UI's launch form
opens filled in). Checked against the SDK's own serialisation, decoded back and compared with the config
the local loader builds. The CLI cases run in their own process, as in test_deploy.py (~10 s each).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import flyte.extras
from flyte.types import TypeEngine
from flyteidl2.core import literals_pb2
from google.protobuf.json_format import ParseDict

from cli import deploy
from workflows import driver
from workflows.config import RunConfig, load_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"
TYPES = {"run_config": RunConfig, "run_dir": str}


def _deploy(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    env.pop("DAPO_FLYTE_TARGET", None)
    env.pop("DAPO_CLUSTER_PLAN", None)
    return subprocess.run([sys.executable, "-m", "cli.main", "deploy", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def _decoded(literal: Any, name: str) -> Any:
    if isinstance(literal, dict):  # as --json-out writes it
        literal = ParseDict(literal, literals_pb2.Literal())
    return asyncio.run(TypeEngine.to_python_value(literal, TYPES[name]))


def test_the_registered_default_inputs_are_the_config(tmp_path: Path) -> None:
    out = tmp_path / "deploy.json"
    result = _deploy("--dry-run", "--config", str(TINY), "--set", "run.steps=3", "--run-root", "s3://bucket/runs",
                     "--json-out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    config = load_config(str(TINY), ["run.steps=3"])
    assert f"default inputs of dapo_pipeline: run_config from {TINY} (digest {config.digest()}), " \
           "run_dir s3://bucket/runs/tiny-cpu" in result.stdout
    defaults = json.loads(out.read_text())["driver_default_inputs"]
    assert {name: _decoded(value, name) for name, value in defaults.items()} == {
        "run_config": config, "run_dir": "s3://bucket/runs/tiny-cpu"}


def test_without_a_config_the_driver_has_no_default_inputs(tmp_path: Path) -> None:
    out = tmp_path / "deploy.json"
    result = _deploy("--dry-run", "--json-out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(out.read_text())["driver_default_inputs"] == {}


def test_a_run_root_the_pods_cannot_reach_is_refused_before_serialising() -> None:
    result = _deploy("--dry-run", "--config", str(TINY), "--run-root", "runs")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "dapo deploy: error: --run-root runs: a cluster run needs a run store every pod reaches: an object-store "
        "URI (s3://bucket/runs) or the absolute path where `dapo deploy --run-store-pvc` mounts it (/runs)"]
    assert "would register" not in result.stdout


def test_the_sdk_registers_the_defaults_a_real_deploy_sends() -> None:
    """The wire spec of the task (``flyte.extras.serialize``: the conversion a real deploy uses) carries
    the defaults; name, typed interface and code version are the undecorated task's."""
    config = load_config(str(TINY), ["run.seed=3"])
    task = deploy.with_default_inputs(driver.dapo_pipeline, {"run_config": config, "run_dir": "/runs/tiny-cpu"})
    spec, plain = flyte.extras.serialize(task), flyte.extras.serialize(driver.dapo_pipeline)
    assert {p.name: _decoded(p.parameter.default, p.name) for p in spec.default_inputs} == {
        "run_config": config, "run_dir": "/runs/tiny-cpu"}
    assert not plain.default_inputs
    assert spec.task_template.interface == plain.task_template.interface
    assert spec.task_template.metadata.discovery_version == plain.task_template.metadata.discovery_version
    assert task.name == driver.dapo_pipeline.name
