"""Problem draws for generation rounds: deterministic, without replacement within an epoch."""

import pytest

from workflows.problem_order import draw_problems
from workflows.seeds import derive_seed


def test_draws_cover_each_epoch_once_and_are_reproducible() -> None:
    ids = [f"p{i}" for i in range(5)]
    first = draw_problems(ids, seed=3, start=0, count=5)
    assert sorted(first) == ids  # one epoch = every problem exactly once
    # positions 5..9 are the second epoch: again every problem once, in another order
    second = draw_problems(ids, seed=3, start=5, count=5)
    assert sorted(second) == ids
    # drawing 0..9 at once equals the two halves: rounds can resume at any cursor
    assert draw_problems(ids, seed=3, start=0, count=10) == first + second
    assert draw_problems(list(reversed(ids)), seed=3, start=0, count=5) == first  # input order irrelevant


def test_another_seed_gives_another_order() -> None:
    ids = [f"p{i}" for i in range(50)]
    assert draw_problems(ids, seed=1, start=0, count=50) != draw_problems(ids, seed=2, start=0, count=50)


def test_empty_pool_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no training problems"):
        draw_problems([], seed=0, start=0, count=1)


def test_derived_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(0, "rollout", 1, 0) == derive_seed(0, "rollout", 1, 0)
    seeds = {derive_seed(0, "rollout", step, rnd) for step in range(10) for rnd in range(4)}
    assert len(seeds) == 40
    assert 0 <= derive_seed(7, "eval", 3) < 2**31
