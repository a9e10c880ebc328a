"""benchmarks/scratch.py: a benchmark's temporary run folder goes when it ends, even on failure,
and a folder the user named stays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from scratch import scratch_dir  # noqa: E402


def test_a_temporary_folder_is_removed_even_when_the_benchmark_fails(tmp_path: Path) -> None:
    seen: list[Path] = []
    with pytest.raises(RuntimeError), scratch_dir(None, "bench-test-") as work:
        seen.append(work)
        (work / "run" / "checkpoints").mkdir(parents=True)
        (work / "run" / "checkpoints" / "model.safetensors").write_bytes(b"x" * 1024)
        raise RuntimeError("the run failed")
    assert seen and not seen[0].exists()


def test_a_named_folder_is_created_and_kept(tmp_path: Path) -> None:
    keep = tmp_path / "kept" / "runs"
    with scratch_dir(str(keep), "bench-test-") as work:
        assert work == keep and keep.is_dir()
        (work / "summary.json").write_text("{}")
    assert (keep / "summary.json").is_file()
