"""Evaluation metrics over k sampled responses per problem: avg@k, pass@k, maj@k.

The DAPO paper reports avg@32 on AIME 2024: 32 samples per problem at temperature 1.0 and
top_p 0.7, and the score is the mean accuracy over all samples (sec. 4.1). pass@k uses the
unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), so k may be smaller than
the n samples drawn. maj@k is the accuracy of the most frequent extracted answer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def avg_at_k(correct: Sequence[bool]) -> float:
    """Mean accuracy of the n samples of one problem (avg@n); 0.0 for no samples."""
    if not correct:
        return 0.0
    return sum(bool(c) for c in correct) / len(correct)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k).

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    n, c = num_samples, num_correct
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= num_correct <= num_samples, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= num_samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # Product form of C(n-c, k) / C(n, k), stable for large n.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """The most frequent non-empty answer and whether it is correct (maj@k for one problem).

    ``answers[i]`` is sample i's extracted answer (None when nothing was extracted) and
    ``correct[i]`` its verdict. Ties go to the answer that appeared first, so the result does
    not depend on dict ordering. Returns ``(None, False)`` when no sample has an answer.
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} vs {len(correct)}")
    present = [a.strip() for a in answers if a is not None and a.strip()]
    if not present:
        return None, False
    counts = Counter(present)
    first_seen = {a: i for i, a in reversed(list(enumerate(present)))}
    winner = max(counts, key=lambda a: (counts[a], -first_seen[a]))
    # The winner is correct if any sample that gave exactly this answer was judged correct.
    winner_correct = any(
        ok for a, ok in zip(answers, correct) if a is not None and a.strip() == winner
    )
    return winner, winner_correct
