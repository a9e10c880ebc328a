"""storage/retention_policy.py: which parts of which checkpoint a retention policy keeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.retention_policy import Keep, checkpoint_retention


def kept(plan: dict[int, Keep], part: str) -> list[int]:
    return sorted(step for step, keep in plan.items() if getattr(keep, part))


def test_defaults_keep_every_checkpoint_whole() -> None:
    plan = checkpoint_retention(range(0, 8), latest=7, keep_optimizer_last=0, keep_weights_every=0)
    assert all(keep.weights and keep.optimizer_state for keep in plan.values())


def test_last_two_whole_every_fifth_weights_step_zero_and_latest_by_hand() -> None:
    # steps 0..12, K=2, M=5: whole = 0 (step-0 policy), 11, 12 (the last two, 12 the latest);
    # weights only = 5, 10; nothing kept of 1-4, 6-9.
    plan = checkpoint_retention(range(0, 13), latest=12, keep_optimizer_last=2, keep_weights_every=5)
    assert kept(plan, "optimizer_state") == [0, 11, 12]
    assert kept(plan, "weights") == [0, 5, 10, 11, 12]
    assert plan[3] == Keep(weights=False, optimizer_state=False)


def test_last_k_counts_checkpoints_not_step_numbers() -> None:
    # Skipped steps publish no checkpoint: the last 2 checkpoints are steps 4 and 9, not 8 and 9.
    plan = checkpoint_retention([0, 1, 4, 9], latest=9, keep_optimizer_last=2, keep_weights_every=0)
    assert kept(plan, "optimizer_state") == [0, 4, 9]
    assert kept(plan, "weights") == [0, 1, 4, 9]


def test_steps_after_the_latest_and_a_missing_latest_are_refused() -> None:
    with pytest.raises(ValueError, match="latest"):
        checkpoint_retention([0, 1, 2], latest=3, keep_optimizer_last=1, keep_weights_every=0)
    with pytest.raises(ValueError, match="after the latest"):
        checkpoint_retention([0, 1, 2], latest=1, keep_optimizer_last=1, keep_weights_every=0)
    with pytest.raises(ValueError, match="keep_optimizer_last"):
        checkpoint_retention([0, 1], latest=1, keep_optimizer_last=-1, keep_weights_every=0)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.sets(st.integers(min_value=1, max_value=400), max_size=60),
    k=st.integers(min_value=0, max_value=6),
    m=st.integers(min_value=0, max_value=50),
)
def test_latest_and_step_zero_are_whole_and_kept_counts_are_bounded(steps: set[int], k: int, m: int) -> None:
    all_steps = sorted({0, *steps})
    latest = all_steps[-1]
    plan = checkpoint_retention(all_steps, latest=latest, keep_optimizer_last=k, keep_weights_every=m)
    assert set(plan) == set(all_steps)
    assert plan[latest] == Keep(weights=True, optimizer_state=True)
    assert plan[0] == Keep(weights=True, optimizer_state=True)
    # optimizer state without its weights resumes nothing: never kept alone
    assert all(keep.weights for keep in plan.values() if keep.optimizer_state)
    trained = [s for s in all_steps if s > 0]
    if k:
        assert len([s for s in kept(plan, "optimizer_state") if s > 0]) == min(k, len(trained))
        weights_bound = 1 + k + (latest // m if m else len(trained))
        assert len(kept(plan, "weights")) <= weights_bound
        # the kept optimizer states are the newest ones
        assert [s for s in kept(plan, "optimizer_state") if s > 0] == trained[-k:]
    else:
        assert kept(plan, "optimizer_state") == all_steps
    if m and k:
        assert all(s % m == 0 or s in trained[-k:] for s in kept(plan, "weights") if s > 0)


def test_state_written_every_fifth_step_keeps_the_newest_that_has_it_whole() -> None:
    # train.optimizer_state_every=5, K=2: after step 7 a cold start replays steps 6-7 from step 5's state,
    # so step 5 stays whole; step 0 and the last two as before.
    plan = checkpoint_retention(range(0, 8), latest=7, keep_optimizer_last=2, keep_weights_every=0,
                                optimizer_state_every=5)
    assert kept(plan, "optimizer_state") == [0, 5, 6, 7]
    # A skipped step 10 published nothing: the origin is step 5 still.
    plan = checkpoint_retention([0, 5, 6, 9, 11, 12], latest=12, keep_optimizer_last=1, keep_weights_every=0,
                                optimizer_state_every=5)
    assert kept(plan, "optimizer_state") == [0, 5, 12]


@given(
    steps=st.sets(st.integers(1, 60), min_size=1, max_size=25),
    k=st.integers(0, 6),
    m=st.integers(0, 7),
    every=st.integers(1, 8),
)
@settings(max_examples=200, deadline=None)
def test_the_replay_origin_is_whole_and_every_1_is_the_policy_without_it(steps: set[int], k: int, m: int,
                                                                          every: int) -> None:
    all_steps, latest = {0, *steps}, max(steps)
    plan = checkpoint_retention(all_steps, latest=latest, keep_optimizer_last=k, keep_weights_every=m,
                                optimizer_state_every=every)
    origin = max((s for s in all_steps if s % every == 0), default=0)  # step 0 when no trained step has state
    assert plan[origin].optimizer_state and plan[origin].weights
    without = checkpoint_retention(all_steps, latest=latest, keep_optimizer_last=k, keep_weights_every=m)
    assert checkpoint_retention(all_steps, latest=latest, keep_optimizer_last=k, keep_weights_every=m,
                                optimizer_state_every=1) == without
    assert [s for s in plan if plan[s] != without[s]] in ([], [origin])  # nothing else changes
