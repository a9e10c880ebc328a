"""A resume's check of cached outputs costs a ``stat`` a file, not a re-hash of every checkpoint.

The driver checks what every cache-hit call points to (workflows/verified_calls.py) before the run
goes on. It hashes a local file only when it was modified since its digest record was written
(storage/digests.py: modified_since_record); presence and size are checked for all. A same-size
damage (four flipped bytes) written after the record is still found and made again; one that hides
its write (the modification time put back) is left to the deep check, ``dapo verify``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import digests, outputs, run_store
from workflows.verified_calls import call_verified
from cli.verify import verify_run

from .test_digests import _FakeCachedTask, _flip, _publish_checkpoint


def _backdate(folder: Path) -> None:
    """Every file of ``folder`` last modified a second before its digest record was written (as
    files the stage wrote before it recorded them are: the record is written last)."""
    recorded_at = Path(digests.record_path(folder)).stat().st_mtime_ns
    for path in (p for p in folder.rglob("*") if p.is_file()):
        os.utime(path, ns=(recorded_at - 10**9, recorded_at - 10**9))


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    hashed: list[str] = []
    actual = digests._actual_sha256
    monkeypatch.setattr(digests, "_actual_sha256", lambda path: (hashed.append(path), actual(path))[1])
    return hashed


def test_a_cache_hit_of_outputs_unmodified_since_their_record_hashes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = str(tmp_path / "run" / "checkpoints" / "step-0001")
    task = _FakeCachedTask(lambda out: (_publish_checkpoint(out, b"weights" * 1000), out)[1])
    asyncio.run(call_verified(task, [ckpt], ckpt))
    _backdate(Path(ckpt))
    hashed = _hashes(monkeypatch)
    asyncio.run(call_verified(task, [ckpt], ckpt))  # the resume: a cache hit
    assert task.body_runs == 1 and hashed == []


def test_a_same_size_damage_written_after_the_record_is_hashed_found_and_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = str(tmp_path / "run" / "checkpoints" / "step-0001")
    task = _FakeCachedTask(lambda out: (_publish_checkpoint(out, b"weights" * 1000), out)[1])
    asyncio.run(call_verified(task, [ckpt], ckpt))
    _backdate(Path(ckpt))
    weights = run_store.join(ckpt, "model.safetensors")
    _flip(weights, 10)  # same size, written now: after the record
    hashed = _hashes(monkeypatch)
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == 2 and run_store.read_bytes(weights) == b"weights" * 1000
    assert hashed[0] == weights  # only the file modified since its record, of the cache hit's files


def test_a_damage_that_puts_the_modification_time_back_is_left_to_dapo_verify(tmp_path: Path) -> None:
    root = tmp_path / "run"
    run_store.write_text(str(root / "run.json"), "{}")
    ckpt = str(root / "checkpoints" / "step-0001")
    task = _FakeCachedTask(lambda out: (_publish_checkpoint(out, b"weights" * 1000), out)[1])
    asyncio.run(call_verified(task, [ckpt], ckpt))
    _backdate(Path(ckpt))
    weights = Path(ckpt) / "model.safetensors"
    before = weights.stat()
    _flip(str(weights), 10)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # the write hidden
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == 1  # the cheap check cannot see it ...
    problems, _ = verify_run(str(root))
    assert any(str(weights) in p and "sha256 differs" in p for p in problems), problems  # ... the deep one does


class _CountingFs:
    """The run store's filesystem, counting the calls made through it."""

    def __init__(self, fs: object) -> None:
        self.fs, self.calls = fs, 0

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.fs, name)
        if not callable(attr):
            return attr

        def counted(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return attr(*args, **kwargs)
        return counted


def test_a_checkpoint_in_the_object_store_is_checked_from_one_listing(s3_env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Sizes only in a store (no download), and one listing for the folder's files, not two requests
    # a file: a resume's check of a checkpoint is a few requests however many shards it has.
    import uuid

    ckpt = f"s3://dapo-test/resume-check-{uuid.uuid4().hex[:8]}/checkpoints/step-0001"
    with outputs_output(ckpt) as local:
        for i in range(40):
            (local / f"model-{i:05d}-of-00040.safetensors").write_bytes(b"w" * (i + 1))
    counting = _CountingFs(run_store._fs(ckpt))
    monkeypatch.setattr(run_store, "_fs", lambda uri: counting)
    assert digests.check(ckpt) == []
    assert counting.calls <= 4, counting.calls  # record: exists + read; the folder: one listing
    run_store.remove(run_store.join(ckpt, "model-00003-of-00040.safetensors"))
    run_store.write_text(run_store.join(ckpt, "model-00007-of-00040.safetensors"), "w")
    assert digests.check(ckpt) == [f"{ckpt}/model-00003-of-00040.safetensors: missing",
                                   f"{ckpt}/model-00007-of-00040.safetensors: damaged (1 bytes, 8 recorded)"]



@contextlib.contextmanager
def outputs_output(uri: str) -> Iterator[Path]:
    """``outputs.output(uri, folder=True)`` with a checkpoint's marker written last, as a train step does."""
    with outputs.output(uri, folder=True) as local:
        local.mkdir(parents=True, exist_ok=True)
        yield local
        (local / run_store.FOLDER_MARKER).write_text('{"checkpoint_id": "x"}')
