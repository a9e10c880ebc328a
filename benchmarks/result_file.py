"""Writing a benchmark's JSON result: whole or not at all.

Imported by the scripts in this folder as ``from result_file import write_result`` (a script's own
folder is first on ``sys.path``). A run stopped while it writes (Ctrl-C, a full disk) leaves the
previous result in place, never half a file that RESULTS.md's tables were read from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_result(path: str | os.PathLike[str], result: Any) -> Path:
    """Write ``result`` as indented JSON to ``path`` (its folder made if missing) through a temporary
    file renamed into place; print and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    temp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(temp, out)
    print(f"wrote {out}")
    return out
