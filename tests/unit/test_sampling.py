"""Tests for dapo_core.sampling: dynamic sampling (paper sec. 3.2, eq. 11)."""

from __future__ import annotations

import pytest
import torch

from dapo_core.sampling import (
    DynamicSamplingAccumulator,
    DynamicSamplingExhaustedError,
    group_filter_reason,
    group_filter_reasons,
)


def test_filter_reasons_by_accuracy() -> None:
    # G = 3: 1 of 3 correct -> kept; 3 of 3 -> all_correct; 0 of 3 -> all_wrong; 2 of 3 -> kept.
    correct = torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]], dtype=torch.bool)
    assert group_filter_reasons(correct) == ["kept", "all_correct", "all_wrong", "kept"]
    assert group_filter_reason(torch.tensor([True, True])) == "all_correct"


def test_filter_reasons_by_std_criterion() -> None:
    # All correct, but soft overlong punishment made rewards [1.0, 0.75] differ -> std > 0 -> kept.
    # All correct with equal rewards [1, 1] -> all_correct. Mixed [1, -1] -> kept.
    correct = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    rewards = torch.tensor([[1.0, 0.75], [1.0, 1.0], [1.0, -1.0]])
    assert group_filter_reasons(correct, rewards, by="reward_std") == ["kept", "all_correct", "kept"]
    assert group_filter_reasons(correct, rewards, by="accuracy") == ["all_correct", "all_correct", "kept"]
    with pytest.raises(ValueError, match="needs rewards"):
        group_filter_reasons(correct, by="reward_std")


def _round(prefix: str, reasons: list[str]) -> list[tuple[str, str, object]]:
    return [(f"{prefix}{i}", r, [i]) for i, r in enumerate(reasons)]


def test_accumulator_keeps_surplus_and_counts_rounds() -> None:
    # Target 4. Round 1: 2 informative of 4 -> 2 held. Round 2: 3 informative of 4 -> 5 held:
    # 4 kept (r1-0, r1-3, r2-0, r2-1), 1 surplus (r2-2) carried to the next step.
    acc = DynamicSamplingAccumulator(target_groups=4, max_rounds=5)
    assert acc.needs_more()
    rep1 = acc.add_round(_round("a", ["kept", "all_correct", "all_wrong", "kept"]))
    assert (rep1.round_index, rep1.generated_groups, rep1.informative_groups) == (1, 4, 2)
    assert rep1.reason_counts == {"kept": 2, "all_correct": 1, "all_wrong": 1}
    assert acc.needs_more()
    acc.add_round(_round("b", ["kept", "kept", "kept", "all_wrong"]))
    assert not acc.needs_more()
    with pytest.raises(RuntimeError, match="already holds"):
        acc.add_round(_round("c", ["kept"]))
    res = acc.finish()
    assert res.outcome == "full" and res.rounds == 2 and res.carried_in == 0
    assert [g for g, _ in res.kept] == ["a0", "a3", "b0", "b1"]
    assert res.surplus == [("b2", [2])]
    assert res.final_reasons == {"a0": "kept", "a1": "all_correct", "a2": "all_wrong", "a3": "kept",
                                 "b0": "kept", "b1": "kept", "b2": "surplus", "b3": "all_wrong"}
    assert [r.informative_groups for r in res.round_reports] == [2, 3]

    # Next step: the surplus comes first; with 1 carried + round of 3 informative -> full in 1 round.
    nxt = DynamicSamplingAccumulator(target_groups=4, max_rounds=5, carried=res.surplus)
    nxt.add_round(_round("c", ["kept", "kept", "kept"]))
    res2 = nxt.finish()
    assert res2.rounds == 1 and res2.carried_in == 1
    assert [g for g, _ in res2.kept] == ["b2", "c0", "c1", "c2"] and res2.surplus == []


def test_carried_surplus_alone_can_fill_the_batch() -> None:
    acc = DynamicSamplingAccumulator(target_groups=2, max_rounds=1, carried=[("x", 1), ("y", 2), ("z", 3)])
    assert not acc.needs_more()
    res = acc.finish()
    assert res.rounds == 0 and [g for g, _ in res.kept] == ["x", "y"] and res.surplus == [("z", 3)]


def test_max_rounds_raise() -> None:
    # Target 3, 2 rounds, 1 informative per round -> 2 < 3 after the budget -> clear exception.
    acc = DynamicSamplingAccumulator(target_groups=3, max_rounds=2, on_max_rounds="raise")
    acc.add_round(_round("a", ["kept", "all_correct"]))
    acc.add_round(_round("b", ["all_wrong", "kept"]))
    assert not acc.needs_more()
    with pytest.raises(DynamicSamplingExhaustedError, match="only 2 of 3 informative groups after max_rounds=2"):
        acc.finish()


def test_max_rounds_train_on_partial() -> None:
    acc = DynamicSamplingAccumulator(target_groups=3, max_rounds=2, on_max_rounds="train_on_partial")
    acc.add_round(_round("a", ["kept", "all_correct"]))
    acc.add_round(_round("b", ["all_wrong", "kept"]))
    with pytest.raises(RuntimeError, match="max_rounds=2 generation rounds already used"):
        acc.add_round(_round("c", ["kept"]))
    res = acc.finish()
    assert res.outcome == "partial" and res.rounds == 2
    assert [g for g, _ in res.kept] == ["a0", "b1"] and res.surplus == []


def test_bad_usage_is_reported() -> None:
    acc = DynamicSamplingAccumulator(target_groups=2, max_rounds=3)
    with pytest.raises(RuntimeError, match="keep generating"):
        acc.finish()
    with pytest.raises(ValueError, match="unknown reason 'surplus'"):
        acc.add_round([("g", "surplus", None)])
    acc2 = DynamicSamplingAccumulator(target_groups=2, max_rounds=3, carried=[("dup", None)])
    with pytest.raises(ValueError, match="duplicate group id 'dup' in generation round 1"):
        acc2.add_round([("dup", "kept", None)])
    with pytest.raises(ValueError, match="on_max_rounds"):
        DynamicSamplingAccumulator(target_groups=2, max_rounds=3, on_max_rounds="ignore")  # type: ignore[arg-type]
