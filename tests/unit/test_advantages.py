"""Tests for dapo_core.advantages: group-relative advantages (paper eq. 9)."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_core.advantages import (
    dense_group_index,
    group_advantages,
    group_advantages_reference,
)


def test_hand_worked_group_of_four_and_pair() -> None:
    # Group 0: rewards [1, 1, -1, -1]: mean 0; unbiased var = (1+1+1+1)/3 = 4/3, std = 1.1547005;
    #   A = +-1 / (1.1547005 + 1e-6) = +-0.8660247.
    # Group 1: rewards [1, -1]: mean 0; var = (1+1)/1 = 2, std = 1.4142136; A = +-0.7071064.
    rewards = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, ids)
    s4 = math.sqrt(4 / 3) + 1e-6
    s2 = math.sqrt(2) + 1e-6
    expected = torch.tensor([1 / s4, 1 / s4, -1 / s4, -1 / s4, 1 / s2, -1 / s2])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_zero_variance_group_gets_zero_and_singleton_gets_zero() -> None:
    # Group "a" all correct: every R_i equals the mean -> 0 / (0 + eps) = 0.
    # Group "b" is a single response: no sibling to compare with -> 0 by definition.
    # Group "c": [0.5, -0.5] -> mean 0, std sqrt(0.5) = 0.7071068 -> A = +-0.5/0.7071078 = +-0.7071058.
    rewards = torch.tensor([1.0, 1.0, 1.0, 3.0, 0.5, -0.5])
    adv = group_advantages(rewards, ["a", "a", "a", "b", "c", "c"])
    s = math.sqrt(0.5) + 1e-6
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5 / s, -0.5 / s]), rtol=0, atol=1e-6)


def test_mean_only_dr_grpo() -> None:
    # Group [2, 0, 1]: mean 1 -> A = [1, -1, 0] with no std division. Singleton [5] -> 0.
    rewards = torch.tensor([2.0, 0.0, 1.0, 5.0])
    adv = group_advantages(rewards, torch.tensor([7, 7, 7, 9]), normalize_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_interleaved_non_contiguous_ids() -> None:
    # Group 10 = rows 0, 2 with rewards [3, 1]: mean 2, std sqrt(2) -> [+1, -1]/sqrt(2).
    # Group -4 = rows 1, 3 with rewards [0, 0] -> [0, 0].
    rewards = torch.tensor([3.0, 0.0, 1.0, 0.0])
    adv = group_advantages(rewards, torch.tensor([10, -4, 10, -4]), eps=0.0)
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(adv, torch.tensor([r, 0.0, -r, 0.0]))


@pytest.mark.parametrize("normalize_by_std", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_vectorised_matches_reference_on_random_inputs(seed: int, normalize_by_std: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = 97
    ids = torch.randint(0, 13, (n,), generator=gen)
    # Mix binary and continuous rewards so some groups have zero variance.
    rewards = torch.where(torch.rand(n, generator=gen) < 0.5, torch.randn(n, generator=gen, dtype=torch.float64),
                          torch.randint(0, 2, (n,), generator=gen).double() * 2 - 1)
    fast = group_advantages(rewards, ids, normalize_by_std=normalize_by_std)
    slow = group_advantages_reference(rewards, ids, normalize_by_std=normalize_by_std)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    # Same partition given as strings must give the same answer.
    as_str = [f"p{int(i)}" for i in ids]
    torch.testing.assert_close(group_advantages(rewards, as_str, normalize_by_std=normalize_by_std), fast)


def test_standardised_groups_have_zero_mean_unit_std() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(8 * 16, generator=gen, dtype=torch.float64)
    ids = torch.arange(8).repeat_interleave(16)
    adv = group_advantages(rewards, ids, eps=0.0).view(8, 16)
    torch.testing.assert_close(adv.mean(dim=1), torch.zeros(8, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(adv.std(dim=1), torch.ones(8, dtype=torch.float64), atol=1e-12, rtol=0)


def test_dense_group_index_first_seen_order() -> None:
    index, n = dense_group_index(["b", "a", "b", "c"], 4)
    assert n == 3 and index.tolist() == [0, 1, 0, 2]


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="group_ids has 2 entries but rewards has 3"):
        group_advantages(torch.zeros(3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="row 1 is nan"):
        group_advantages(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(TypeError, match="integer dtype"):
        group_advantages(torch.zeros(2), torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="floating-point"):
        group_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), torch.tensor([0, 0]))


def test_the_registry_names_the_estimators_the_configs_select() -> None:
    from dapo_core.advantages import ADVANTAGE_ESTIMATORS, estimate_advantages
    from settings.score import ScoreConfig

    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    ids = [0, 0, 0, 1, 1, 1]
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "dr-grpo"}
    torch.testing.assert_close(estimate_advantages(ScoreConfig().advantage_estimator, rewards, ids),
                               group_advantages(rewards, ids))
    dr = estimate_advantages(ScoreConfig(normalize_advantage_by_std=False).advantage_estimator, rewards, ids)
    torch.testing.assert_close(dr, torch.tensor([4 / 3, -2 / 3, -2 / 3, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="must be one of"):
        estimate_advantages("ppo", rewards, ids)
