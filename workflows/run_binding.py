"""A run folder belongs to one resolved config and to one driver at a time.

``run.json`` records the config, the generating stages' cache versions and where the folder was
bound (``run_dir``). A later ``dapo run`` into the folder resumes only with the same config
(``run.steps`` may grow; the trackers and ``run.keep_*`` may change) and is refused before any
work, in one line, when the config differs, when changed generating code would need pruned
weights (:func:`check_generating_code`) or when the folder moved (:func:`check_not_moved`).
:func:`hold_run_folder` holds ``<run>/.dapo-run.lock`` (``fcntl.flock``) for the whole
invocation, so two drivers never write one run folder.

Design notes (what may change on resume and why, the lock): docs/RUN_FOLDER.md,
"Run binding (workflows/run_binding.py)".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from storage import pruning, run_store
from storage.run_layout import RunLayout
from workflows.config import ADDED_AT, NOT_COMPUTED, STORAGE_ONLY

LOCK_FILE = ".dapo-run.lock"
# Fields that may differ between a run folder's record and a resuming config: field -> rule.
RESUMABLE = {"run.steps": "may only grow (continue a finished run for more steps)",
             **{key: "may change (retention decides what is stored, not what is computed)" for key in STORAGE_ONLY}}


class RunFolderError(RuntimeError):
    """The run folder cannot be used by this invocation; the message says why and what to do."""


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{field}": value for section, fields in config.items() for field, value in fields.items()}


def _same(a: Any, b: Any) -> bool:
    # run.json is JSON: tuples read back as lists.
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def config_changes(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(section.field, old, new)`` for every field that differs, in sorted order (``RunConfig.to_dict()``
    shapes), fields of sections that compute nothing (the trackers) left out."""
    old, new = _flatten(recorded), _flatten(wanted)
    # Trackers record results and never change them: a resume may turn one on or off.
    old, new = ({k: v for k, v in d.items() if k.partition(".")[0] not in NOT_COMPUTED} for d in (old, new))
    # A record from before a field existed computed what the field's old value computes.
    old, new = ({**ADDED_AT, **d} for d in (old, new))
    return [(key, old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if not _same(old.get(key), new.get(key))]


def refusing_changes(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The changes that make ``wanted`` a different run than ``recorded`` (empty: a resume)."""
    allowed = {"run.steps": lambda old, new: isinstance(old, int) and isinstance(new, int) and new >= old,
               **{key: lambda old, new: True for key in STORAGE_ONLY}}
    return [(key, old, new) for key, old, new in config_changes(recorded, wanted)
            if not (key in allowed and allowed[key](old, new))]


def check_run_record(run_dir: str, record: dict[str, Any] | None, wanted: dict[str, Any]) -> None:
    """Raise :class:`RunFolderError` when ``run_dir``'s ``run.json`` (``record``) is of another config."""
    if record is None or "config" not in record:
        return
    changes = refusing_changes(record["config"], wanted)
    if changes:
        listed = "; ".join(f"{key} {old!r} -> {new!r}" for key, old, new in changes)
        raise RunFolderError(
            f"run folder {run_dir} holds a run of another config ({listed}); "
            "start a new run with --set run.name=NEW_NAME or another --run-root "
            f"(resuming allows only: run.steps {RESUMABLE['run.steps']}; run.keep_* (retention) may change)"
        )


def check_run_folder(layout: RunLayout, wanted: dict[str, Any], generating: Mapping[str, str] | None = None) -> None:
    """:func:`check_not_moved` and :func:`check_run_record` on the ``run.json`` of ``layout`` (a path or an
    object store), if it has one and the folder is bound (:func:`is_bound`); with ``generating`` (this
    code's versions of the stages that generate from checkpoints), also :func:`check_generating_code`.
    """
    if not is_bound(layout):
        return
    record = json.loads(run_store.read_text(layout.run_record)) if run_store.exists(layout.run_record) else None
    check_not_moved(layout, record)
    check_run_record(str(layout.root), record, wanted)
    if generating is not None:
        check_generating_code(layout, record, generating)


def is_bound(layout: RunLayout) -> bool:
    """Whether ``layout``'s record binds it: once anything under ``checkpoints/`` is published (the
    step-0 policy first; a checkpoint of another id is never replaced, storage/checkpoints.py).

    Before that the run holds curation at most, which its cached task re-makes whole when its inputs
    change (engines/curate/stage.py). A run refused before then (an input missing, a pool too small for one
    step, a prompt too long, a bad bootstrap.source) computed nothing the folder must keep: a run of the
    corrected config (often the refusal's own advice) starts there, rebinding the record, instead of
    being refused for the very fields that were fixed.
    """
    return bool(run_store.exists(layout.checkpoints_dir) and run_store.glob(layout.checkpoints_dir, "step-*"))


def check_not_moved(layout: RunLayout, record: dict[str, Any] | None) -> None:
    """Raise :class:`RunFolderError` when ``record`` (run.json) was bound at another path than ``layout``'s:
    the cache keys of its finished stages hold the old absolute paths. A record without ``run_dir``
    (written before it was kept) checks nothing."""
    bound_at = (record or {}).get("run_dir")
    if bound_at is None or bound_at == str(layout.root):
        return
    raise RunFolderError(
        f"run folder {layout.root} was moved or copied from {bound_at}: its finished stages are cached under "
        f"their absolute paths there, so it cannot be resumed or extended here; move it back to {bound_at} to "
        "resume it, or start a new run with --set run.name=NEW_NAME or another --run-root")


def check_generating_code(layout: RunLayout, record: dict[str, Any] | None, generating: Mapping[str, str]) -> None:
    """Raise :class:`RunFolderError` when a stage that generates from checkpoints (``generating``: stage ->
    this code's cache version) has other code than ``run.json`` records, and a checkpoint that stage would
    generate from again lost its weights to the retention policy: the rollout stage generates from every
    checkpoint but the last, evaluation from the evaluated ones (``eval/step-NNNN.parquet``). A record
    without versions (written before they were recorded) checks nothing; the stage then fails on the
    pruned checkpoint itself, with the same advice (storage/pruning.py: ``require_weights``).
    """
    recorded = (record or {}).get("stage_versions") or {}
    changed = [stage for stage, version in sorted(generating.items()) if recorded.get(stage) not in (None, version)]
    if not changed:
        return
    pruned = _weights_pruned(layout)
    if "rollout" not in changed:
        pruned = [path for path in pruned if run_store.exists(layout.eval_shard(_step_of(path)))]
    if not pruned:
        return
    raise RunFolderError(
        f"run folder {layout.root}: the code of the {' and '.join(changed)} stage{'s' if len(changed) > 1 else ''} "
        f"changed since this run was written (its source or a pin of a library it counts: "
        f"infra/versioning.py STAGE_LIBRARIES), so a resume would generate from its checkpoints again; the retention "
        f"policy (run.keep_optimizer_checkpoints, run.keep_weights_every_steps) pruned the weights of {len(pruned)} of "
        f"them ({pruned[0]}{' ... ' + Path(pruned[-1]).name if len(pruned) > 1 else ''}). {pruning.PRUNED_WEIGHTS_ADVICE}"
    )


def _weights_pruned(layout: RunLayout) -> list[str]:
    """The checkpoints of ``layout`` whose weights were pruned, by step."""
    records = run_store.glob(layout.checkpoints_dir, "step-*" + pruning.PRUNED_SUFFIX)
    folders = [record[: -len(pruning.PRUNED_SUFFIX)] for record in records]
    return [folder for folder in folders if pruning.weights_pruned(folder)]


def _step_of(checkpoint: str) -> int:
    return int(Path(checkpoint).name.removeprefix("step-"))


def check_can_hold(folder: str | os.PathLike[str]) -> None:
    """:class:`RunFolderError` when ``folder`` (a local path), or the nearest of its parents that exists,
    is a file or a folder this user may not write: before anything is created under it (the run's log
    file is the first)."""
    if run_store.is_remote(str(folder)):
        return
    for path in (Path(folder), *Path(folder).parents):
        if path.is_dir():
            if not os.access(path, os.W_OK | os.X_OK):
                raise RunFolderError(f"{folder} cannot be a run folder: {path} is not writable "
                                     "(give --run-root a folder you may write)")
            return
        if path.exists():
            raise RunFolderError(f"{folder} cannot be a run folder: {path} is a file, not a folder "
                                 "(give --run-root a folder; it is created if missing)")


# ----------------------------------------------------------------------------- the lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(text: str) -> dict[str, Any]:
    try:
        holder = json.loads(text)
        return holder if isinstance(holder, dict) else {}
    except ValueError:
        return {}


def open_regular(path: Path, flags: int) -> int:
    """``os.open(path, flags)``, never through a symlink (its target would be overwritten) and only of a
    regular file (a FIFO would block); :class:`RunFolderError` naming ``path`` otherwise, or when the
    folder cannot be written. For the run folder's lock and log files."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RunFolderError(f"{path} is a symlink, not a regular file; remove it and re-run") from None
        if err.errno in (errno.EISDIR, errno.ENXIO):
            raise RunFolderError(f"{path} is not a regular file; remove it and re-run") from None
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise RunFolderError(f"{path} cannot be written ({os.strerror(err.errno)}): the run folder "
                                 "must be writable") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFolderError(f"{path} is not a regular file; remove it and re-run")
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def hold_run_folder(folder: str | os.PathLike[str], *, note=lambda line: print(line, file=sys.stderr)) -> Iterator[None]:
    """Hold ``<folder>/.dapo-run.lock`` for the ``with`` block; :class:`RunFolderError` if another live driver does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = open_regular(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = _holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            pid, host = holder.get("pid", "?"), holder.get("host", "?")
            dead = host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid)
            # A process forked by a killed driver can keep the inherited lock: say so.
            hint = ("; that pid is gone but a process it started still holds the lock: stop it, then re-run" if dead
                    else "; wait for it to finish or stop it (Ctrl-C), then re-run")
            raise RunFolderError(
                f"run folder {folder} is already in use by pid {pid} on {host} since {holder.get('since', '?')}{hint}"
            ) from None
        previous = _holder(os.pread(fd, 4096, 0).decode(errors="replace"))
        if previous and not previous.get("released"):
            # flock is free, yet the record says held: that driver died without releasing it.
            note(f"note: taking over the stale lock of run folder {folder} (pid {previous.get('pid')} on "
                 f"{previous.get('host')} since {previous.get('since')} is no longer running)")
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({**mine, "released": True}) + "\n").encode(), 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
