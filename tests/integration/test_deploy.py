"""``dapo deploy --dry-run``: every environment and task serialises offline, and a broken task fails it.

Each case runs the CLI in its own process (the deploy target is fixed when the task modules are
imported), ~10 s each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAPER_CONFIG = REPO / "configs" / "qwen2.5-32b-dapo.yaml"


def _deploy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    env.pop("DAPO_FLYTE_TARGET", None)
    env.pop("DAPO_CLUSTER_PLAN", None)
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "deploy", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def test_dry_run_serialises_every_task() -> None:
    result = _deploy("--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "would register 8 task(s) in 3 environment(s)" in result.stdout
    for task in ("curate", "bootstrap", "score", "assemble_batch", "dapo_pipeline", "rollout", "evaluate", "train"):
        assert f".{task}  [" in result.stdout, task


def test_the_main_jobs_config_dry_runs() -> None:
    """Its step-0 policy is shipped (bootstrap.source: shipped:tiny-addsub30), a tiny one: no cluster plan
    to size, as for bootstrap.source: tiny (the dry run refused it, asking for --model)."""
    result = _deploy("--dry-run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "would register 8 task(s) in 3 environment(s)" in result.stdout


def test_paper_config_resolves_to_cluster_resources(tmp_path: Path) -> None:
    out = tmp_path / "deploy.json"
    result = _deploy("--dry-run", "--config", str(PAPER_CONFIG), "--run-store-pvc", "dapo-runs", "--json-out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resolved resources for Qwen2.5-32B" in result.stdout
    # the checkpoint hand-off per step and the run's checkpoint storage (infra/handoff.py)
    assert "b) persistent engine actors, fresh train pods (as built with a persistent Ray cluster): 458.7 GB written" \
        in result.stdout and "e) designed (modelled)" in result.stdout
    assert "d) persistent engines and train ranks" in result.stdout  # the train host (issue 50)
    assert "c) open-source Flyte, no persistent cluster" in result.stdout  # a fresh RayJob per call (issue 50)
    assert "500 steps keep 2.6 TB of checkpoints" in result.stdout
    payload = json.loads(out.read_text())
    tasks = {row["task"]: row for row in payload["tasks"]}
    # rollout and evaluate are RayJobs: 2 worker pods of 8 GPUs (4 engines x tensor parallel 4)
    assert tasks["dapo-rollout.rollout"]["type"] == "ray"
    # without --engines-ray-address no pod names a long-lived Ray cluster (tests/integration/test_deploy_engines.py)
    assert not any(name.startswith("DAPO_ENGINES_") for row in tasks.values() for name in row["env"])
    # each worker pod asks for what the plan computes (8 CPUs per GPU, host memory for 8 weight shards),
    # not a fixed 64 CPUs / 900Gi (infra/sizing.pod_request)
    assert tasks["dapo-rollout.rollout"]["plugin"] == "RayJob vllm-engines: 2 pod(s) x 8 GPU (requests cpu=64, memory=175Gi)"
    # training: a PyTorchJob of 2 nodes x 8 GPUs (16 ranks: ZeRO-3 with chunked log-probs), each
    # rank running the task body
    assert tasks["dapo-train.train"]["type"] == "pytorch"
    assert tasks["dapo-train.train"]["resources"]["gpu"] == "8"  # per node
    assert tasks["dapo-train.train"]["resources"]["memory"] == payload["cluster_plan_env"]["train_pod_memory"]
    assert tasks["dapo-train.train"]["plugin"].startswith("PyTorchJob (Elastic): 2 node(s) x 8 rank(s)")
    assert payload["plan"]["train_gpus"] == 16 and payload["plan"]["zero_stage"] == 3
    assert payload["cluster_plan_env"]["run_store_pvc"] == "dapo-runs"


def test_a_task_with_an_unserialisable_input_fails_the_dry_run() -> None:
    # Flyte serialises only tasks under the source root (the repository), so the throwaway module
    # lives there for the duration of the test, under a unique name.
    module = REPO / "tests" / "integration" / f"_throwaway_tasks_{uuid.uuid4().hex[:8]}.py"
    module.write_text(
        "import threading\n"
        "import flyte\n"
        "env = flyte.TaskEnvironment(name='throwaway')\n"
        "class Opaque:\n"
        "    def __init__(self) -> None:\n"
        "        self.lock = threading.Lock()\n"
        "@env.task\n"
        "def broken(handle: Opaque, n: int) -> int:\n"
        "    return n\n"
    )
    try:
        result = _deploy("--dry-run", "--module", str(module))
    finally:
        module.unlink()
    assert result.returncode == 1, result.stdout[-2000:]
    assert "throwaway.broken: input 'handle'" in result.stderr
    assert "no Flyte type" in result.stderr


def test_a_module_that_fails_to_import_fails_the_dry_run(tmp_path: Path) -> None:
    module = tmp_path / "bad_env.py"
    module.write_text("import flyte\nenv = flyte.TaskEnvironment(name='bad', resources=flyte.Resources(gpu=-1))\n")
    result = _deploy("--dry-run", "--module", str(module))
    assert result.returncode == 1
    assert f"importing {module}" in result.stderr


def test_serve_adds_the_serving_app_for_an_object_store_checkpoint(s3_env, tmp_path: Path) -> None:
    # A run folder in the object store: --serve names the run, the app serves its final checkpoint
    # under its checkpoint id, with the rollout engine's flags (the run's dtype, the model's context).
    from engines.bootstrap import tiny_policy
    from storage import checkpoints, run_store
    from workflows.config import load_config

    run = f"s3://dapo-test/serve-{uuid.uuid4().hex[:8]}/tiny"
    for step in (0, 3):
        local = tiny_policy.build_random_checkpoint(tmp_path / f"step-{step}", seed=step)
        run_store.upload_folder(local, f"{run}/checkpoints/step-{step:04d}")
    config = load_config(REPO / "configs" / "tiny-cpu.yaml", ["rollout.dtype=bfloat16"])
    run_store.write_text(f"{run}/run.json", json.dumps({"config": config.to_dict()}))
    out = tmp_path / "deploy.json"
    result = _deploy("--dry-run", "--serve", run, "--json-out", str(out), env=s3_env.env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "would register 8 task(s) in 3 environment(s) and 1 app(s)" in result.stdout
    [app] = json.loads(out.read_text())["apps"]
    final_id = checkpoints.read_info(tmp_path / "step-3").checkpoint_id
    assert app["app"] == "dapo-serve" and app["resources"]["gpu"] == "1"
    args = " ".join(app["args"])
    assert args.startswith(f"vllm-fserve serve /tmp/flyte/model --served-model-name {final_id} --port 8080 ")
    for flag in ("--dtype bfloat16", f"--max-model-len {tiny_policy.DEFAULT_MAX_POSITIONS}", "--logprobs-mode raw_logprobs",
                 "--generation-config vllm"):
        assert flag in args, flag


def test_serve_refuses_a_local_checkpoint(tmp_path: Path) -> None:
    result = _deploy("--dry-run", "--serve", str(tmp_path))
    assert result.returncode == 2  # the option given is wrong (a code problem exits 1: the tests above)
    assert f"--serve {tmp_path}: the serving app streams the checkpoint from the object store" in result.stderr


@pytest.mark.parametrize("model", ["Qwen2.5-7B", "Llama-3.1-8B"])
def test_a_bootstrap_source_folder_is_sized_from_its_config_json(model: str) -> None:
    # Before: exit 2, "no known architecture in its name; pass --model one of ['qwen2.5-32b']".
    source = REPO / "tests" / "data" / "model_configs" / model
    result = _deploy("--dry-run", "--config", str(PAPER_CONFIG), "--set", f"bootstrap.source={source}")
    assert result.returncode == 0, result.stderr
    assert f"resolved resources for {model}" in result.stdout
