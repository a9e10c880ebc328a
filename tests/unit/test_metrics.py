"""Tests for dapo_core.metrics: entropy, lengths, truncation, accuracy, zero-std groups."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_core.metrics import (
    accuracy,
    entropy_from_logits,
    response_length_stats,
    token_mean_entropy,
    truncation_ratio,
    zero_std_group_fraction,
)


def test_entropy_hand_worked() -> None:
    # Uniform over V = 4 -> ln 4 = 1.386294. One-hot-ish logits [100, 0, 0, 0] -> ~0.
    # Two tokens valid: (ln 4 + ~0) / 2 = 0.693147; the masked token (uniform over 2 of 4) is ignored.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1e9, -1e9]]])
    mask = torch.tensor([[True, True, False]])
    got = token_mean_entropy(logits, mask)
    assert abs(got.item() - math.log(4) / 2) < 1e-6
    # p = [0.5, 0.5, 0, 0] -> entropy ln 2 even with -1e9 logits (no log(0) nan).
    assert abs(entropy_from_logits(logits[0, 2]).item() - math.log(2)) < 1e-6


def test_entropy_chunking_matches_direct_and_matches_distribution_entropy() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=gen)
    mask = torch.rand(3, 7, generator=gen) > 0.3
    direct = torch.distributions.Categorical(logits=logits).entropy()[mask].mean()
    for chunk in (1, 4, 1024):
        assert abs(token_mean_entropy(logits, mask, chunk_tokens=chunk).item() - direct.item()) < 1e-5
    assert token_mean_entropy(logits, torch.zeros(3, 7, dtype=torch.bool)).item() == 0.0
    # bf16 logits are upcast and still agree closely.
    assert abs(token_mean_entropy(logits.bfloat16(), mask).item() - direct.item()) < 2e-2


def test_length_stats_hand_worked() -> None:
    # lengths [2, 4, 8, 10] with cap 8: mean 6, max 10, min 2, 2 of 4 reached the cap -> 0.5.
    s = response_length_stats(torch.tensor([2, 4, 8, 10]), max_response_tokens=8)
    assert {k: v.item() for k, v in s.items()} == {"mean": 6.0, "max": 10.0, "min": 2.0, "clip_ratio": 0.5}
    with pytest.raises(ValueError, match="lengths is empty"):
        response_length_stats(torch.tensor([], dtype=torch.long), 8)


def test_ratios() -> None:
    # 1 of 4 truncated -> 0.25; 3 of 4 correct -> 0.75.
    assert truncation_ratio(torch.tensor([False, True, False, False])).item() == 0.25
    assert accuracy(torch.tensor([True, True, False, True])).item() == 0.75
    with pytest.raises(TypeError, match="correct must be bool"):
        accuracy(torch.tensor([1, 0]))


def test_zero_std_group_fraction() -> None:
    # Groups: 0 -> [1, 1] zero std; 1 -> [1, -1] informative; 2 -> [0.5] singleton (counts as zero std);
    # 3 -> [-1, -1, -1] zero std. 3 of 4 groups -> 0.75.
    rewards = torch.tensor([1.0, 1.0, 1.0, -1.0, 0.5, -1.0, -1.0, -1.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 3, 3, 3])
    assert zero_std_group_fraction(rewards, ids).item() == 0.75
    assert zero_std_group_fraction(rewards, [str(int(i)) for i in ids]).item() == 0.75
