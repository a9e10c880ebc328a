"""Which checkpoint a user means, and the run it came from: for ``dapo serve`` and ``dapo ask``.

A user names either a checkpoint folder (``runs/tiny-cpu/checkpoints/step-0020``, a path or an
object-store URI) or a whole run folder, which means its final checkpoint (the highest
``checkpoints/step-NNNN`` that is complete). The checkpoint is fetched the way rollout fetches
one (``storage.checkpoints.fetch_policy``: the path itself, or a local mirror of a URI without the
optimizer state). When it lies in a run folder, that run's ``run.json`` supplies the config the
policy was trained with: the prompt template it saw (``curate.prompt_template``), its engine
settings (``rollout``) and the evaluation's sampling (``evaluate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from storage import checkpoints, pruning, run_store
from storage.run_layout import RunLayout
from workflows.config import RunConfig, config_from_dict

RUN_RECORD = "run.json"


@dataclass(frozen=True)
class PolicySource:
    """A resolved checkpoint: where it is, its local copy, its identity and its run's config."""

    source: str  # the checkpoint as a path or URI (a run folder's final checkpoint when a run was named)
    local_dir: Path  # a local copy of it (the path itself for a local checkpoint)
    checkpoint_id: str  # from dapo_checkpoint.json: "<stage>-<step>-<weights digest>"
    step: int  # the training step that produced it
    run_dir: str | None  # the run folder holding it, when it lies in one
    run_config: RunConfig | None  # that run's config (run.json), else None


def _parent(path: str) -> str:
    """The folder holding ``path`` (a path or a URI)."""
    if run_store.is_remote(path):
        return path.rstrip("/").rsplit("/", 1)[0]
    return str(Path(path).parent)


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def final_checkpoint(run_dir: str) -> str | None:
    """The run folder's highest complete ``checkpoints/step-NNNN``; None when it has none."""
    found = run_store.glob(RunLayout(run_dir).checkpoints_dir, "step-*")
    complete = [path for path in found if checkpoints.is_complete(path)]
    return max(complete, key=_name) if complete else None


def run_folder_of(checkpoint: str) -> str | None:
    """The run folder of a checkpoint at ``<run>/checkpoints/step-NNNN``; None elsewhere."""
    folder = _parent(checkpoint)
    if _name(folder) != "checkpoints":
        return None
    run_dir = _parent(folder)
    return run_dir if run_store.exists(RunLayout(run_dir).run_record) else None


def run_config(run_dir: str) -> RunConfig:
    """The config a run folder was started with (its ``run.json``), checked like a YAML config."""
    record_path = RunLayout(run_dir).run_record
    record = json.loads(run_store.read_text(record_path))
    return config_from_dict(record["config"], source=record_path)


def locate_checkpoint(target: str) -> str:
    """The checkpoint ``target`` names: itself, or a run folder's final checkpoint (nothing is downloaded).

    Raises ``CheckpointError`` naming ``target`` when it is neither a complete checkpoint nor a
    run folder with one.
    """
    target = target.rstrip("/") if run_store.is_remote(target) else str(target)
    if checkpoints.is_complete(target):
        return target
    if run_store.exists(RunLayout(target).run_record):
        final = final_checkpoint(target)
        if final is None:
            raise checkpoints.CheckpointError(f"{target}: a run folder with no complete checkpoint under checkpoints/")
        return final
    raise checkpoints.CheckpointError(
        f"{target}: not a checkpoint folder (no {checkpoints.METADATA_FILE}) nor a run folder (no {RUN_RECORD})"
    )


def resolve_policy(target: str) -> PolicySource:
    """Locate ``target``'s checkpoint (``locate_checkpoint``), fetch it, read its identity and run.

    Raises ``storage.pruning.PrunedWeightsError`` (a ``FileNotFoundError``) when the retention
    policy deleted its weights."""
    source = locate_checkpoint(target)
    pruning.require_weights(source)  # before a server or an engine starts on a folder without weights
    local = checkpoints.fetch_policy(source)
    info = checkpoints.read_info(local)
    run_dir = run_folder_of(source)
    return PolicySource(source=source, local_dir=local, checkpoint_id=info.checkpoint_id, step=info.step,
                        run_dir=run_dir, run_config=run_config(run_dir) if run_dir else None)
