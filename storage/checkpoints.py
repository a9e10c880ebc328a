"""Policy checkpoints in the run store: HF folders published atomically, with lineage metadata.

A checkpoint is an HF model folder (config, safetensors weights, tokenizer files) plus
``dapo_checkpoint.json``, which names the checkpoint, its step, its parent and the data that
produced it. Writers build the folder under a hidden staging name beside the final one and
rename it into place only when complete, so a crash never leaves a folder that looks finished:
a folder without ``dapo_checkpoint.json`` is never treated as a checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from schemas.disk_space import writing
from schemas.fsync import fsync_file, fsync_folder
from storage import digests, run_store
from storage.retention_policy import MIRRORED_CHECKPOINTS

METADATA_FILE = "dapo_checkpoint.json"
# The DeepSpeed state (optimizer moments, fp32 master weights) inside a checkpoint folder: only a
# training step resuming from the checkpoint reads it (engines/train/spec.py: DS_STATE_DIR).
OPTIMIZER_STATE_DIR = "ds_state"
WEIGHT_SUFFIXES = (".safetensors",)
# The files a checkpoint's tokenizer is read from (fast and slow tokenizers, and the chat template
# transformers 5 keeps apart); a checkpoint has some of them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")
MODEL_CONFIG_FILES = ("config.json", "generation_config.json")
_FSYNC_THREADS = 8  # files fsynced at once when a checkpoint is published


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``dapo_checkpoint.json`` records about one checkpoint."""

    checkpoint_id: str  # unique name: "<kind>-<step>-<weights digest>"
    step: int  # the training step that produced it (0 = the bootstrapped/initial policy)
    parent_checkpoint_id: str | None  # the checkpoint it was trained from (None for step 0)
    produced_by: str  # the stage that wrote it: "bootstrap", "import" or "train"
    inputs: dict[str, Any] = field(default_factory=dict)  # data/config that produced it (lineage)
    # Optimizer updates done when a train step wrote it: where the LR schedule stands, so the next
    # step continues it even when it starts a fresh optimizer. None: a step-0 policy (no update), or a
    # checkpoint written before this was recorded (engines/train/launch.py: schedule_start).
    optimizer_updates: int | None = None


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing, incomplete or inconsistent."""


def weights_digest(folder: str | Path) -> str:
    """sha256 over the folder's weight files (names and bytes), 16 hex chars."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise CheckpointError(f"{folder}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to digest")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digests.file_sha256(path, feed=digest)  # the same read gives the file's own sha256 for its record
    return digest.hexdigest()[:16]


def is_model_file(name: str) -> bool:
    """Whether a file of an HF model folder is part of the model an import takes: weights
    (safetensors and their shard index), config and tokenizer files. Nothing else (pickled
    ``.bin`` weights, ``ds_state/``, code) is ever copied in from a folder of unknown origin."""
    return (name.endswith(WEIGHT_SUFFIXES) or name.endswith(".safetensors.index.json")
            or name in MODEL_CONFIG_FILES or name in TOKENIZER_FILES)


def make_checkpoint_id(produced_by: str, step: int, folder: str | Path) -> str:
    """``"train-0003-<digest>"``: readable, and unique because it includes the weights' digest."""
    return f"{produced_by}-{step:04d}-{weights_digest(folder)}"


def step_of_id(checkpoint_id: str) -> int:
    """The step an id of :func:`make_checkpoint_id` names."""
    return int(checkpoint_id.split("-")[1])


def is_complete(folder: str | Path) -> bool:
    """True when ``folder`` (a path, or an object-store URI) is a published checkpoint: its
    metadata file exists (uploaded last: storage/run_store.py)."""
    if run_store.is_remote(folder):
        return run_store.exists(run_store.join(folder, METADATA_FILE))
    return (Path(folder) / METADATA_FILE).is_file()


