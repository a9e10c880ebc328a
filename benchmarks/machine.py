"""The machine a benchmark ran on, for the figures in RESULTS.md: its CPU model.

Imported by the scripts in this folder as ``from machine import cpu_model`` (a script's own
folder is first on ``sys.path``).
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` knows, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
