"""A full disk is reported as "no space left on device" naming the path, and leaves nothing half-written.

The real failures come from a real full file system: ``/dev/full`` (ENOSPC on every write, no
privileges needed) and, where the tests run as root, a 256 KiB tmpfs that the writers fill
(torch's serializer and safetensors then fail without any errno, which is the case users met).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from schemas import Problem
from schemas.disk_space import DiskFullError, writing
from cli.main import disk_full_line, main


def test_enospc_from_the_kernel_names_the_path() -> None:
    with pytest.raises(DiskFullError) as caught:
        with writing("/dev/full", "a test file"), open("/dev/full", "wb") as handle:
            handle.write(b"x" * 4096)
            handle.flush()
    text = str(caught.value)
    assert text.startswith("no space left on device writing a test file to /dev/full")
    assert "re-run the same command to resume" in text


def test_other_errors_pass_through_unchanged(tmp_path: Path) -> None:
    err = PermissionError("not mine")
    with pytest.raises(PermissionError) as caught:
        with writing(tmp_path, "x"):
            raise err
    assert caught.value is err and str(caught.value) == "not mine"  # not re-worded, not wrapped


def test_the_cli_finds_the_line_inside_a_wrapped_error() -> None:
    # Flyte re-raises a task's failure as its own error type with the original text inside.
    inner = DiskFullError(28, "no space left on device writing the checkpoint's weights to /runs/x (0 bytes free there)")
    wrapped = RuntimeError("Task failed:\nTraceback ...\nDiskFullError: " + str(inner))
    assert disk_full_line(wrapped) == str(inner)
    assert disk_full_line(RuntimeError("some other failure")) is None


@contextlib.contextmanager
def small_disk(size: str = "256k") -> Iterator[Path]:
    """A tmpfs of ``size`` (root only); skips the test where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    point = Path("/tmp") / f"dapo-full-{uuid.uuid4().hex[:8]}"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
    if done.returncode != 0:
        point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)
        point.rmdir()


def test_torch_serializer_on_a_full_disk_says_no_space() -> None:
    with small_disk() as disk:
        target = disk / "weights.pt"
        with pytest.raises(DiskFullError, match=f"no space left on device writing weights to {target}"):
            with writing(target, "weights"):
                torch.save(torch.zeros(1 << 20), target)  # 4 MiB into 256 KiB


def test_curate_on_a_full_disk_one_line_and_no_partial_shards(capsys: pytest.CaptureFixture[str]) -> None:
    with small_disk() as disk:
        out = disk / "curated"
        code = main(["curate", "synthetic:n=20000,seed=0", "--template", "tiny", "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 1
        assert err.startswith("dapo curate: no space left on device writing ")
        assert str(disk) in err and len(err.splitlines()) == 1
        leftovers = [p for p in disk.rglob("*") if p.is_file()]
        assert not [p for p in leftovers if p.name.endswith(".tmp")], leftovers


def test_shard_writer_keeps_the_old_file_when_the_disk_fills() -> None:
    from schemas import write_shard

    with small_disk("64k") as disk:
        path = disk / "problems.parquet"
        rows = [{"problem_id": f"{i:016x}", "source": "t", "source_row": i, "problem": "1+1", "answer": 2,
                 "original_answer": "2", "prompt": "1+1=", "split": "train", "answer_rule": "integer"} for i in range(3)]
        write_shard(pa.Table.from_pylist(rows), path, Problem)
        before = path.read_bytes()
        filler = disk / "filler"
        with contextlib.suppress(OSError):
            filler.write_bytes(os.urandom(1 << 20))
        big = [{**rows[0], "problem_id": f"{i + 100:016x}", "problem": os.urandom(200).hex()} for i in range(2000)]
        with pytest.raises(DiskFullError, match=f"writing Problem shard to {path}"):
            write_shard(pa.Table.from_pylist(big), path, Problem)
        assert path.read_bytes() == before  # the published shard is untouched
        assert not list(disk.glob(".*.tmp"))
