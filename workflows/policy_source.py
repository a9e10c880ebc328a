"""Which checkpoint a user means, and the run it came from: for ``dapo serve`` and ``dapo ask``.

A user names either a checkpoint folder (``runs/tiny-cpu/checkpoints/step-0020``, a path or an
object-store URI) or a whole run folder, which means its final checkpoint (the highest
``checkpoints/step-NNNN`` that is complete). The checkpoint is fetched the way rollout fetches
one (``storage.checkpoints.fetch_policy``: the path itself, or a local mirror of a URI without the
optimizer state). When it lies in a run folder, that run's ``run.json`` supplies the config the
policy was trained with: the prompt template it saw (``curate.prompt_template``), its engine
settings (``rollout``) and the evaluation's sampling (``evaluate``).

A checkpoint is served under its id only when its weights are the ones the id names
(:func:`check_weights`): before, weights copied over another checkpoint's were served under the
other checkpoint's id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from storage import checkpoints, digests, pruning, run_store
from storage.run_layout import RunLayout
from workflows.config import RunConfig, config_from_dict

RUN_RECORD = "run.json"
# The weights digest a checkpoint id ends with (storage/checkpoints.py: make_checkpoint_id).
_ID_DIGEST = re.compile(r"-[0-9a-f]{16}$")


class WeightsMismatchError(checkpoints.CheckpointError):
    """A checkpoint's weight files are not the ones its id and digest record name."""


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


def recorded_weights(checkpoint: str) -> dict[str, dict[str, object]]:
    """``{weight file path or URI: {"bytes", "sha256"}}`` from the checkpoint's digest record
    (storage/digests.py); empty when it has none (a checkpoint outside a run folder)."""
    record = digests.record_path(checkpoint)
    if not run_store.exists(record):
        return {}
    files = json.loads(run_store.read_text(record))["files"]
    parent = _parent(checkpoint)
    return {run_store.join(parent, key): want for key, want in files.items() if pruning.part_of(key) == "weights"}


def _mismatch(checkpoint: str, checkpoint_id: str, what: str) -> WeightsMismatchError:
    return WeightsMismatchError(f"{what}: checkpoint {checkpoint} does not hold the weights its id {checkpoint_id} "
                                "names (copied over from another checkpoint, or damaged)")


def check_weight_sizes(checkpoint: str, checkpoint_id: str) -> None:
    """Raise :class:`WeightsMismatchError` when a weight file of the digest record is missing or of
    another size: for an object-store checkpoint, before its weights are downloaded."""
    for target, want in recorded_weights(checkpoint).items():
        if not run_store.exists(target):
            raise _mismatch(checkpoint, checkpoint_id, f"{target}: missing")
        if (size := run_store.size(target)) != want["bytes"]:
            raise _mismatch(checkpoint, checkpoint_id, f"{target}: {size} bytes, {want['bytes']} recorded")


def check_weights(checkpoint: str, local: Path, checkpoint_id: str) -> None:
    """Raise :class:`WeightsMismatchError` unless the weight files of ``local`` (the copy of
    ``checkpoint`` that will be served) are those its digest record and its id name: each file's
    sha256 the record's, their digest the one the id ends with (``make_checkpoint_id``).

    The files are read once (``checkpoints.weights_digest`` remembers each file's sha256 for the
    record's comparison: ``digests.known_file_sha256``). A checkpoint outside a run folder has no
    record and is checked against its id; one with neither a record nor an id of that form (a
    hand-made ``dapo_checkpoint.json``) has nothing to be checked against and is served as it is.
    The cost is one read of the weights: 3 MB for the main job's policy, ~15 s for a 7B policy's
    15 GB at ~1 GB/s, before a server that takes longer than that to start.
    """
    recorded = recorded_weights(checkpoint)
    named_by_id = _ID_DIGEST.search(checkpoint_id) is not None
    if not recorded and not named_by_id:
        return
    actual = checkpoints.weights_digest(local)  # reads every weight file
    for target, want in recorded.items():
        copy = local / target.rsplit("/", 1)[-1]
        if want.get("sha256") and digests.known_file_sha256(copy) != want["sha256"]:
            raise _mismatch(checkpoint, checkpoint_id,
                            f"{target}: sha256 differs from the recorded {str(want['sha256'])[:16]}...")
    if named_by_id and not checkpoint_id.endswith(f"-{actual}"):
        raise _mismatch(checkpoint, checkpoint_id, f"{checkpoint}: its weights digest to {actual}")


def resolve_policy(target: str) -> PolicySource:
    """Locate ``target``'s checkpoint (``locate_checkpoint``), fetch it, check its weights are the ones
    its id names (:func:`check_weights`), read its identity and run.

    Raises ``storage.pruning.PrunedWeightsError`` (a ``FileNotFoundError``) when the retention
    policy deleted its weights, :class:`WeightsMismatchError` (a ``CheckpointError``) when they are
    not its own."""
    source = locate_checkpoint(target)
    pruning.require_weights(source)  # before a server or an engine starts on a folder without weights
    info = checkpoints.read_info(source)
    check_weight_sizes(source, info.checkpoint_id)  # before an object store's weights are downloaded
    local = checkpoints.fetch_policy(source)
    check_weights(source, local, info.checkpoint_id)
    run_dir = run_folder_of(source)
    return PolicySource(source=source, local_dir=local, checkpoint_id=info.checkpoint_id, step=info.step,
                        run_dir=run_dir, run_config=run_config(run_dir) if run_dir else None)
