"""Where a benchmark's runs go: the folder the user named (kept), else a temporary one that is
removed when the benchmark ends, even when it fails.

A 150-step main job leaves ~2.4 GB of checkpoints (16 MB a step with the optimizer state), so
five seeds leave 12 GB: left behind in /tmp by every benchmark run, they fill a disk within days.
Imported by the scripts in this folder as ``from scratch import scratch_dir``.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def scratch_dir(keep: str | Path | None, prefix: str) -> Iterator[Path]:
    """``keep`` (created if missing, never removed) or a new temporary folder named ``prefix...``
    that is removed with everything in it when the block ends."""
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)
