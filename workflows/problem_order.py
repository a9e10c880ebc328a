"""The order in which training problems are drawn for generation rounds.

What the order guarantees (tests/unit/test_problem_order.py, tests/unit/test_step_loop_sim.py):

* **Each problem once per epoch.** A problem's i-th draw is served for epoch i, and epoch i+1
  starts only when epoch i has nothing left that may be drawn. Where no problem had to be
  deferred, the stream of draws cut into pieces of ``n`` (the pool size) is a permutation of
  the pool, piece after piece.
* **No problem twice within one step.** A draw names the problems that are live in the step
  (drawn by its earlier rounds, or carried into it as surplus groups); none of them is drawn.
  The problems still to be served form one queue of ``(problem, epoch)`` entries; a draw takes
  the first entries whose problems are not live and leaves live ones in place, to be served as
  soon as they are not. When the queue holds nothing drawable, the next epoch is appended: a
  fresh seeded shuffle of the pool, with the problems live at that moment at its end. A draw
  can therefore fail only when the whole pool is live or requested, which
  :func:`check_pool_size` rules out before any work.
* **Replayable.** The order depends only on the problem ids, the seed and the sequence of
  draws (counts and live sets). The driver replays its loop over cached tasks on a re-run or
  resume, so it asks the same questions and gets the same answers, at any step.

The earlier design served positions of an endless sequence of independent per-epoch shuffles;
a request that crossed an epoch boundary could take a problem from the end of one epoch and
again from the start of the next (rollout ids collide, the run dies), for about half of all
seeds within 20 steps of the tiny config and at the first boundary at paper scale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence


class PoolTooSmallError(ValueError):
    """The training split holds fewer problems than one step may need; names the numbers."""


def _shuffled(problem_ids: Sequence[str], seed: int, epoch: int) -> list[str]:
    # Sort by a keyed hash rather than random.shuffle: stable across Python versions.
    def key(pid: str) -> str:
        return hashlib.sha256(f"{seed}|{epoch}|{pid}".encode()).hexdigest()

    return sorted(problem_ids, key=key)


def problems_per_step_max(prompts_per_step: int, prompts_per_round: int, max_rounds: int) -> int:
    """The most distinct problems one step can hold: carried surplus plus every round's draws.

    A step generates only while it holds fewer than ``prompts_per_step`` informative groups,
    and surplus is always smaller than one round (it is what the last round brought beyond the
    target), so at most ``min(prompts_per_step, prompts_per_round) - 1`` carried problems share
    a step with ``max_rounds * prompts_per_round`` drawn ones.
    """
    return max_rounds * prompts_per_round + min(prompts_per_step, prompts_per_round) - 1


def check_pool_size(pool_size: int, *, prompts_per_step: int, prompts_per_round: int, max_rounds: int) -> None:
    """Raise :class:`PoolTooSmallError` when the pool cannot serve a worst-case step without repeats."""
    need = problems_per_step_max(prompts_per_step, prompts_per_round, max_rounds)
    if pool_size < need:
        raise PoolTooSmallError(
            f"the training split has {pool_size} problems, but one step may need {need} distinct ones "
            f"(run.max_rounds={max_rounds} x run.prompts_per_round={prompts_per_round} drawn, plus up to "
            f"{need - max_rounds * prompts_per_round} carried surplus groups): give more training problems, "
            "or lower run.max_rounds or run.prompts_per_round"
        )


class ProblemOrder:
    """Draws problems epoch after epoch, never one that is live in the current step."""

    def __init__(self, problem_ids: Sequence[str], *, seed: int) -> None:
        if not problem_ids:
            raise ValueError("no training problems to draw from (is the train split empty?)")
        self._pool = sorted(set(problem_ids))
        self._seed = seed
        self.epochs_started = 0
        # What is still to be served, in draw order: (problem id, epoch). A live problem met
        # here is deferred (left in place); later entries are served past it.
        self._queue: list[tuple[str, int]] = []
        self._next = 0

    @property
    def pool_size(self) -> int:
        return len(self._pool)

    def _append_epoch(self, live: Collection[str]) -> None:
        epoch = self.epochs_started
        self.epochs_started += 1
        order = _shuffled(self._pool, self._seed, epoch)
        self._queue = self._queue[self._next:]  # forget what was served
        self._next = 0
        self._queue += [(p, epoch) for p in order if p not in live] + [(p, epoch) for p in order if p in live]

    def draw(self, count: int, live: Collection[str] = ()) -> list[str]:
        """The next ``count`` problems; none of them in ``live`` (the step's problems so far)."""
        return [pid for pid, _ in self.draw_with_epochs(count, live)]

    def draw_with_epochs(self, count: int, live: Collection[str] = ()) -> list[tuple[str, int]]:
        """``draw``, with the epoch each problem is served for (a problem's i-th draw is epoch i's).

        Raises :class:`PoolTooSmallError` when every problem of the pool is live or requested
        (a step larger than :func:`check_pool_size` allows).
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        blocked = set(live)
        if len(blocked) + count > self.pool_size and count:
            raise PoolTooSmallError(
                f"a step would draw a problem twice: {count} requested with {len(blocked)} live "
                f"in a pool of {self.pool_size} problems"
            )
        taken: list[tuple[str, int]] = []
        while len(taken) < count:
            position = self._next
            while position < len(self._queue) and self._queue[position][0] in blocked:
                position += 1  # deferred: live in this step
            if position == len(self._queue):
                self._append_epoch(blocked)
                continue
            entry = self._queue.pop(position)
            self._queue.insert(self._next, entry)  # deferred entries keep their order behind it
            self._next += 1
            taken.append(entry)
            blocked.add(entry[0])
        return taken


__all__ = ["PoolTooSmallError", "ProblemOrder", "check_pool_size", "problems_per_step_max"]
