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
