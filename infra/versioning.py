"""Cache versions derived from the code that really determines a stage's output.

Flyte's automatic cache version hashes only the task function's own source, so editing a
helper it calls would silently reuse stale outputs. Each stage instead names the modules its
output depends on; the version is a hash of their source files (plus a manual salt), so any
edit to that code invalidates exactly the stages that use it. The task's inputs (paths,
config dataclasses, seeds) are part of Flyte's cache key on top of this version.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

# Bump to invalidate every stage's cache at once (e.g. after a change of run-store layout).
GLOBAL_SALT = "run-store-v1"


def _module_files(module_name: str) -> list[Path]:
    module = importlib.import_module(module_name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        raise ValueError(f"module {module_name!r} has no source file to hash")
    path = Path(origin)
    if path.name == "__init__.py":
        # A package: hash every Python file in it, in a stable order.
        return sorted(path.parent.rglob("*.py"))
    return [path]


def code_version(stage: str, module_names: list[str] | tuple[str, ...]) -> str:
    """A short, stable version string for ``stage`` from the source of ``module_names``.

    Modules are imported to locate their files; a package contributes all its ``.py`` files.
    """
    digest = hashlib.sha256(f"{GLOBAL_SALT}|{stage}".encode())
    for name in sorted(set(module_names)):
        for path in _module_files(name):
            digest.update(name.encode())
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return f"{stage}-{digest.hexdigest()[:16]}"
