"""The run store: run folders on a local (or shared) filesystem, or in an object store.

A run root is either a path (``runs/``, an NFS mount) or a URI of an object store that fsspec
and the Flyte SDK know (``s3://bucket/runs``, ``gs://``, ``abfs://``; ``memory://`` in tests).
Stage code always reads and writes local files (pyarrow shards, HF folders, DeepSpeed state).
For a URI, the Flyte task bodies copy their inputs from the store into a local *mirror*
(``DAPO_MIRROR_DIR``, default ``<tmp>/dapo-mirror``) and upload their outputs after the stage
code wrote them there, so the same stage code runs on both kinds of store. For a path, every
function here is the identity or the plain filesystem call.

Object stores have no rename, so publishing works differently from the filesystem's
temp-then-rename:

- a file (a shard, a JSON record) is uploaded as one object; S3, GCS and Azure make an
  object visible whole or not at all, so a reader never sees half a shard;
- a folder (a checkpoint) is uploaded file by file with its *marker* (``dapo_checkpoint.json``)
  last, after anything an earlier, killed attempt left under that prefix was deleted; readers
  treat a folder without its marker as absent (storage/checkpoints.py), as on a filesystem.

Credentials and endpoints come from the Flyte SDK's storage configuration (``flyte.storage``:
``FLYTE_AWS_ENDPOINT``, ``FLYTE_AWS_ACCESS_KEY_ID`` ... or the pod's workload identity), i.e.
the same ones Flyte itself uses on the cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import functools
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from schemas.disk_space import writing

MIRROR_ENV = "DAPO_MIRROR_DIR"
FOLDER_MARKER = "dapo_checkpoint.json"  # = storage.checkpoints.METADATA_FILE (kept import-free)


class RunStoreError(RuntimeError):
    """A run-store object is missing or incomplete; the message names the URI."""


def scheme_of(path: str | os.PathLike[str]) -> str | None:
    """``"s3"`` for ``s3://b/k``; None for a local path (``file://`` counts as local)."""
    text = str(path)
    if "://" not in text:
        return None
    scheme = text.split("://", 1)[0]
    return None if scheme in ("", "file") else scheme


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is an object-store URI rather than a local path."""
    return scheme_of(path) is not None


def join(root: str | os.PathLike[str], *parts: str) -> str:
    """``root/part/...`` for a path or a URI (never collapses ``s3://`` the way pathlib does)."""
    if not is_remote(root):
        return str(Path(_strip_file(root), *parts))
    return "/".join([str(root).rstrip("/"), *(p.strip("/") for p in parts if p)])


def _strip_file(path: str | os.PathLike[str]) -> str:
    text = str(path)
    return text[len("file://"):] if text.startswith("file://") else text


@functools.cache
def _filesystem(scheme: str) -> Any:
    # The SDK's filesystem factory applies its storage config (endpoint, keys) for s3/gs/abfs.
    from flyte.storage import get_underlying_filesystem

    return get_underlying_filesystem(protocol=scheme)


def _fs(uri: str) -> Any:
    scheme = scheme_of(uri)
    assert scheme is not None, uri
    return _filesystem(scheme)


def _uri(scheme: str, key: str) -> str:
    """fsspec listings drop the scheme (and some keep a leading slash); put it back."""
    return f"{scheme}://{key.lstrip('/')}"


def mirror_root() -> Path:
    """Where this process keeps local copies of object-store files (``DAPO_MIRROR_DIR``)."""
    return Path(os.environ.get(MIRROR_ENV) or Path(tempfile.gettempdir()) / "dapo-mirror")


def local_path(path: str | os.PathLike[str]) -> Path:
    """The local file for ``path``: itself for a path, its place in the mirror for a URI."""
    scheme = scheme_of(path)
    if scheme is None:
        return Path(_strip_file(path))
    return mirror_root() / scheme / str(path).split("://", 1)[1].lstrip("/")


def source_name(local: str | os.PathLike[str]) -> str:
    """The run-store name of a local file: its URI when it lies in the mirror, else its resolved path."""
    resolved = Path(local).resolve()
    try:
        rel = resolved.relative_to(mirror_root().resolve())
    except ValueError:
        return str(resolved)
    scheme, _, key = str(rel).partition("/")
    return _uri(scheme, key)


# ----------------------------------------------------------------------------- queries


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether a file (or any object under a folder prefix) exists at ``path``."""
    if not is_remote(path):
        return local_path(path).exists()
    return bool(_fs(str(path)).exists(str(path)))


def glob(root: str | os.PathLike[str], pattern: str) -> list[str]:
    """Sorted names under ``root`` matching ``pattern`` (``*`` within one level), as paths or URIs."""
    if not is_remote(root):
        return sorted(str(p) for p in local_path(root).glob(pattern))
    scheme = scheme_of(root)
    assert scheme is not None
    return sorted(_uri(scheme, key) for key in _fs(str(root)).glob(join(root, pattern)))


def _find(uri: str) -> list[str]:
    """Every object under the folder ``uri``, as URIs."""
    scheme = scheme_of(uri)
    assert scheme is not None
    prefix = uri.rstrip("/") + "/"
    return sorted(u for u in (_uri(scheme, k) for k in _fs(uri).find(prefix)) if u.startswith(prefix))


def folder_files(uri: str) -> list[str]:
    """Every object under the object-store folder ``uri``, as URIs."""
    return _find(uri.rstrip("/"))


def folder_sizes(uri: str) -> dict[str, int]:
    """``{URI: bytes}`` of every object under the object-store folder ``uri``, from one listing
    (a request a thousand objects, not one a file: storage/digests.py: check of a checkpoint)."""
    scheme = scheme_of(uri)
    assert scheme is not None, uri
    prefix = uri.rstrip("/") + "/"
    found = _fs(uri).find(prefix, detail=True)
    return {u: int(info["size"]) for key, info in found.items() if (u := _uri(scheme, key)).startswith(prefix)}


def size(path: str | os.PathLike[str]) -> int:
    """The size in bytes of the file at ``path``."""
    if not is_remote(path):
        return local_path(path).stat().st_size
    return int(_fs(str(path)).size(str(path)))


def open_binary(path: str | os.PathLike[str]) -> Any:
    """A binary file object reading ``path`` (streamed from the store for a URI)."""
    if not is_remote(path):
        return local_path(path).open("rb")
    return _fs(str(path)).open(str(path), "rb")


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    if not is_remote(path):
        return local_path(path).read_bytes()
    try:
        return bytes(_fs(str(path)).cat_file(str(path)))
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{path}: no such object in the run store") from err


def read_text(path: str | os.PathLike[str]) -> str:
    return read_bytes(path).decode()


# ----------------------------------------------------------------------------- writes


def _write_local_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with writing(path, "a file"):
            tmp.write_bytes(data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a whole file atomically: temp-then-rename locally, one object PUT in a store."""
    if not is_remote(path):
        _write_local_atomic(local_path(path), text.encode())
    else:
        _fs(str(path)).pipe_file(str(path), text.encode())


def remove(path: str | os.PathLike[str]) -> None:
    """Delete a file or a whole folder prefix in the store (missing is fine)."""
    if not is_remote(path):
        target = local_path(path)
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
        return
    uri = str(path)
    fs = _fs(uri)
    if fs.exists(uri):
        with contextlib.suppress(FileNotFoundError):
            fs.rm(uri, recursive=True)


def upload_file(local: str | os.PathLike[str], uri: str) -> None:
    """One object from one local file (visible whole or not at all)."""
    _fs(uri).put_file(str(local), uri)


def upload_folder(local: str | os.PathLike[str], uri: str, *, marker: str | None = FOLDER_MARKER,
                  clear: bool = True, include_marker: bool = True) -> None:
    """Upload every file under ``local`` to the prefix ``uri``, ``marker`` (if present) last.

    ``clear`` first deletes what is under ``uri`` (an earlier, killed attempt's files), marker
    first, so the prefix never holds a marker beside files of another attempt. Several writers
    filling one prefix (the nodes of a multi-node step) pass ``clear=False`` and
    ``include_marker=False``; one of them uploads the marker after all are done.
    """
    local = Path(local)
    if clear:
        clear_folder(uri, marker=marker)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    last = [p for p in files if marker and p.relative_to(local).as_posix() == marker]
    for path in [p for p in files if p not in last]:
        upload_file(path, join(uri, path.relative_to(local).as_posix()))
    if include_marker:
        for path in last:
            upload_file(path, join(uri, path.relative_to(local).as_posix()))


def clear_folder(uri: str, *, marker: str | None = FOLDER_MARKER) -> None:
    """Delete what is under the prefix ``uri``, its marker first (a reader never sees a marker beside a
    half-removed folder)."""
    if marker and exists(join(uri, marker)):
        remove(join(uri, marker))
    remove(uri)


@contextlib.contextmanager
def staged(path: str | os.PathLike[str], *, folder: bool = False, others_fill: bool = False) -> Iterator[Path]:
    """A local path to write ``path``'s content to; uploaded when the block ends without error.

    For a local ``path`` this yields the path itself (the stage code's own atomic writes apply).
    For a URI it yields the mirror location, cleared first, and uploads it afterwards: one
    object for a file, or the folder with its marker last (``folder=True``). Task outputs are
    published through ``storage.outputs.output``, which adds their digest records.
    ``others_fill``: other writers (the nodes of a multi-node step) upload files into the folder
    during the block, so what was under ``path`` is removed before it, not at its end.
    """
    if not is_remote(path):
        yield local_path(path)
        return
    local = local_path(path)
    if local.is_dir():
        shutil.rmtree(local)
    else:
        local.unlink(missing_ok=True)
    local.parent.mkdir(parents=True, exist_ok=True)
    _forget_notes(local)  # what the writer leaves here is whole
    if others_fill:
        clear_folder(str(path))
    yield local
    if folder or local.is_dir():
        upload_folder(local, str(path), clear=not others_fill)
    elif local.is_file():
        upload_file(local, str(path))
    else:
        raise RunStoreError(f"{path}: the stage wrote nothing to {local}")


# ----------------------------------------------------------------------------- reads into the mirror


@contextlib.contextmanager
def _locked(local: Path) -> Iterator[None]:
    # Ranks and engines on one node fetch the same checkpoint at once; one downloads.
    local.parent.mkdir(parents=True, exist_ok=True)
    with open(local.parent / f".{local.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _download_folder(uri: str, local: Path, keys: list[str]) -> None:
    fs = _fs(uri)
    tmp = local.with_name(f".{local.name}.fetch-{uuid.uuid4().hex[:8]}")
    try:
        prefix = uri.rstrip("/") + "/"
        for key in keys:
            target = tmp / key[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(key, str(target))
        if local.exists():
            shutil.rmtree(local)
        tmp.replace(local)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _missing_note(local: Path) -> Path:
    """Beside a mirrored folder (not in it: the folder's files are the store's): the names of the
    store's files a partial fetch left out of it. No note: the mirror copy is whole."""
    return local.with_name(f".{local.name}.missing.json")


def _old_skip_note(local: Path) -> Path:
    """The note of an earlier version (skip patterns, not names): its copy is fetched again."""
    return local.with_name(f".{local.name}.skipped.json")


def _missing(local: Path) -> set[str]:
    note = _missing_note(local)
    return set(json.loads(note.read_text())) if note.is_file() else set()


def _write_missing(local: Path, names: set[str]) -> None:
    if names:
        _write_local_atomic(_missing_note(local), json.dumps(sorted(names)).encode())
    else:
        _missing_note(local).unlink(missing_ok=True)


def _forget_notes(local: Path) -> None:
    _missing_note(local).unlink(missing_ok=True)
    _old_skip_note(local).unlink(missing_ok=True)


def _download_files(local: Path, keys: dict[str, str]) -> None:
    """Add the store's files ``keys`` (relative name -> key) to the mirror copy ``local``, each
    downloaded beside its place and renamed into it: a reader of the copy never sees part of one."""
    for rel, key in keys.items():
        target = local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.fetch-{uuid.uuid4().hex[:8]}")
        try:
            _fs(key).get_file(key, str(tmp))
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)


def _skipped(rel: str, skip: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in skip)


def fetch(path: str | os.PathLike[str], *, skip: Sequence[str] = (), only: Sequence[str] | None = None) -> Path:
    """A local copy of the file or folder at ``path`` (the path itself when it is local).

    A folder with a marker (a checkpoint) is downloaded only when the mirror's marker differs
    from the store's, so a node fetches each checkpoint once. Files are always downloaded
    (shards are small, and a re-run may have replaced them).

    ``skip``: patterns (``fnmatch``, on names relative to the folder: ``"ds_state/*"``) of a
    folder's files the caller will not read, left out of the download (the marker never is).
    Rollout and evaluation fetch a checkpoint without its optimizer state
    (``checkpoints.fetch_policy``), a training step without its weights when it resumes the
    optimizer state (engines/train/checkpoint.py): at paper scale 65 GB of 459 GB, and 393 GB. The
    names a partial copy lacks are noted beside it; a later fetch of the same checkpoint that
    needs some of them adds just those to the copy, each file renamed into place, and never
    removes a file another reader on the node may be reading.

    ``only``: patterns of the only files of a folder the caller reads (besides the marker): a
    re-run's reuse check of a published train step reads its StepMetrics row and timings, not its
    weights or optimizer state (engines/train/publish.py: published_result).
    """
    if not is_remote(path):
        return local_path(path)
    uri, local = str(path).rstrip("/"), local_path(path)
    fs = _fs(uri)
    with _locked(local):
        if fs.isfile(uri):
            tmp = local.with_name(f".{local.name}.fetch-{uuid.uuid4().hex[:8]}")
            try:
                fs.get_file(uri, str(tmp))
                tmp.replace(local)
            finally:
                tmp.unlink(missing_ok=True)
            return local
        keys = _find(uri)
        if not keys:
            raise FileNotFoundError(f"{uri}: no such file or folder in the run store")
        marker_uri = join(uri, FOLDER_MARKER)
        mirrored = local / FOLDER_MARKER
        prefix = uri + "/"
        names = {k[len(prefix):]: k for k in keys}
        wanted = {rel for rel in names if rel == FOLDER_MARKER
                  or (not _skipped(rel, skip) and (only is None or _skipped(rel, only)))}
        if (marker_uri in keys and mirrored.is_file() and mirrored.read_bytes() == read_bytes(marker_uri)
                and not _old_skip_note(local).exists()):
            missing = _missing(local)  # this checkpoint is here: add what the caller reads and it lacks
            needed = sorted(missing & wanted)
            if needed:
                _download_files(local, {rel: names[rel] for rel in needed})
                _write_missing(local, missing - set(needed))
            return local
        # The note first: a crash before the folder is replaced leaves an over-cautious note.
        _write_missing(local, set(names) - wanted)
        _download_folder(uri, local, [names[rel] for rel in sorted(wanted)])
        _old_skip_note(local).unlink(missing_ok=True)
        return local


def evict_mirrored(path: str | os.PathLike[str], *, keep: int) -> list[Path]:
    """Remove from this node's mirror the copies of ``path``'s sibling checkpoint folders, all but
    the ``keep`` most recently fetched or written (``path`` itself counts as fetched now); returns
    what it removed. Nothing for a local path.

    A rollout engine's node outlives the steps (a reused Ray cluster) and fetches every step's
    checkpoint: without this its mirror would grow by a checkpoint's weights a step (65.5 GB for
    Qwen2.5-32B) until the disk fills. Recency is each copy's marker's modification time (a
    download writes the marker last, a fetch that finds the copy touches it), so the copy a train
    step just published in this mirror is the newest; folders without a marker (being written) and
    hidden ones (downloads and stagings under way) are never touched. Each removal holds the
    folder's fetch lock, so a fetch of it waits and downloads it again.
    """
    if not is_remote(path):
        return []
    local = local_path(str(path).rstrip("/"))
    if (local / FOLDER_MARKER).is_file():
        now = time.time_ns()  # the file system's own stamps are coarse (~ms): two fetches may tie
        os.utime(local / FOLDER_MARKER, ns=(now, now))
    # Hidden folders are downloads and stagings under way (their marker may already be there).
    copies = sorted((p for p in local.parent.iterdir()
                     if not p.name.startswith(".") and p.is_dir() and (p / FOLDER_MARKER).is_file()),
                    key=lambda p: (p / FOLDER_MARKER).stat().st_mtime_ns, reverse=True)
    removed = []
    for old in copies[keep:]:
        if old == local:
            continue
        with _locked(old):
            shutil.rmtree(old, ignore_errors=True)
            _forget_notes(old)
        removed.append(old)
    return removed


def download_tree(uri: str, dest: str | os.PathLike[str], *, exclude_suffixes: Sequence[str] = ()) -> Path:
    """Copy the folder ``uri`` to ``dest`` (replacing it), skipping files whose names end in
    ``exclude_suffixes`` (e.g. weights, when only records are needed)."""
    keys = [k for k in _find(uri.rstrip("/")) if not k.endswith(tuple(exclude_suffixes))]
    if not keys:
        raise FileNotFoundError(f"{uri}: no such folder in the run store")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _download_folder(uri.rstrip("/"), dest, keys)
    return dest


def fetch_all(paths: Sequence[str]) -> list[str]:
    """``fetch`` each of ``paths``; the local names, in order."""
    return [str(fetch(p)) for p in paths]
