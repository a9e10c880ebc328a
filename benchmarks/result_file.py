"""Writing a benchmark's JSON result: whole or not at all.

Imported by the scripts in this folder as ``from result_file import write_result`` (a script's own
folder is first on ``sys.path``). A run stopped while it writes (Ctrl-C, a full disk) leaves the
previous result in place, never half a file that RESULTS.md's tables were read from: the write is
the run store's own atomic one (``storage.run_store.write_text``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage import run_store  # noqa: E402


def write_result(path: str | os.PathLike[str], result: Any) -> Path:
    """Write ``result`` as indented JSON to ``path`` (its folder made if missing); print and return the path."""
    out = Path(path)
    run_store.write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return out
