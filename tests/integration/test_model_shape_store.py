"""A model's shape read from its config.json in an object store (infra/model_shape.py), for ``dapo deploy``.

``bootstrap.source: s3://bucket/path/model`` is sized from that folder's config.json alone: no weight
is fetched to plan. Run against the local S3 server (tests/s3_server.py) with the config.json files
carried under tests/data/model_configs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from infra import model_shape, sizing

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "model_configs"
PAPER_CONFIG = REPO / "configs" / "qwen2.5-32b-dapo.yaml"


def _upload_model(name: str, *, with_config: bool = True) -> str:
    """``s3://dapo-test/<fresh>/<name>`` holding the carried config.json and a stand-in weights file."""
    from storage import run_store

    folder = f"s3://dapo-test/models-{uuid.uuid4().hex[:8]}/{name}"
    if with_config:
        run_store.upload_file(CONFIGS / name / model_shape.CONFIG_FILE, f"{folder}/{model_shape.CONFIG_FILE}")
    run_store.write_text(f"{folder}/model.safetensors", "not weights: planning must not read this")
    return folder


def test_the_shape_of_an_object_store_folder_is_its_config_json(s3_env, tmp_path: Path) -> None:
    # Before: load_architecture read Path("s3:/dapo-test/...")/config.json: "no config.json there".
    folder = _upload_model("Qwen2.5-0.5B")
    arch = model_shape.load_architecture(folder)
    assert arch == model_shape.load_architecture(CONFIGS / "Qwen2.5-0.5B")
    assert sizing.parameter_count(arch) == 494_032_768
    mirror = Path(os.environ["DAPO_MIRROR_DIR"])
    assert not mirror.exists() or not any(mirror.rglob("*")), "nothing is fetched into the mirror to plan"


def test_an_object_store_folder_without_config_json_is_named(s3_env) -> None:
    folder = _upload_model("Qwen2.5-7B", with_config=False)
    assert not model_shape.has_config(folder)
    with pytest.raises(ValueError, match=f"{folder}/config.json: no config.json there"):
        model_shape.load_architecture(folder)


def test_deploy_sizes_an_object_store_bootstrap_source(s3_env) -> None:
    # Before: "no known architecture in its name; pass --model one of ['qwen2.5-32b']" (exit 2).
    from cli.deploy import architecture_for

    arch = architecture_for(_upload_model("Llama-3.1-8B"))
    assert arch is not None and arch.name == "Llama-3.1-8B"


def _deploy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env, "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    env.pop("DAPO_FLYTE_TARGET", None)
    env.pop("DAPO_CLUSTER_PLAN", None)
    return subprocess.run([sys.executable, "-m", "cli.main", "deploy", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_deploy_dry_run_of_an_object_store_source(s3_env) -> None:
    folder = _upload_model("Qwen2.5-7B")
    result = _deploy("--dry-run", "--config", str(PAPER_CONFIG), "--set", f"bootstrap.source={folder}", env=s3_env.env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resolved resources for Qwen2.5-7B" in result.stdout


def test_deploy_refuses_an_object_store_source_without_config_json_in_one_line(s3_env) -> None:
    folder = _upload_model("Some-Model-7B", with_config=False)
    result = _deploy("--dry-run", "--config", str(PAPER_CONFIG), "--set", f"bootstrap.source={folder}", env=s3_env.env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{folder}/config.json" in result.stderr and "Traceback" not in result.stderr


def test_a_store_that_cannot_be_asked_is_one_line_naming_the_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    # obstore's errors carry a many-line debug dump after the first line (an unreachable endpoint: ~20 s
    # of retries, so faked here).
    from storage import run_store

    def unreachable(path: str) -> bool:
        raise RuntimeError("Generic S3 error: Error performing HEAD http://127.0.0.1:9/b/m/config.json\n\nDebug source:\n{")

    monkeypatch.setattr(run_store, "exists", unreachable)
    with pytest.raises(ValueError) as caught:
        model_shape.has_config("s3://b/m")
    assert str(caught.value) == ("s3://b/m/config.json: cannot read the object store (RuntimeError: Generic S3 error: "
                                 "Error performing HEAD http://127.0.0.1:9/b/m/config.json)")
