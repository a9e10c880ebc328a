"""Content digests of published outputs, recorded beside each output and checked on demand.

Every task output (a shard, a JSON manifest, a checkpoint folder) is published through
``storage.outputs.output``, which records the sha256 and size of each of its files in a *digest
record* beside it: ``<output>.sha256.json`` (``round-00.parquet.sha256.json``,
``checkpoints/step-0002.sha256.json``). A record is one small JSON file next to the output, so
it works the same on a filesystem and in an object store, and it is written after the output
(a crash in between leaves an output without a record, which counts as not verified).

``check`` compares an output with its record: a missing record, a missing file, another size or
(``deep``) another sha256 is a problem, named by file. The driver checks what each cached task
call points to (workflows/verified_calls.py); ``dapo verify`` checks a whole run folder
(cli/verify.py). In an object store a shallow check compares sizes only (no download; the
stores checksum objects themselves); ``deep=True`` downloads and hashes.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from schemas.file_identity import Identity, identity
from storage import run_store

RECORD_SUFFIX = ".sha256.json"
# Beside a checkpoint the retention policy pruned: what it deleted (storage/pruning.py writes it).
PRUNED_SUFFIX = ".pruned.json"
_CHUNK_BYTES = 1 << 20
_HASH_THREADS = 4  # large files hashed at once by describe()


def record_path(path: str | os.PathLike[str]) -> str:
    """The digest record of the output ``path`` (a file or a folder; a path or a URI)."""
    return str(path).rstrip("/") + RECORD_SUFFIX


def pruned_record_path(path: str | os.PathLike[str]) -> str:
    """The pruned record of the output ``path`` (beside its digest record; storage/pruning.py)."""
    return str(path).rstrip("/") + PRUNED_SUFFIX


def _parent_and_name(path: str | os.PathLike[str]) -> tuple[str, str]:
    text = str(path).rstrip("/")
    if run_store.is_remote(text):
        parent, _, name = text.rpartition("/")
        return parent, name
    local = Path(run_store.local_path(text))
    return str(local.parent), local.name


def _sha256_of(handle: BinaryIO, feed: Any = None) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
        digest.update(chunk)
        if feed is not None:
            feed.update(chunk)
    return digest.hexdigest()


# sha256s this process took, by file identity (device, inode, size, modification time in ns), so
# that a file hashed for one purpose is not read again for another: a checkpoint's weights are
# hashed for its id (storage/checkpoints.py) and then for its record, the 65 GB of a paper-scale
# policy twice a step otherwise. A rewritten or replaced file has another identity.
_KNOWN_SHA256S: dict[Identity, str] = {}
_KNOWN_MAX = 512
_KNOWN_LOCK = threading.Lock()


def file_sha256(path: str | os.PathLike[str], *, feed: Any = None) -> str:
    """sha256 (hex) of a local file, read in 1 MiB chunks (always read: checks rely on it).

    ``feed``, another hash object, is updated with the same bytes (one read for two digests).
    The result is remembered for :func:`known_file_sha256` when the file did not change while read.
    """
    with open(path, "rb") as handle:
        before = identity(os.fstat(handle.fileno()))
        sha256 = _sha256_of(handle, feed)
        after = identity(os.fstat(handle.fileno()))
    if before == after:
        with _KNOWN_LOCK:
            if len(_KNOWN_SHA256S) >= _KNOWN_MAX:
                del _KNOWN_SHA256S[next(iter(_KNOWN_SHA256S))]  # the oldest
            _KNOWN_SHA256S[after] = sha256
    return sha256


def known_file_sha256(path: str | os.PathLike[str]) -> str:
    """``file_sha256(path)``, without reading the file again when this process hashed it unchanged
    (same device, inode, size and modification time). For records and cache keys of files this
    process just wrote or hashed; a check against a record always reads (:func:`check`)."""
    with _KNOWN_LOCK:
        known = _KNOWN_SHA256S.get(identity(os.stat(path)))
    return known if known is not None else file_sha256(path)


def file_sha256s(paths: Sequence[Path]) -> list[str]:
    """``[known_file_sha256(p) for p in paths]``, hashing files of a MiB or more several at once.

    A checkpoint's record hashes its weights and optimizer state (16 MB for the tiny policy,
    ~10 ms a step one after another): ``hashlib`` and file reads release the GIL, so threads
    overlap them on the cores the step leaves idle at that moment.
    """
    big = [p for p in paths if p.stat().st_size >= _CHUNK_BYTES]
    if len(big) < 2:
        return [known_file_sha256(p) for p in paths]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(_HASH_THREADS, len(big))) as pool:
        hashed = dict(zip(big, pool.map(known_file_sha256, big)))
    return [hashed[p] if p in hashed else known_file_sha256(p) for p in paths]


def describe(local: Path, name: str) -> dict[str, dict[str, Any]]:
    """``{"<name>[/<relpath>]": {"bytes", "sha256"}}`` for the local file or folder ``local``."""
    if local.is_file():
        files = {name: local}
    else:
        files = {f"{name}/{p.relative_to(local).as_posix()}": p for p in sorted(local.rglob("*")) if p.is_file()}
    sha256s = file_sha256s(list(files.values()))
    return {key: {"bytes": p.stat().st_size, "sha256": sha} for (key, p), sha in zip(files.items(), sha256s)}


def record(path: str | os.PathLike[str], local: Path | None = None) -> dict[str, Any] | None:
    """Write the digest record of the published output ``path`` from its local copy ``local``
    (default: ``run_store.local_path(path)``); returns it, or None when there is nothing there.

    For an object-store folder, files in the store that the local copy lacks (uploaded by other
    nodes of a multi-node step) are recorded with their size only.

    An output the retention policy pruned (a ``<output>.pruned.json`` beside it) that is published
    again unchanged, but for the files that were pruned (a replayed train task reusing its step),
    keeps its record as it is: its upstream digest, the cache key of every call downstream of it,
    must not change. New content published there instead drops the pruned record, which described
    what was there before.
    """
    local = Path(local if local is not None else run_store.local_path(path))
    _, name = _parent_and_name(path)
    if not local.exists():
        run_store.remove(record_path(path))
        return None
    files: dict[str, dict[str, Any]] = describe(local, name)
    if run_store.is_remote(path) and local.is_dir():
        for uri in run_store.folder_files(str(path)):
            key = f"{name}/{uri[len(str(path).rstrip('/')) + 1:]}"
            files.setdefault(key, {"bytes": run_store.size(uri), "sha256": None})
    entry = {"output": name, "files": dict(sorted(files.items()))}
    pruned_path = pruned_record_path(path)
    if run_store.exists(pruned_path):
        pruned = json.loads(run_store.read_text(pruned_path))["files"]
        old = json.loads(run_store.read_text(record_path(path))) if run_store.exists(record_path(path)) else None
        if old is not None and entry["files"] == {k: v for k, v in old["files"].items() if k not in pruned}:
            return old  # the same output, what was pruned still missing
        run_store.remove(pruned_path)
    run_store.write_text(record_path(path), json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return entry


def _actual_sha256(path: str) -> str:
    if not run_store.is_remote(path):
        return file_sha256(run_store.local_path(path))
    with run_store.open_binary(path) as handle:
        return _sha256_of(handle)


def check(path: str | os.PathLike[str], *, deep: bool | None = None, modified_only: bool = False) -> list[str]:
    """Problems of the output ``path`` against its record, one line per file (empty = intact).

    ``deep`` (default: True for a local path, False for a URI) hashes every file; otherwise
    existence and sizes are compared. ``modified_only`` (with ``deep``) hashes only the local files
    modified since their record was written (:func:`modified_since_record`): the cheap check of a
    resume, whose cost is one ``stat`` a file, not its bytes; ``dapo verify`` hashes them all.
    """
    path = str(path).rstrip("/")
    deep = not run_store.is_remote(path) if deep is None else deep
    rec = record_path(path)
    recorded_at = _recorded_at_ns(path) if deep and modified_only else None
    if not run_store.exists(rec):
        if run_store.exists(path):
            return [f"{path}: no digest record ({rec}); its content cannot be verified"]
        return [f"{path}: missing (and no digest record {rec})"]
    try:
        files = json.loads(run_store.read_text(rec))["files"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{rec}: unreadable digest record: {err}"]
    parent, _ = _parent_and_name(path)
    # A folder in an object store: its sizes from one listing, not two requests a file.
    listed = run_store.folder_sizes(path) if run_store.is_remote(path) and any("/" in k for k in files) else None
    problems = []
    for key, want in files.items():
        target = run_store.join(parent, key)
        size = _size_or_none(target, listed)
        if size is None:
            problems.append(f"{target}: missing")
            continue
        if size != want["bytes"]:
            problems.append(f"{target}: damaged ({size} bytes, {want['bytes']} recorded)")
        elif (deep and want.get("sha256") and modified_since_record(target, recorded_at)
              and _actual_sha256(target) != want["sha256"]):
            problems.append(f"{target}: damaged (sha256 differs from the recorded {want['sha256'][:16]}...)")
    return problems


def _size_or_none(target: str, listed: dict[str, int] | None) -> int | None:
    """The size of the file ``target`` (from ``listed``, a folder's listing, when given); None when it is missing."""
    if listed is not None:
        return listed.get(target)
    return run_store.size(target) if run_store.exists(target) else None


def _recorded_at_ns(path: str) -> int | None:
    """When the local output ``path``'s digest record was written (its modification time, ns);
    None for an object store or when it has none."""
    stamp = record_stamp(path)
    return stamp[2] if stamp is not None else None


def modified_since_record(target: str, recorded_at_ns: int | None) -> bool:
    """Whether the file ``target`` may hold other bytes than its record hashed: True unless it is a
    local file last modified strictly before the record was written (``recorded_at_ns``; None:
    unknown, so True). A record is written after its files were hashed, and any later write of a
    file (a flip, a truncation, a copy over it) sets the file's modification time to that moment or
    later. A file modified in the same clock tick as its record (file system times are coarse, ~ms)
    counts as modified: git's rule for "racily clean" files. What this cannot see (a write that puts
    the modification time back, bit rot) is for the deep check, ``dapo verify``."""
    if recorded_at_ns is None or run_store.is_remote(target):
        return True
    try:
        return run_store.local_path(target).stat().st_mtime_ns >= recorded_at_ns
    except FileNotFoundError:
        return True


def record_stamp(path: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """(inode, size, modification time in ns) of the local output ``path``'s digest record; None
    when it has none or lives in an object store. Records are written atomically (a new file
    renamed into place), so a record written again has another stamp."""
    if run_store.is_remote(path):
        return None
    try:
        stat = run_store.local_path(record_path(path)).stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def upstream_digest(paths: Sequence[str | os.PathLike[str]]) -> str:
    """A digest of what the outputs ``paths`` hold: their digest records (16 hex chars).

    Passed to a task as an input, it puts its inputs' content into the cache key (which otherwise
    holds their paths only): an upstream stage that re-ran and wrote other content makes this one
    run again, and the same content keeps the cache hit. A path without a record (a user's data
    file, a model folder to import) contributes its own sha256 when it is a local file, its files'
    names, sizes and modification times when it is a local folder (a rewritten file counts as
    changed; the bytes are not read, so a 65 GB model adds no hashing), else its name.
    """
    digest = hashlib.sha256()
    for path in paths:
        rec = record_path(path)
        if run_store.exists(rec):
            digest.update(run_store.read_text(rec).encode())
        elif not run_store.is_remote(path) and Path(path).is_file():
            digest.update(known_file_sha256(Path(path)).encode())
        elif not run_store.is_remote(path) and Path(path).is_dir():
            digest.update(folder_fingerprint(Path(path)).encode())
        else:
            digest.update(f"unrecorded:{path}".encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def folder_fingerprint(folder: Path) -> str:
    """sha256 over ``folder``'s files (relative path, size, modification time in ns), recursively."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def forget(path: str | os.PathLike[str]) -> None:
    """Delete the output ``path`` and its record (before it is made again)."""
    run_store.remove(record_path(path))
    run_store.remove(path)