def read_info(folder: str | Path) -> CheckpointInfo:
    """Load ``dapo_checkpoint.json`` of a folder (a path, or an object-store URI: the metadata
    alone is read); a clear error when the folder is not a complete checkpoint."""
    if not is_complete(folder):
        raise CheckpointError(f"{folder}: not a complete checkpoint (no {METADATA_FILE})")
    path = run_store.join(folder, METADATA_FILE)
    try:
        return CheckpointInfo(**json.loads(run_store.read_text(path)))
    except (json.JSONDecodeError, TypeError) as err:
        raise CheckpointError(f"{path}: unreadable checkpoint metadata: {err}") from err


def unvouched_optimizer_state(folder: str | Path) -> list[str]:
    """Why the DeepSpeed state in the checkpoint ``folder`` (a path or a URI) is not what its digest
    record vouches for, one line per problem; empty when it is.

    The record (storage/digests.py) is written by the pipeline when it publishes the checkpoint:
    every ``ds_state/`` file there must be recorded, and every recorded one there with its size and
    (for a path) its sha256. A file this process hashed and that is unchanged since (same inode,
    size, modification time) is not read again. On an object store sizes are compared, as the
    driver's checks do (the stores checksum objects themselves).
    """
    folder = str(folder).rstrip("/")
    rec = digests.record_path(folder)
    if not run_store.exists(rec):
        return [f"{folder}: no digest record ({rec}) vouches for its {OPTIMIZER_STATE_DIR}/"]
    try:
        recorded: dict[str, dict[str, Any]] = json.loads(run_store.read_text(rec))["files"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{rec}: unreadable digest record: {err}"]
    name = folder.rpartition("/")[2] if run_store.is_remote(folder) else run_store.local_path(folder).name
    prefix = f"{name}/{OPTIMIZER_STATE_DIR}/"
    there = {f"{prefix}{rel}": path for rel, path in _optimizer_state_files(folder).items()}
    wanted = {key: want for key, want in recorded.items() if key.startswith(prefix)}
    problems = [f"{path}: not in the digest record {rec}" for key, path in sorted(there.items()) if key not in wanted]
    for key, want in sorted(wanted.items()):
        path = there.get(key)
        size = run_store.size(path) if path is not None else None
        if path is None:
            problems.append(f"{run_store.join(folder, key[len(name) + 1:])}: missing")
        elif size != want["bytes"]:
            problems.append(f"{path}: {size} bytes, {want['bytes']} recorded in {rec}")
        elif not run_store.is_remote(path) and digests.known_file_sha256(path) != want.get("sha256"):
            problems.append(f"{path}: sha256 differs from the one recorded in {rec}")
    return problems


def _optimizer_state_files(folder: str) -> dict[str, str]:
    """``{relative path: path or URI}`` of the files under the checkpoint's ``ds_state/``."""
    state = run_store.join(folder, OPTIMIZER_STATE_DIR)
    if run_store.is_remote(folder):
        return {uri[len(state) + 1:]: uri for uri in run_store.folder_files(state)}
    local = run_store.local_path(state)
    return {p.relative_to(local).as_posix(): str(p) for p in sorted(local.rglob("*")) if p.is_file()}


def fetch_policy(folder: str | Path, *, weights: bool = True) -> Path:
    """A local copy of the checkpoint at ``folder`` for generating from it: weights, config,
    tokenizer files and metadata, without the optimizer state (``run_store.fetch``; a path is
    returned as it is). What rollout and evaluation nodes read: 65 GB of a Qwen2.5-32B
    checkpoint's 459 GB (docs/CLUSTER.md, "The cost of the hand-off"). Older copies of the run's
    checkpoints leave this node's mirror, all but the :data:`MIRRORED_CHECKPOINTS` latest.

    ``weights=False``: without the weight files too, for a reader that gets them another way (a task
    body whose engines are actors elsewhere; an engine handed them in memory: engines/rollout/host_weights.py);
    a later fetch that needs them adds just them."""
    skip = (f"{OPTIMIZER_STATE_DIR}/*",) if weights else (f"{OPTIMIZER_STATE_DIR}/*", *(f"*{s}" for s in WEIGHT_SUFFIXES))
    local = run_store.fetch(folder, skip=skip)
    run_store.evict_mirrored(folder, keep=MIRRORED_CHECKPOINTS)
    return local


def export_tensors(folder: str | Path) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of every tensor of the checkpoint's weight files (safetensors), in file and key
    order: what an engine's reload reads, from the folder or handed over in memory (engines/train/ray_host.py)."""
    from safetensors.torch import safe_open

    files = sorted(Path(folder).glob(f"*{WEIGHT_SUFFIXES[0]}"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weight files to reload")
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def staging_dir(final_dir: str | Path) -> Path:
    """A fresh hidden folder beside ``final_dir`` to build a checkpoint in (same filesystem)."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    path = final_dir.parent / f".{final_dir.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


_STAGING_NAME = re.compile(r"^\.(?P<name>.+)\.staging-\d+-[0-9a-f]{8}$")


def published_dir_of(staging: str | Path) -> Path:
    """The folder a :func:`staging_dir` is published as (ValueError for a folder not named as one)."""
    staging = Path(staging)
    match = _STAGING_NAME.match(staging.name)
    if match is None:
        raise ValueError(f"{staging}: not a checkpoint's staging folder")
    return staging.parent / match["name"]


def _fsync_tree(folder: Path) -> None:
    """Put ``folder``'s files, then its folders' entries, on disk; hash the files meanwhile.

    The files were written by other processes (the training workers) moments before, so most of
    their bytes are still dirty in the page cache: fsyncing them one after another waits for each
    write-back in turn (~40 ms a step for the tiny policy's 16 MB on 2 cores); several at once let
    the device overlap them (~15 ms). ``os.fsync`` releases the GIL, and so does hashing: while the
    fsyncs wait for the device, the files are hashed from the page cache for the checkpoint's
    digest record, written right after the publish (storage/digests.py remembers a
    file's sha256 by its identity, which the rename keeps): ~8 ms a step less for the tiny policy.
    """
    paths = sorted(folder.rglob("*"))
    files = sorted((p for p in paths if p.is_file() and not p.is_symlink()), key=lambda p: -p.stat().st_size)
    if files:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(_FSYNC_THREADS, len(files)) + 1) as pool:
            hashed = pool.submit(digests.file_sha256s, files)
            list(pool.map(fsync_file, files))  # re-raises the first error
            hashed.result()
    for path in sorted((p for p in paths if p.is_dir() and not p.is_symlink()), reverse=True) + [folder]:
        fsync_folder(path)


def _make_readable(folder: Path) -> None:
    """Published checkpoints are shared read-only data: folders 0755, files 0644.

    The staging folder comes from ``mkdtemp`` (0700) and some writers create 0600 files
    (safetensors), which would keep other users and serving containers out.
    """
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def publish(staging: str | Path, final_dir: str | Path, info: CheckpointInfo) -> Path:
    """Write the metadata into ``staging`` and rename it to ``final_dir`` atomically.

    If ``final_dir`` already holds a complete checkpoint with the same id (a re-run that
    finished before), the staging copy is discarded and the existing one kept; a different id
    is an error (two runs must never silently overwrite each other). An incomplete leftover at
    ``final_dir`` (not possible through this function, but left by hand) is replaced.
    """
    staging, final_dir = Path(staging), Path(final_dir)
    with writing(final_dir, "the checkpoint"):
        (staging / METADATA_FILE).write_text(json.dumps(asdict(info), indent=2, sort_keys=True) + "\n")
        _make_readable(staging)
        _fsync_tree(staging)
    if final_dir.exists():
        if is_complete(final_dir):
            existing = read_info(final_dir)
            shutil.rmtree(staging)
            if existing.checkpoint_id != info.checkpoint_id:
                raise CheckpointError(
                    f"{final_dir}: already holds checkpoint {existing.checkpoint_id}, refusing to "
                    f"replace it with {info.checkpoint_id}"
                )
            return final_dir
        shutil.rmtree(final_dir)
    os.replace(staging, final_dir)
    fsync_folder(final_dir.parent)  # the rename itself
    return final_dir


def clean_stale_staging(parent: str | Path) -> list[Path]:
    """Remove staging folders left by crashed writers under ``parent``; returns what it removed."""
    parent = Path(parent)
    removed = []
    if parent.is_dir():
        for path in parent.glob(".*.staging-*"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
