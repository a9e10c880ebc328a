"""storage/checkpoints.publish: everything in the staging folder is on disk before the rename."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage import checkpoints


def _staging(tmp_path: Path) -> tuple[Path, set[str]]:
    staging = checkpoints.staging_dir(tmp_path / "checkpoints" / "step-0003")
    files = {"model.safetensors": 3_000_000, "config.json": 100, "ds_state/latest": 10,
             "ds_state/step000003/optim_states.pt": 9_000_000, "ds_state/step000003/model_states.pt": 3_000_000}
    for name, size in files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(os.urandom(size))
    return staging, set(files) | {checkpoints.METADATA_FILE}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fd through /proc (Linux)")
def test_every_file_and_folder_is_fsynced_before_the_checkpoint_is_renamed_into_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staging, names = _staging(tmp_path)
    final = tmp_path / "checkpoints" / "step-0003"
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        synced.append("<rename>")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoints.os, "fsync", fsync)
    monkeypatch.setattr(checkpoints.os, "replace", replace)
    info = checkpoints.CheckpointInfo("train-0003-abc", 3, "train-0002-def", "train")
    assert checkpoints.publish(staging, final, info) == final
    before = synced[:synced.index("<rename>")]
    assert {str(staging / name) for name in names} <= set(before)
    # The folders' entries too (a new file's name is on disk only once its folder is synced).
    assert {str(staging), str(staging / "ds_state"), str(staging / "ds_state" / "step000003")} <= set(before)
    # After the rename, the parent folder that now names the checkpoint.
    assert str(final.parent) in synced[synced.index("<rename>") + 1:]
    assert checkpoints.read_info(final).checkpoint_id == "train-0003-abc"


def test_the_record_after_a_publish_does_not_read_the_large_files_again(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The publish hashes the files of a MiB or more while their fsyncs wait for the device; the
    digest record written next (as storage.outputs.output does after a train task) reuses those sha256s
    and records exactly what hashing the published files gives."""
    import builtins
    import hashlib
    import io
    from typing import Any

    from storage import digests

    staging, _ = _staging(tmp_path)
    final = tmp_path / "checkpoints" / "step-0003"
    info = checkpoints.CheckpointInfo(checkpoint_id=checkpoints.make_checkpoint_id("train", 3, staging), step=3,
                                      parent_checkpoint_id="train-0002-x", produced_by="train")
    checkpoints.publish(staging, final, info)
    reads: list[str] = []
    real_open = io.open

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode and "b" in mode:
            reads.append(Path(file).name)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    entry = digests.record(str(final))
    monkeypatch.undo()

    assert entry is not None
    for name in ("model.safetensors", "ds_state/step000003/optim_states.pt", "ds_state/step000003/model_states.pt"):
        assert entry["files"][f"step-0003/{name}"]["sha256"] == hashlib.sha256((final / name).read_bytes()).hexdigest()
    assert not {"model.safetensors", "optim_states.pt", "model_states.pt"} & set(reads), reads


def test_the_process_that_published_a_checkpoint_vouches_for_its_optimizer_state_without_reading_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next step checks the parent's ds_state/ against its digest record before resuming it
    (engines/train/checkpoint.py: resumes_optimizer_state): in the process that published and recorded
    it the files' sha256s are known (same inode, size, mtime), so the check reads none of them again;
    another process hashes them. The update count travels in the metadata, absent = None (older ones)."""
    import builtins
    import io
    import json
    from dataclasses import asdict
    from typing import Any

    from storage import digests

    staging, _ = _staging(tmp_path)
    final = tmp_path / "checkpoints" / "step-0003"
    info = checkpoints.CheckpointInfo(checkpoint_id=checkpoints.make_checkpoint_id("train", 3, staging), step=3,
                                      parent_checkpoint_id="train-0002-x", produced_by="train", optimizer_updates=24)
    checkpoints.publish(staging, final, info)
    digests.record(str(final))
    reads: list[str] = []
    real_open = io.open

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode and "b" in mode:
            reads.append(Path(file).name)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    assert checkpoints.unvouched_optimizer_state(final) == []
    monkeypatch.undo()
    assert not {"optim_states.pt", "model_states.pt"} & set(reads), reads
    assert checkpoints.read_info(final).optimizer_updates == 24
    older = {k: v for k, v in asdict(info).items() if k != "optimizer_updates"}
    (final / checkpoints.METADATA_FILE).write_text(json.dumps(older))
    assert checkpoints.read_info(final).optimizer_updates is None
