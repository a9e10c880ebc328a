"""Pruning checkpoints by the retention policy (storage/retention_policy.py), on a path or an object store.

What a checkpoint loses is named by its digest record (storage/digests.py): the weight files
(``*.safetensors`` at the top of the folder) and the DeepSpeed optimizer state (``ds_state/``).
Before anything is deleted, the names, sizes and recorded sha256 go into a *pruned record*
beside the digest record, ``checkpoints/step-0003.pruned.json``; the digest record itself is
never rewritten, so the checkpoint's ``upstream_digest`` (storage/digests.py), and with it the
cache key of every task downstream of it, stays the same. A crash between the two leaves a
record naming files that still exist; the next prune deletes them.

:func:`check` is ``digests.check`` that reads a file named in the pruned record as pruned, not
missing: the driver (workflows/verified_calls.py) checks cached outputs with it, so a re-run of
a pruned run stays all cache hits, and ``dapo verify`` reports pruned checkpoints as pruned.
A pruned file that is back, with another size or sha256, is still reported as damaged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storage import checkpoints, digests, run_store
from storage.digests import PRUNED_SUFFIX, pruned_record_path
from storage.retention_policy import WHOLE, Keep, checkpoint_retention

PARTS = ("weights", "optimizer state")


def pruned_files(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``{"<name>/<relpath>": {"bytes", "sha256", "part"}}`` of what was pruned from ``path`` ({} if nothing)."""
    rec = pruned_record_path(path)
    if not run_store.exists(rec):
        return {}
    files: dict[str, dict[str, Any]] = json.loads(run_store.read_text(rec))["files"]
    return files


def part_of(key: str) -> str | None:
    """``"weights"``, ``"optimizer state"`` or None (kept always) for a digest-record key ``<name>/<relpath>``."""
    rel = key.partition("/")[2]
    if "/" not in rel and rel.endswith(checkpoints.WEIGHT_SUFFIXES):
        return "weights"
    if rel.startswith(checkpoints.OPTIMIZER_STATE_DIR + "/"):
        return "optimizer state"
    return None


def prune_checkpoint(path: str, keep: Keep) -> list[str]:
    """Delete what ``keep`` drops from the published checkpoint ``path``; returns the files deleted now."""
    rec = digests.record_path(path)
    if keep.weights and keep.optimizer_state or not run_store.exists(rec):
        return []  # nothing to drop, or nothing recorded to say what is there
    recorded: dict[str, dict[str, Any]] = json.loads(run_store.read_text(rec))["files"]
    dropped = {"weights": not keep.weights, "optimizer state": not keep.optimizer_state}
    already = pruned_files(path)
    wanted = {key: {**want, "part": part} for key, want in recorded.items()
              if (part := part_of(key)) is not None and dropped[part]}
    parent, _ = digests._parent_and_name(path)  # where the record's names are relative to
    present = [key for key in wanted if run_store.exists(run_store.join(parent, key))]
    if not present and set(wanted) <= set(already):
        return []
    merged = dict(sorted({**already, **wanted}.items()))
    run_store.write_text(pruned_record_path(path),
                         json.dumps({"output": Path(str(path)).name, "files": merged}, indent=1, sort_keys=True) + "\n")
    removed = []
    for key in present:
        target = run_store.join(parent, key)
        run_store.remove(target)
        removed.append(target)
    if not run_store.is_remote(path):
        state = Path(path) / checkpoints.OPTIMIZER_STATE_DIR
        if dropped["optimizer state"] and state.is_dir():
            for folder in sorted((p for p in state.rglob("*") if p.is_dir()), reverse=True):
                if not any(folder.iterdir()):
                    folder.rmdir()
            if not any(state.iterdir()):
                state.rmdir()
    return removed


