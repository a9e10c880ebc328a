"""Stage cache versions follow the code a stage really runs (infra/versioning.py).

The project-level tests work on a copy of the source packages in ``tmp_path``, edit one file
there and recompute every stage's version, so the checkout is never touched.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from infra.versioning import LOCK_FILES, PROJECT_PACKAGES, code_version, import_closure

REPO = Path(__file__).resolve().parents[2]


def _stage_modules(root: Path) -> dict[str, str]:
    """``{stage: task module}`` for every ``stage_cache("stage", __name__)`` call under ``root/tasks``."""
    stages = {}
    for path in sorted((root / "tasks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "stage_cache":
                stage = node.args[0]
                assert isinstance(stage, ast.Constant), f"{path.name}: stage name must be a literal"
                stages[stage.value] = f"tasks.{path.stem}"
    return stages


def _copy_project(dest: Path) -> Path:
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", *LOCK_FILES):  # the lock: pins of the stages' libraries
        shutil.copy2(REPO / name, dest / name)
    return dest


def _versions(root: Path) -> dict[str, str]:
    return {stage: code_version(stage, root, module) for stage, module in _stage_modules(root).items()}


def _rel(root: Path, module: str) -> set[str]:
    return {path.relative_to(root).as_posix() for path in import_closure(root, module)}


def test_every_stage_cache_is_derived_from_its_own_module() -> None:
    # No hand-written module lists: each task passes its own module and the imports decide.
    calls = 0
    for path in sorted((REPO / "tasks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "stage_cache":
                calls += 1
                assert len(node.args) == 2 and not node.keywords, f"{path.name}: stage_cache(stage, __name__)"
                assert isinstance(node.args[1], ast.Name) and node.args[1].id == "__name__", path.name
    assert set(_stage_modules(REPO)) == {"curate", "bootstrap", "rollout", "score", "batch", "train", "evaluate"}
    assert calls == 7


def test_closures_hold_the_modules_the_hand_written_lists_missed() -> None:
    assert "dapo_core/answer_extraction.py" in _rel(REPO, "tasks.score")  # decides `correct`
    assert "dapo_core/answer_extraction.py" in _rel(REPO, "tasks.evaluate")
    train = _rel(REPO, "tasks.train")
    assert {"dapo_core/logprobs.py", "dapo_core/advantages.py", "dapo_core/losses.py"} <= train
    # started as processes, not only imported: torchrun -m engines.train.worker, the elastic rank body
    assert {"engines/train/worker.py", "engines/train/rank.py", "engines/train/server.py"} <= train
    # importing a submodule runs its package's __init__ first
    assert {"tasks/__init__.py", "dapo_core/__init__.py", "schemas/__init__.py"} <= train


def test_editing_an_indirect_import_changes_exactly_the_stages_that_import_it(tmp_path: Path) -> None:
    root = _copy_project(tmp_path)
    target = "dapo_core/answer_extraction.py"
    importers = {stage for stage, module in _stage_modules(root).items() if target in _rel(root, module)}
    assert {"score", "evaluate"} <= importers
    before = _versions(root)
    assert before == _versions(REPO), "a copy of the same code must give the same versions"

    with (root / target).open("a") as f:
        f.write("# an edit that could change who counts as correct\n")
    after = _versions(root)

    changed = {stage for stage in before if before[stage] != after[stage]}
    assert changed == importers
    assert set(before) - importers, "some stage must not import the edited file, or the test proves little"


def test_editing_a_file_no_stage_imports_changes_no_version(tmp_path: Path) -> None:
    root = _copy_project(tmp_path)
    imported = set().union(*(_rel(root, module) for module in _stage_modules(root).values()))
    target = "reports/ablation.py"
    assert target not in imported
    before = _versions(root)

    with (root / target).open("a") as f:
        f.write("# a report-only edit\n")
    (root / "dapo_core" / "scratch.py").write_text('"""A new module nobody imports."""\n')
    assert _versions(root) == before


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_closure_follows_every_import_form(tmp_path: Path) -> None:
    _write(tmp_path, {
        "tasks/__init__.py": "",
        "tasks/stage.py": (
            "import os\n"
            "import numpy as np\n"  # third party: not followed
            "from . import helper\n"  # relative, a module
            "from .sub import deep\n"  # relative from a subpackage
            "from dapo_core import maths\n"  # `from pkg import module`
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from dapo_core import typing_only\n"  # never executed: not part of the version
            "def run():\n"
            "    import schemas.models\n"  # function-level
            "    cmd = ['python', '-m', 'tasks.worker', 'spec.json']\n"  # a spawned worker module
            "    code = ['python', '-c', 'from tasks.inline import main; main()']\n"
            "    import importlib\n"
            "    return importlib.import_module('tasks.plugin')\n"
        ),
        "tasks/helper.py": "from dapo_core.maths import add\n",
        "tasks/sub/__init__.py": "",
        "tasks/sub/deep.py": "from ..helper import *\nfrom dapo_core.answers import parse\n",
        "tasks/worker.py": "import workflows.util\n",
        "tasks/inline.py": "",
        "tasks/plugin.py": "",
        "tasks/unused.py": "",
        "dapo_core/__init__.py": "",
        "dapo_core/maths.py": "",
        "dapo_core/answers.py": "",
        "dapo_core/typing_only.py": "",
        "schemas/__init__.py": "",
        "schemas/models.py": "",
        "workflows/__init__.py": "",
        "workflows/util.py": "",
    })
    assert _rel(tmp_path, "tasks.stage") == {
        "tasks/__init__.py", "tasks/stage.py", "tasks/helper.py", "tasks/sub/__init__.py", "tasks/sub/deep.py",
        "tasks/worker.py", "tasks/inline.py", "tasks/plugin.py",
        "dapo_core/__init__.py", "dapo_core/maths.py", "dapo_core/answers.py",
        "schemas/__init__.py", "schemas/models.py", "workflows/__init__.py", "workflows/util.py",
    }


def test_version_depends_on_stage_salt_and_content_not_location(tmp_path: Path) -> None:
    files = {"tasks/__init__.py": "", "tasks/a.py": "from tasks import b\n", "tasks/b.py": "X = 1\n"}
    _write(tmp_path / "one", files)
    _write(tmp_path / "two", files)
    one = code_version("a", tmp_path / "one", "tasks.a")
    assert one == code_version("a", tmp_path / "two", "tasks.a")
    assert one.startswith("a-") and one != code_version("other", tmp_path / "one", "tasks.a")
    (tmp_path / "two" / "tasks" / "b.py").write_text("X = 2\n")
    assert code_version("a", tmp_path / "two", "tasks.a") != one


def test_an_unknown_module_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tasks.missing"):
        import_closure(tmp_path, "tasks.missing")
