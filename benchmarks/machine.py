"""The machine a benchmark ran on, for the figures in RESULTS.md: its CPU model.

Imported by the scripts in this folder as ``from machine import cpu_model`` (a script's own
folder is first on ``sys.path``).
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name with its family, model and stepping (/proc/cpuinfo), else what
    ``platform`` knows, else "unknown".

    A virtual machine may report only "AMD EPYC": the family/model numbers tell its generations
    apart (e.g. family 25 model 17 is Zen 4), and CPU numerics, so a tiny warm-up's weights, differ
    between them.
    """
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if "model name" in fields:
            ids = ", ".join(f"{k.replace('cpu ', '')} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
            return f"{fields['model name']} ({ids})" if ids else fields["model name"]
    except OSError:
        pass
    return platform.processor() or "unknown"
