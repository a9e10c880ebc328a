"""What is alive when the steps begin is frozen out of the garbage collector's scans
(engines/runtime/gc_heap.py, called by the driver), collecting first so that no garbage is frozen with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# In a process of its own: frozen objects stay for the life of the process.
_SCRIPT = """
import gc, weakref
from engines.runtime.gc_heap import freeze_long_lived
class Node:
    pass
gc.disable()  # only the call under test collects
garbage = Node(); garbage.self = garbage
dropped = weakref.ref(garbage); del garbage  # a cycle no one reaches any more
kept = Node(); kept.self = kept  # alive
freeze_long_lived()
print("garbage collected", dropped() is None)
print("kept frozen", gc.get_freeze_count() > 0 and not any(o is kept for o in gc.get_objects()))
"""


def test_the_garbage_is_collected_and_what_lives_is_frozen() -> None:
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=repo, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-2:] == ["garbage collected True", "kept frozen True"], proc.stdout
