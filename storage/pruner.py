"""The retention policy applied after each step on a thread of its own, off the step's path.

Pruning deletes what no later step reads (storage/pruning.py: the checkpoint that just left the
last K), yet it cost the driver ~5 ms a step for the main job's 16 MB on a disk mounted with
online discard, and costs a request per file on an object store. So the driver hands each prune
to one background thread and goes on with the next step. Prunes run one at a time, in step
order: the next waits for the one before and reports its result or re-raises its error, and so
does :meth:`Pruner.close`, which the driver calls before the summary. A crash mid-prune is safe
as before (pruning.py: the record comes first; the next prune deletes what is left).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass

from storage import pruning


@dataclass(frozen=True)
class Pruned:
    """What the prune after ``step`` deleted."""

    step: int
    files: list[str]


class Pruner:
    """Prunes a run's checkpoints by the policy K/M (``keep_optimizer_last`` 0 = never prunes)."""

    def __init__(self, *, keep_optimizer_last: int, keep_weights_every: int, optimizer_state_every: int = 1) -> None:
        self.keep_optimizer_last, self.keep_weights_every = keep_optimizer_last, keep_weights_every
        self.optimizer_state_every = optimizer_state_every  # train.optimizer_state_every: its replay origin is kept
        self._settled: set[int] = set()  # steps whose checkpoint is pruned for good (pruning.apply_retention)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: tuple[int, concurrent.futures.Future[list[str]]] | None = None

    def submit(self, step: int, checkpoint_paths: Mapping[int, str], *, latest: int) -> Pruned | None:
        """Start pruning after ``step`` (``latest``: the current policy's step, kept whole); returns
        what the previous prune deleted, once it is done (its error is raised here)."""
        previous = self.wait()
        if self.keep_optimizer_last == 0:
            return previous
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-prune")
        future = self._pool.submit(pruning.apply_retention, dict(checkpoint_paths), latest=latest,
                                   keep_optimizer_last=self.keep_optimizer_last,
                                   keep_weights_every=self.keep_weights_every,
                                   optimizer_state_every=self.optimizer_state_every, settled=self._settled)
        self._pending = (step, future)
        return previous

    def wait(self) -> Pruned | None:
        """Wait for the prune under way, if any: what it deleted (its error is raised here)."""
        if self._pending is None:
            return None
        (step, future), self._pending = self._pending, None
        return Pruned(step, future.result())

    def close(self) -> Pruned | None:
        """Wait for the last prune and stop the thread."""
        try:
            return self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


__all__ = ["Pruned", "Pruner"]
