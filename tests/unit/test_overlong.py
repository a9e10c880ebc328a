"""Tests for dapo_core.overlong: soft overlong punishment (eq. 13) and overlong filtering (sec. 3.4)."""

from __future__ import annotations

import pytest
import torch

from dapo_core.overlong import (
    overlong_filter_mask,
    soft_overlong_penalty,
    soft_overlong_penalty_reference,
)


def test_eq13_at_the_edges_with_paper_lengths() -> None:
    # Paper setting: L_max = 20480, L_cache = 4096, so the ramp starts at 16384.
    #   |y| = 16384 (= L_max - L_cache): first case, 0.
    #   |y| = 16385: (16384 - 16385) / 4096 = -0.000244140625.
    #   |y| = 18432 (mid-buffer): (16384 - 18432) / 4096 = -0.5.
    #   |y| = 20480 (= L_max): (16384 - 20480) / 4096 = -1 (second case; continuous with the third).
    #   |y| = 20481 (just past L_max): third case, -1.
    #   |y| = 100: 0.
    lengths = torch.tensor([16384, 16385, 18432, 20480, 20481, 100])
    got = soft_overlong_penalty(lengths, max_tokens=20480, buffer_tokens=4096)
    expected = torch.tensor([0.0, -1 / 4096, -0.5, -1.0, -1.0, 0.0])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


def test_factor_scales_and_small_numbers() -> None:
    # L_max = 10, L_cache = 4, factor 0.5: start 6. |y| = 6 -> 0; 7 -> (6-7)/4*0.5 = -0.125;
    # 9 -> (6-9)/4*0.5 = -0.375; 10 -> -0.5; 12 -> -0.5.
    got = soft_overlong_penalty(torch.tensor([6, 7, 9, 10, 12]), max_tokens=10, buffer_tokens=4, factor=0.5)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.125, -0.375, -0.5, -0.5]))


def test_vectorised_matches_case_by_case_reference() -> None:
    lengths = torch.arange(0, 140)
    for buffer in (1, 7, 32, 128):
        fast = soft_overlong_penalty(lengths, max_tokens=128, buffer_tokens=buffer, factor=0.7)
        slow = soft_overlong_penalty_reference(lengths, max_tokens=128, buffer_tokens=buffer, factor=0.7)
        torch.testing.assert_close(fast, slow, rtol=0, atol=1e-7)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="buffer_tokens"):
        soft_overlong_penalty(torch.tensor([1]), max_tokens=10, buffer_tokens=11)
    with pytest.raises(ValueError, match="buffer_tokens"):
        soft_overlong_penalty(torch.tensor([1]), max_tokens=10, buffer_tokens=0)
    with pytest.raises(ValueError, match="row 1 is -3"):
        soft_overlong_penalty(torch.tensor([1, -3]), max_tokens=10, buffer_tokens=2)
    with pytest.raises(TypeError, match="integer"):
        soft_overlong_penalty(torch.tensor([1.5]), max_tokens=10, buffer_tokens=2)


def test_overlong_filter_mask_drops_truncated_rows() -> None:
    # Row 0 not truncated: mask kept as is. Row 1 truncated: all False. Row 2 not truncated.
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    truncated = torch.tensor([False, True, False])
    out = overlong_filter_mask(truncated, mask)
    assert out.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    assert mask.sum() == 6  # input untouched
    with pytest.raises(ValueError, match="truncated has 2 rows but mask has 3"):
        overlong_filter_mask(torch.tensor([True, False]), mask)
    with pytest.raises(TypeError, match="truncated must be a 1-D bool"):
        overlong_filter_mask(torch.tensor([1, 0, 0]), mask)
