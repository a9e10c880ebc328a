"""95% intervals of dapo_core/intervals.py on hand-worked values."""

import math

import pytest

from dapo_core.intervals import (
    binomial_change,
    mean_interval,
    paired_change,
    t975,
    two_sample_change,
)


def test_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(4) == 2.776 and t975(30) == 2.042 and t975(500) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_mean_interval_hand_worked() -> None:
    # values 1, 2, 3: mean 2, sample sd 1, SE 1/sqrt(3), t(2) = 4.303
    mean, half = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3))
    assert mean_interval([0.4]) == (0.4, None)  # one seed: no spread


def test_paired_change_uses_differences() -> None:
    # differences 0.1, 0.1, 0.1, 0.1: mean 0.1, no spread at all
    change, half = paired_change([0.1, 0.5, 0.2, 0.0], [0.2, 0.6, 0.3, 0.1])
    assert change == pytest.approx(0.1) and half == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="3 values before, 2 after"):
        paired_change([0.1, 0.2, 0.3], [0.1, 0.2])


def test_binomial_change_hand_worked() -> None:
    # 0.25 -> 0.5 on 10 problems x k=2: var = (0.1875 + 0.25) / 20 = 0.021875
    change, half = binomial_change(0.25, 0.5, 10, 2)
    assert change == 0.25 and half == pytest.approx(1.959964 * math.sqrt(0.021875))


def test_two_sample_change() -> None:
    # (0.3, 0.4) vs (0.5, 0.6): change 0.2; var 0.005 each -> SE = sqrt(0.005/2 * 2) = 0.0707; t(1)
    change, half = two_sample_change([0.3, 0.4], [0.5, 0.6])
    assert change == pytest.approx(0.2) and half == pytest.approx(12.706 * math.sqrt(0.005))
    assert two_sample_change([0.3], [0.5, 0.6]) == (pytest.approx(0.25), None)
