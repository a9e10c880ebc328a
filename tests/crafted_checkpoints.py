"""Checkpoint folders crafted to attack the pipeline: DeepSpeed state whose pickles run code when loaded.

``add_malicious_state`` writes a ``ds_state/`` laid out as the training stage writes one (its
``dapo_ds_meta.json``, DeepSpeed's ``latest`` and a tag folder of ``.pt`` files), but every ``.pt``
is a pickle whose ``__reduce__`` creates ``marker`` when it is unpickled with ``weights_only=False``
(as DeepSpeed's ``load_checkpoint`` does). A test asserts the marker never appears.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from storage import checkpoints

TAG = "step000001"


class MarkerPayload:
    """Unpickled by a full pickle load, this object opens (creates) the file ``marker``: any code could run there."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def add_malicious_state(folder: Path, marker: Path, *, updates_done: int = 2, step: int = 1) -> Path:
    """Add a ``ds_state/`` of code-running pickles to ``folder``; returns it."""
    state = folder / checkpoints.OPTIMIZER_STATE_DIR
    (state / TAG).mkdir(parents=True, exist_ok=True)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        torch.save({"module": MarkerPayload(marker)}, state / TAG / name)
    (state / "latest").write_text(TAG)
    meta = {"tag": TAG, "world_size": 1, "zero_stage": 1, "precision": "fp32", "updates_done": updates_done,
            "step": step}
    (state / "dapo_ds_meta.json").write_text(json.dumps(meta))
    return state


def as_train_checkpoint(folder: Path, *, step: int = 1, optimizer_updates: int | None = None) -> Path:
    """Rewrite ``folder``'s ``dapo_checkpoint.json`` to claim a training step published it."""
    info = checkpoints.read_info(folder)
    fields = {**info.__dict__, "step": step, "produced_by": "train", "parent_checkpoint_id": info.checkpoint_id}
    if optimizer_updates is not None:
        fields["optimizer_updates"] = optimizer_updates
    else:
        fields.pop("optimizer_updates", None)  # as a checkpoint written before the count was recorded
    (folder / checkpoints.METADATA_FILE).write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")
    return folder
