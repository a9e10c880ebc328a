"""Long-lived objects kept out of the cyclic garbage collector's full scans (``gc.freeze``).

A full collection walks every tracked object of the process. In the driver that is the vLLM
engine, the problem pools and every loaded module: none of them becomes garbage while the steps
run, yet each full collection walked them again (~160 ms every third step of the main job, mostly
inside generation). Frozen after a full collection, so no garbage is kept; objects made later are
collected as usual. Thawed when the steps end, so a process running several pipelines frees each.
(The training workers make too few objects between steps to start a full collection: measured,
none after the first step.)
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """Take every object alive now out of the full scans, after collecting what is garbage."""
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Make the frozen objects collectable again."""
    gc.unfreeze()
