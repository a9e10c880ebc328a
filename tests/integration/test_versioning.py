"""The Flyte tasks themselves carry the derived cache version: editing a module the score task
imports only indirectly gives score (and evaluate) a new cache version, leaves curate's alone.

Each case imports every task module in a fresh process on a copy of the project (~10 s each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from infra.versioning import PROJECT_PACKAGES

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
tasks = (assemble_batch, bootstrap, curate, evaluate, rollout, score, train)
print(json.dumps({t.name.rsplit(".", 1)[-1]: t.cache.version_override for t in tasks}))
"""


def _task_versions(root: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}
    env.pop("DAPO_FLYTE_TARGET", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_editing_answer_extraction_gives_score_and_evaluate_new_cache_versions(tmp_path: Path) -> None:
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    before = _task_versions(tmp_path)

    with (tmp_path / "dapo_core" / "answer_extraction.py").open("a") as f:
        f.write("# an edit that could change who counts as correct\n")
    after = _task_versions(tmp_path)

    assert before["score"] != after["score"]
    assert before["evaluate"] != after["evaluate"]
    assert before["curate"] == after["curate"]
