"""Adaptive round sizes (dapo_core/sampling.py: adaptive_round_prompts, recent_informative_rate) and
the zero-signal count: checked against a slow, obvious reference and by their properties."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.sampling import (
    DynamicSamplingAccumulator,
    RoundReport,
    adaptive_round_prompts,
    recent_informative_rate,
    zero_signal_groups,
)


def reference_round_prompts(needed: int, informative: int, generated: int, max_prompts: int, last_round: bool) -> int:
    """The fewest prompts whose expected informative groups (prompts x rate) reach ``needed``,
    counting up one prompt at a time, never above ``max_prompts``, never below what is needed."""
    if last_round or informative == 0:
        return max_prompts
    rate = Fraction(informative, generated)
    prompts = 1
    while prompts < max_prompts and (prompts * rate < needed or prompts < needed):
        prompts += 1
    return prompts


@st.composite
def round_inputs(draw: st.DrawFn) -> tuple[int, int, int, int, bool]:
    generated = draw(st.integers(1, 3000))
    return (draw(st.integers(1, 600)), draw(st.integers(0, generated)), generated, draw(st.integers(1, 2000)),
            draw(st.booleans()))


@settings(max_examples=400, deadline=None)
@given(args=round_inputs())
def test_adaptive_round_prompts_agrees_with_the_reference(args: tuple[int, int, int, int, bool]) -> None:
    needed, informative, generated, max_prompts, last = args
    assert adaptive_round_prompts(needed, informative, generated, max_prompts, last_round=last) == \
        reference_round_prompts(needed, informative, generated, max_prompts, last)


@settings(max_examples=300, deadline=None)
@given(args=round_inputs(), more=st.integers(0, 500))
def test_round_prompts_properties(args: tuple[int, int, int, int, bool], more: int) -> None:
    needed, informative, generated, max_prompts, last = args
    prompts = adaptive_round_prompts(needed, informative, generated, max_prompts, last_round=last)
    assert 1 <= prompts <= max_prompts  # never above the fixed size
    assert prompts >= min(needed, max_prompts)  # never below what is needed, whatever the rate
    assert adaptive_round_prompts(needed, generated, generated, max_prompts) == min(needed, max_prompts)  # rate 1
    # monotone: a higher rate never draws more, more groups needed never draw fewer
    if informative < generated:
        assert adaptive_round_prompts(needed, informative + 1, generated, max_prompts) <= \
            adaptive_round_prompts(needed, informative, generated, max_prompts)
    assert adaptive_round_prompts(needed + more, informative, generated, max_prompts) >= \
        adaptive_round_prompts(needed, informative, generated, max_prompts)


def test_round_prompts_hand_worked() -> None:
    assert adaptive_round_prompts(64, 2, 3, 96) == 96  # 64 / (2/3) = 96 exactly, no float round-up to 97
    assert adaptive_round_prompts(64, 62, 96, 96) == 96  # ceil(99.1) capped at the fixed size
    assert adaptive_round_prompts(20, 62, 96, 96) == 31  # ceil(20 * 96 / 62) = ceil(30.97)
    assert adaptive_round_prompts(3, 1, 2, 96) == 6
    assert adaptive_round_prompts(3, 1, 2, 96, last_round=True) == 96  # the step's last chance draws the fixed size
    assert adaptive_round_prompts(3, 0, 50, 96) == 96  # nothing informative measured
    assert adaptive_round_prompts(200, 1, 1, 96) == 96
    with pytest.raises(ValueError, match="groups_needed"):
        adaptive_round_prompts(0, 1, 2, 96)
    with pytest.raises(ValueError, match="informative <= generated"):
        adaptive_round_prompts(1, 3, 2, 96)


def _report(informative: int, generated: int) -> RoundReport:
    return RoundReport(round_index=1, generated_groups=generated, informative_groups=informative)


def test_recent_rate_pools_the_newest_rounds_up_to_the_window() -> None:
    rounds = [_report(90, 96), _report(60, 96), _report(50, 96), _report(3, 8)]
    # newest first: 8 groups < 100, + 96 = 104 >= 100: stop (the two oldest are out of the window)
    assert recent_informative_rate(rounds, window_groups=100, prior=(1, 3)) == (53, 104)
    assert recent_informative_rate(rounds, window_groups=8, prior=(1, 3)) == (3, 8)
    assert recent_informative_rate(rounds, window_groups=10_000, prior=(1, 3)) == (203, 296)
    assert recent_informative_rate([], window_groups=100, prior=(64, 96)) == (64, 96)  # before any round


def test_groups_needed_counts_down_to_zero() -> None:
    acc = DynamicSamplingAccumulator(target_groups=3, max_rounds=4, carried=[("c", None)])
    assert acc.groups_needed == 2
    acc.add_round([("a", "kept", None), ("b", "all_wrong", None)])
    assert acc.groups_needed == 1
    acc.add_round([("d", "kept", None), ("e", "kept", None)])
    assert acc.groups_needed == 0 and acc.is_full


def test_zero_signal_groups_are_those_with_all_equal_rewards() -> None:
    keys = ["a", "a", "b", "b", "c", "c", "d", "d"]
    # a: all correct, equal; b: all correct, one penalised (signal); c: all wrong; d: mixed
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.75, -1.0, -1.0, 1.0, -1.0])
    assert zero_signal_groups(keys, rewards) == 2
    assert zero_signal_groups([], torch.zeros(0)) == 0
    with pytest.raises(ValueError, match="group keys"):
        zero_signal_groups(keys, rewards[:3])
