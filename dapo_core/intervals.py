"""95% intervals for the numbers the reports print: a held-out accuracy, its change, a mean over seeds.

The paper reports avg@32 on AIME (sec. 4.1) as one number; a run report needs to say how far the
change could be noise. Three cases, each a plain formula (no scipy):

- ``paired_change``: the same problems evaluated before and after training; the interval of the
  mean per-problem difference (Student t over problems). The tightest honest interval.
- ``binomial_change``: only avg@k, the problem count n and k are known; each evaluation is
  treated as n * k independent Bernoulli draws (SE^2 = p (1 - p) / (n k)) and the two as
  independent. It ignores that samples of one problem are correlated, so it is too narrow when
  problems differ in difficulty; reports say so when they fall back to it.
- ``mean_interval`` / ``two_sample_change``: a mean over seeds and the change between two rungs
  (Welch's SE with the smaller sample's degrees of freedom, conservative). ``None`` for the
  half-width when there are too few values for a spread (one seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, df = 1..30; beyond that the normal 1.96.
_T975 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]
Z975 = 1.959964


def t975(df: int) -> float:
    """t_{0.975, df}: the 95% two-sided quantile of Student's t (1.96 for df > 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else Z975


def _sample_var(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def mean_interval(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, 95% half-width) of ``values``; half-width ``None`` with fewer than 2 values."""
    if not values:
        raise ValueError("mean_interval of no values")
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, t975(len(values) - 1) * math.sqrt(_sample_var(values) / len(values))


def paired_change(before: Sequence[float], after: Sequence[float]) -> tuple[float, float | None]:
    """(mean of after - before, 95% half-width) over paired values (e.g. per-problem avg@k)."""
    if len(before) != len(after):
        raise ValueError(f"paired_change: {len(before)} values before, {len(after)} after")
    return mean_interval([a - b for a, b in zip(after, before)])


def binomial_change(p_before: float, p_after: float, problems: int, k: int) -> tuple[float, float]:
    """(p_after - p_before, 95% half-width) treating each avg@k as ``problems * k`` independent draws."""
    draws = problems * k
    if draws < 1:
        raise ValueError(f"binomial_change needs problems * k >= 1, got {problems} * {k}")
    var = (p_before * (1 - p_before) + p_after * (1 - p_after)) / draws
    return p_after - p_before, Z975 * math.sqrt(var)


def two_sample_change(reference: Sequence[float], other: Sequence[float]) -> tuple[float, float | None]:
    """(mean(other) - mean(reference), 95% half-width); ``None`` unless both have 2+ values."""
    change = sum(other) / len(other) - sum(reference) / len(reference)
    if len(reference) < 2 or len(other) < 2:
        return change, None
    se = math.sqrt(_sample_var(reference) / len(reference) + _sample_var(other) / len(other))
    return change, t975(min(len(reference), len(other)) - 1) * se
