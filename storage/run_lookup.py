"""Which run folder a user means by ``RUN`` (``dapo verify|report|audit|lineage RUN``, ``dapo engines
release --run RUN``, each with ``--run-root``): the one lookup every command uses.

``RUN`` is a folder holding ``run.json`` (storage/run_layout.py: RunLayout.run_record), given as a
path or an object-store URI, or a run name under ``--run-root`` (itself a path or a URI); the first
of these that holds a ``run.json`` is the run. A local run is named by its absolute path, a stored
one by its URI: the names the driver gave the folder (workflows/local_run.py: run_layout), so what
is derived from the name (a Ray namespace, engines/rollout/ray_engines.py: run_namespace) matches.
No match: :class:`RunNotFound`, one line naming ``RUN`` and where it looked.

Plain paths are looked up without storage/run_store.py, whose import loads the pandera models (~1 s
that a `dapo audit` query never needs); it is imported only when a URI is involved.
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_RECORD = "run.json"  # a run folder's record, from its start (storage/run_layout.py: RunLayout.run_record)
# A records copy (lineage, audit) leaves out weights, optimizer state and pages: they stay in the store.
NOT_RECORDS = (".safetensors", ".bin", ".pt", ".pth", ".png", ".html")


class RunNotFound(LookupError):
    """``RUN`` names no run folder (the message names it and where it looked)."""


def _plain(*names: str) -> bool:
    """No URI among ``names`` (``file://`` included): looked up without storage/run_store.py."""
    return not any("://" in name for name in names)


def _candidates(run: str, run_root: str) -> list[str]:
    """Where ``run`` may be: itself, then (unless it is an object-store URI) a name under ``run_root``."""
    if _plain(run, run_root):
        return list(dict.fromkeys([run, os.path.join(run_root, run)]))  # an absolute ``run`` is itself under any root
    from storage import run_store

    if run_store.is_remote(run):
        return [run.rstrip("/")]
    return list(dict.fromkeys([run, run_store.join(run_root, run)]))


def _found(candidate: str) -> str | None:
    """``candidate``'s name as the driver gives it (absolute path, or URI) when it holds a run record."""
    if _plain(candidate):
        return str(Path(candidate).resolve()) if Path(candidate, RUN_RECORD).is_file() else None
    from storage import run_store

    if not run_store.exists(run_store.join(candidate, RUN_RECORD)):
        return None
    return candidate if run_store.is_remote(candidate) else str(run_store.local_path(candidate).resolve())


def not_a_run_folder(run: str, run_root: str) -> str:
    """The one line for a ``RUN`` that names no run folder."""
    looked = " or in ".join(_candidates(run, run_root))
    return f"{run!r}: not a run folder (no {RUN_RECORD} in {looked})"


def run_folder(run: str, run_root: str) -> str:
    """The run folder ``run`` names: its absolute path, or its URI. Raises :class:`RunNotFound`."""
    for candidate in _candidates(run, run_root):
        found = _found(candidate)
        if found is not None:
            return found
    raise RunNotFound(not_a_run_folder(run, run_root))


def records_copy(uri: str) -> Path:
    """The local folder that holds the records of the stored run ``uri`` (:func:`local_run_folder`)."""
    from storage import run_store

    return run_store.mirror_root() / "lineage" / run_store.local_path(uri).relative_to(run_store.mirror_root())


def local_run_folder(run: str, run_root: str) -> Path:
    """:func:`run_folder` as a local folder to read: a stored run's records (shards, checkpoint and
    digest records; not :data:`NOT_RECORDS`) are copied first, to :func:`records_copy`."""
    folder = run_folder(run, run_root)
    if _plain(folder):
        return Path(folder)
    from storage import run_store

    local = records_copy(folder)
    run_store.download_tree(folder, local, exclude_suffixes=NOT_RECORDS)
    return local


__all__ = ["NOT_RECORDS", "RunNotFound", "local_run_folder", "not_a_run_folder", "records_copy", "run_folder"]
