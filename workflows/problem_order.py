"""The order in which training problems are drawn for generation rounds.

Problems are drawn without replacement from a seeded shuffle of the training split, epoch
after epoch (each epoch its own shuffle). The order depends only on the problem ids and the
seed, so a re-run of the driver draws exactly the same prompts for every round, which is what
makes every rollout task a cache hit on re-run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _shuffled(problem_ids: Sequence[str], seed: int, epoch: int) -> list[str]:
    # Sort by a keyed hash rather than random.shuffle: stable across Python versions.
    def key(pid: str) -> str:
        return hashlib.sha256(f"{seed}|{epoch}|{pid}".encode()).hexdigest()

    return sorted(problem_ids, key=key)


def draw_problems(problem_ids: Sequence[str], *, seed: int, start: int, count: int) -> list[str]:
    """The ``count`` problems at positions ``start .. start+count-1`` of the endless order.

    Position p lies in epoch ``p // len(problem_ids)``. Raises ValueError for an empty pool.
    """
    if not problem_ids:
        raise ValueError("no training problems to draw from (is the train split empty?)")
    if count < 0 or start < 0:
        raise ValueError(f"start and count must be >= 0, got start={start}, count={count}")
    unique = sorted(set(problem_ids))
    n = len(unique)
    out: list[str] = []
    epoch_cache: dict[int, list[str]] = {}
    for position in range(start, start + count):
        epoch = position // n
        if epoch not in epoch_cache:
            epoch_cache[epoch] = _shuffled(unique, seed, epoch)
        out.append(epoch_cache[epoch][position % n])
    return out
