"""summary.json's paths, relative to the run folder on disk and resolved when read.

A run folder is copied, moved, mounted elsewhere or read on another machine; the paths summary.json
names (the folder itself, the final checkpoint, the run page) are written relative to the folder
that holds the file, so they stay right wherever the folder goes. Readers call :func:`read_summary`
(or :func:`resolve_paths`) to get paths they can open; an older summary with absolute paths reads
unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from storage.run_layout import RunLayout
from storage.run_store import is_remote, join, read_text

PATH_KEYS = ("run_dir", "final_checkpoint", "report")  # the summary's entries that name a path in the run folder


def relative_to(path: str, root: str) -> str:
    """``path`` relative to the run folder ``root`` ("." for the folder itself); a path outside it unchanged."""
    root = str(root).rstrip("/")
    if str(path).rstrip("/") == root:
        return "."
    prefix = root + "/"
    return str(path)[len(prefix):] if str(path).startswith(prefix) else str(path)


def _is_absolute(path: str) -> bool:
    return is_remote(path) or path.startswith("/")


def resolve_paths(summary: dict[str, Any], root: str) -> dict[str, Any]:
    """A copy of ``summary`` with its relative path entries joined to the run folder ``root``."""
    resolved = dict(summary)
    for key in PATH_KEYS:
        value = summary.get(key)
        if isinstance(value, str) and not _is_absolute(value):
            resolved[key] = str(root).rstrip("/") if value == "." else join(root, value)
    return resolved


def read_summary(root: str) -> dict[str, Any]:
    """The run folder's summary.json with its paths resolved against ``root`` (a path or a URI)."""
    return resolve_paths(json.loads(read_text(RunLayout(root).summary)), str(root))
