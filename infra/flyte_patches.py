"""Every change this project makes to private internals of the Flyte SDK (flyte 2.12.1 as pinned).

Three patches, each a function called where it is needed (infra/environments.py and
workflows/local_run.py: init_flyte_for_run). Each names the private internals it relies on in
``PATCHED_INTERNALS``; tests/unit/test_flyte_patches.py checks those names and signatures against
the installed SDK, so an SDK upgrade that moves them fails that test instead of silently undoing
a patch. Each patch's docstring says what it changes, why, and how to remove it.
(workflows/local_flyte.py also calls a private class, ``flyte._run._Runner``, without patching it;
its signature is checked the same way.)
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any

from infra.flyte_local_db import sync_normally_if_wal


@dataclass(frozen=True)
class PatchedInternal:
    """One private SDK object a patch relies on, as the pinned SDK defines it."""

    patch: str  # the function of this module (or the module) that relies on it
    module: str  # where it lives, e.g. ``flyte.types._type_engine``
    name: str  # its dotted name inside ``module``, e.g. ``DataclassTransformer.get_literal_type``
    parameters: tuple[str, ...]  # its parameter names in order (as ``inspect.signature`` lists them)
    kind: str = "function"  # function | staticmethod | coroutine-staticmethod | lru_cache | attribute


PATCHED_INTERNALS: tuple[PatchedInternal, ...] = (
    PatchedInternal("memoize_dataclass_literal_types", "flyte.types._type_engine",
                    "DataclassTransformer.get_literal_type", ("self", "t")),
    PatchedInternal("memoize_dataclass_literal_types", "flyte.types._type_engine",
                    "DataclassTransformer.__init__", ("self",)),  # the memo keys on the instance's ``name``
    PatchedInternal("sync_flyte_connections_normally", "flyte._persistence._db",
                    "LocalDB._initialize_sync_inner", (), "staticmethod"),
    PatchedInternal("sync_flyte_connections_normally", "flyte._persistence._db",
                    "LocalDB._initialize_async", (), "coroutine-staticmethod"),
    PatchedInternal("sync_flyte_connections_normally", "flyte._persistence._db", "LocalDB._conn_sync", (),
                    "attribute"),
    PatchedInternal("forget_config_file_lookup", "flyte.config._reader", "get_config_file", ("c",), "lru_cache"),
    PatchedInternal("workflows/local_flyte.py: run_local", "flyte._run", "_Runner.__init__",
                    ("self", "force_mode", "name", "service_account", "version", "copy_style", "dry_run",
                     "copy_bundle_to", "interactive_mode", "raw_data_path", "metadata_path")),
    PatchedInternal("workflows/local_flyte.py: run_local", "flyte._run", "_Runner.run", ("self", "task")),
)


def internal_changes(internal: PatchedInternal, module: Any) -> list[str]:
    """How ``module``'s object named ``internal.name`` differs from what the patch expects; [] when it matches."""
    owner, _, attribute = internal.name.rpartition(".")
    holder = module
    for part in filter(None, owner.split(".")):
        holder = getattr(holder, part, None)
        if holder is None:
            return [f"{internal.module}.{owner} no longer exists"]
    where = f"{internal.module}.{internal.name}"
    try:
        static = inspect.getattr_static(holder, attribute)
    except AttributeError:
        return [f"{where} no longer exists"]
    if internal.kind == "attribute":
        return []
    changes = _kind_changes(internal.kind, static, where)
    parameters = list(inspect.signature(getattr(holder, attribute)).parameters.values())
    names = tuple(parameter.name for parameter in parameters)
    expected = internal.parameters
    # New parameters after ours keep our calls working only when they need no argument.
    added_required = [parameter.name for parameter in parameters[len(expected):]
                      if parameter.default is parameter.empty
                      and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
    if names[:len(expected)] != expected or added_required:
        changes.append(f"{where} takes {names}, the patch expects {expected}")
    return changes


def _kind_changes(kind: str, static: Any, where: str) -> list[str]:
    """What is off about the kind of object found (a staticmethod, a coroutine, an lru_cache)."""
    function = static.__func__ if isinstance(static, staticmethod) else static
    if kind in ("staticmethod", "coroutine-staticmethod") and not isinstance(static, staticmethod):
        return [f"{where} is no longer a staticmethod"]
    if kind == "coroutine-staticmethod" and not inspect.iscoroutinefunction(function):
        return [f"{where} is no longer a coroutine function"]
    if kind == "lru_cache" and not hasattr(function, "cache_clear"):
        return [f"{where} is no longer memoised (functools.lru_cache)"]
    return []


def memoize_dataclass_literal_types() -> None:
    """Patch 1: build Flyte's literal type of each dataclass once per process (idempotent).

    What: wraps ``DataclassTransformer.get_literal_type`` with a memo keyed on (transformer name,
    type) that hands out copies (callers may modify the protobuf they get).
    Why: flyte 2.12 rebuilds a dataclass's JSON schema with mashumaro on every task call (twice:
    submit and execute): 50-200 ms for ``TrainConfig``, ~0.8 s for ``RunConfig`` under load, several
    tenths of a second per DAPO step (benchmarks/journal/2026-11-21_to_2026-11-27.md, "Fixed
    per-step cost"). A class's schema cannot change while the process runs, so the literal types,
    and the task cache keys, are the same as without it.
    Remove: when the SDK caches literal types itself (time ``TypeEngine.to_literal_type(RunConfig)``
    twice: the second call well under 1 ms), delete this function and its call in
    infra/environments.py.
    """
    from flyte.types import _type_engine

    transformer = _type_engine.DataclassTransformer
    build = transformer.get_literal_type
    if getattr(build, "dapo_memoized", False):
        return
    built: dict[Any, Any] = {}
    lock = threading.Lock()

    @functools.wraps(build)
    def get_literal_type(self: Any, t: Any) -> Any:
        try:
            key = (self.name, t)
            hash(key)
        except TypeError:  # an unhashable type annotation: nothing to key it by
            return build(self, t)
        with lock:
            literal_type = built.get(key)
        if literal_type is None:
            literal_type = build(self, t)
            with lock:
                built.setdefault(key, literal_type)
        copy = type(literal_type)()
        copy.CopyFrom(literal_type)
        return copy

    get_literal_type.dapo_memoized = True  # type: ignore[attr-defined]
    transformer.get_literal_type = get_literal_type


def sync_flyte_connections_normally() -> None:
    """Patch 2: Flyte's local-database connections sync normally in WAL mode (idempotent).

    What: wraps ``LocalDB._initialize_sync_inner`` and ``LocalDB._initialize_async`` so each
    connection Flyte opens gets ``PRAGMA synchronous=NORMAL`` when its database is in WAL mode
    (infra/flyte_local_db.py: ``use_wal`` puts it there, ``sync_normally_if_wal`` sets the level).
    Why: five SQLite commits a task call; with full syncs a trivial task call took 11-28 ms (4 ms
    after) and Flyte's bookkeeping 0.17 s of a steady main-job step (infra/flyte_local_db.py says
    why NORMAL is safe here). The synchronous level belongs to each connection and cannot change
    inside a transaction, so it is set as Flyte opens the connection, before anything uses it.
    Remove: when the SDK opens its local database with ``synchronous=NORMAL`` in WAL mode itself
    (or takes connection pragmas from its config), delete this function and its call in
    workflows/local_run.py: init_flyte_for_run; keep ``use_wal`` if the SDK does not set WAL.
    """
    from flyte._persistence._db import LocalDB

    open_sync = LocalDB._initialize_sync_inner
    if getattr(open_sync, "dapo_tuned", False):
        return
    open_async = LocalDB._initialize_async

    @functools.wraps(open_sync)
    def initialize_sync_inner() -> None:
        open_sync()
        if LocalDB._conn_sync is not None:
            sync_normally_if_wal(LocalDB._conn_sync)

    @functools.wraps(open_async)
    async def initialize_async() -> None:  # only with aiosqlite installed (not in requirements.txt)
        await open_async()
        if LocalDB._conn_sync is not None:
            sync_normally_if_wal(LocalDB._conn_sync)

    initialize_sync_inner.dapo_tuned = True  # type: ignore[attr-defined]
    LocalDB._initialize_sync_inner = staticmethod(initialize_sync_inner)
    LocalDB._initialize_async = staticmethod(initialize_async)


def forget_config_file_lookup() -> None:
    """Patch 3: make the SDK look for its config file again (clears a private memo).

    What: ``flyte.config._reader.get_config_file`` is an ``lru_cache``; this clears it.
    Why: ``dapo run`` points ``FLYTECTL_CONFIG`` at the run folder's own config (the cache DB and
    run records live there); the SDK may already have looked the file up, at import time, and
    would keep the old answer.
    Remove: when the SDK re-reads ``FLYTECTL_CONFIG`` on ``flyte.init_from_config(path)`` (or no
    longer memoises the lookup), delete this function and its call in
    workflows/local_run.py: init_flyte_for_run.
    """
    from flyte.config import _reader

    if hasattr(_reader.get_config_file, "cache_clear"):
        _reader.get_config_file.cache_clear()
