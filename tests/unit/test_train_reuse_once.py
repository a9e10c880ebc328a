"""The reuse decision of a train step (engines/train/publish.py: reusable_step) is made once a step.

On the object-store path engines/train/launch.py: train_step_in_store decides it on the store's
names (before the parent is fetched), then trains through train_steps; train_steps must not decide
it again on the mirror's freshly cleared output folder (a second pass that can never reuse: it only
re-reads the parent's record and re-checks its pruned record). Counted with a wrapper; the launch is
stopped right after the checks, so no worker starts. The store is fsspec's in-memory one.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from engines.train import launch
from settings.train import TrainConfig
from storage import checkpoints, outputs, run_store


class _StopBeforeLaunch(Exception):
    """Raised where the batch would be checked: everything before it has run."""


def _parent(uri: str) -> str:
    """A step-0 policy published into the store with its digest record (as outputs.output does)."""
    with outputs.output(uri, folder=True) as local:
        staging = checkpoints.staging_dir(local)
        (staging / "model.safetensors").write_bytes(b"\0" * 64)
        (staging / "config.json").write_text("{}")
        checkpoints.publish(staging, local, checkpoints.CheckpointInfo("bootstrap-0000-a", 0, None, "bootstrap"))
    return uri


@pytest.mark.parametrize("where", ["store", "path"])
def test_the_reuse_check_runs_once_a_step(where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    root = f"memory://dapo-test/reuse-once-{uuid.uuid4().hex[:8]}" if where == "store" else str(tmp_path / "run")
    batch = tmp_path / "batch.parquet"
    batch.write_bytes(b"the step's batch")
    if where == "store":
        run_store.upload_file(batch, f"{root}/batch.parquet")
    else:
        Path(root).mkdir()
        batch = batch.rename(Path(root) / "batch.parquet")
    parent = _parent(f"{root}/checkpoints/step-0000")
    calls: list[str] = []
    real = launch.reusable_step

    def counted(out_dir, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(str(out_dir))
        return real(out_dir, **kwargs)

    def stop(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise _StopBeforeLaunch

    monkeypatch.setattr(launch, "reusable_step", counted)
    monkeypatch.setattr(launch, "_check_batches", stop)
    with pytest.raises(_StopBeforeLaunch):
        launch.train_step_in_store(parent, [f"{root}/batch.parquet"], f"{root}/checkpoints/step-0001", step=1,
                                   config=TrainConfig())
    assert calls == [f"{root}/checkpoints/step-0001"]  # once, on the name in the run store
