"""Progress of the long loops inside engines (generation, the tiny warm-up), for whoever listens.

`dapo run` draws a progress bar from these reports (workflows/progress.py); with no listener
(a Flyte cluster, tests, `dapo rollout`) a report costs one empty loop. Listeners are called in
the engine's own thread and must be quick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# (label, done, total): e.g. ("generation", 312, 384) requests, ("warm-up", 250, 800) steps
Listener = Callable[[str, int, int], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def listen(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` on every report from now on; returns the function that stops it."""
    with _lock:
        _listeners.append(listener)

    def stop() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return stop


def listening() -> bool:
    """True when someone listens (lets an engine skip the work of measuring progress)."""
    return bool(_listeners)


def report(label: str, done: int, total: int) -> None:
    """``done`` of ``total`` units of the loop named ``label`` are finished."""
    for listener in list(_listeners):
        listener(label, done, total)