def apply_retention(checkpoint_paths: Mapping[int, str], *, latest: int, keep_optimizer_last: int,
                    keep_weights_every: int, optimizer_state_every: int = 1, settled: set[int] | None = None
                    ) -> list[str]:
    """Prune the checkpoints ``{step: path}`` (0 = the step-0 policy) by the policy; returns the files deleted.

    ``settled``, when given, holds the steps already pruned to their final state: they are skipped,
    and the steps pruned now are added to it. A checkpoint that has left the last K is never
    whole again (steps only move forward), so a driver that keeps the set checks each one once
    instead of re-reading every older checkpoint's records after every step (17 ms a step at
    step 150 of the main job, growing with the run; on an object store, requests per checkpoint).
    A new set (a resume, other K/M) checks them all once, which also finishes a crashed prune.
    """
    if keep_optimizer_last == 0:
        return []  # every checkpoint is kept whole
    plan = checkpoint_retention(checkpoint_paths, latest=latest, keep_optimizer_last=keep_optimizer_last,
                                keep_weights_every=keep_weights_every, optimizer_state_every=optimizer_state_every)
    done = settled if settled is not None else set()
    removed = []
    for step, keep in sorted(plan.items()):
        if keep == WHOLE or step in done:
            continue
        removed += prune_checkpoint(checkpoint_paths[step], keep)
        done.add(step)
    return removed


def check(path: str | os.PathLike[str], *, deep: bool | None = None, modified_only: bool = False) -> list[str]:
    """``digests.check(path)`` without the "missing" lines of files the pruned record names."""
    path = str(path).rstrip("/")
    pruned = pruned_files(path)
    problems = digests.check(path, deep=deep, modified_only=modified_only)
    if not pruned:
        return problems
    parent, _ = digests._parent_and_name(path)
    expected = {f"{run_store.join(parent, key)}: missing" for key in pruned}
    return [problem for problem in problems if problem not in expected]


def describe_pruned(path: str | os.PathLike[str]) -> str | None:
    """One line on what was pruned from ``path`` (None when nothing was)."""
    files = pruned_files(path)
    if not files:
        return None
    parts = [part for part in PARTS if any(f["part"] == part for f in files.values())]
    size = sum(f["bytes"] for f in files.values())
    return f"{str(path).rstrip('/')}: pruned by the retention policy: {', '.join(parts)} ({len(files)} files, {size_text(size)})"


class PrunedWeightsError(FileNotFoundError):
    """Generation, evaluation or training was asked of a checkpoint whose weights the retention policy deleted."""


# What a user can do when a call needs a checkpoint whose weights were pruned; said by
# :func:`require_weights` and by the run folder's resume check (workflows/run_binding.py).
PRUNED_WEIGHTS_ADVICE = (
    "A checkpoint whose weights were pruned cannot be generated, evaluated or trained from again: use one that kept them "
    "(the run's latest, its step-0 policy, every run.keep_weights_every_steps-th). A run that needs it again "
    "(its rollout or evaluate code changed since the run folder was written) resumes with the code that wrote "
    "the folder, or starts anew (another --run-root, or --set run.name=NEW_NAME), e.g. from a checkpoint that "
    "kept its weights: --set bootstrap.source=<that checkpoint folder>."
)


def weights_pruned(path: str | os.PathLike[str]) -> bool:
    """Whether the retention policy deleted the weights of the checkpoint at ``path``."""
    return any(f["part"] == "weights" for f in pruned_files(path).values())


def require_weights(path: str | os.PathLike[str]) -> None:
    """Raise :class:`PrunedWeightsError` when the retention policy deleted the weights of the checkpoint
    at ``path`` (a path or a URI), naming it and its pruned record; nothing otherwise.

    In a run this happens when a rollout or evaluation call was not in the run's cache (its stage's
    code changed since the run folder was written) and must generate from a pruned checkpoint again.
    """
    if weights_pruned(path):
        raise PrunedWeightsError(f"{describe_pruned(path)} (recorded in {pruned_record_path(path)}). {PRUNED_WEIGHTS_ADVICE}")


def size_text(size_bytes: int) -> str:
    """``size_bytes`` in the largest decimal unit it reaches: "812 bytes", "12.7 MB", "458.7 GB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:,.1f} {unit}"
    return f"{size_bytes} bytes"


__all__ = ["PRUNED_SUFFIX", "PRUNED_WEIGHTS_ADVICE", "PrunedWeightsError", "apply_retention", "check", "describe_pruned",
           "prune_checkpoint", "pruned_files", "pruned_record_path", "require_weights", "weights_pruned"]
