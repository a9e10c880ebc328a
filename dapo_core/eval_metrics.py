"""Evaluation metrics over k sampled responses per problem: avg@k, pass@k, maj@k.

The DAPO paper reports avg@32 on AIME 2024: 32 samples per problem at temperature 1.0 and
top_p 0.7, and the score is the mean accuracy over all samples (sec. 4.1). pass@k uses the
unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), so k may be smaller than
the n samples drawn. maj@k is the accuracy of the most frequent answer, counted by the value the
reward judged (so "34", "34.0" and "\\frac{68}{2}" are one vote each for 34, not three answers).
`problem_outcome` gathers all of them for one problem from its k reward verdicts, with the
verifier timeouts and errors counted as training counts them (they score -1 and must be visible).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dapo_core.rewards import Verdict


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

    ``answers[i]`` is sample i's vote (see `vote_key`: the judged value; None when nothing was
    extracted) and
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


@dataclasses.dataclass(frozen=True)
class ProblemOutcome:
    """The evaluation of one problem from its k verdicts (one EvalResult row, less the identifiers)."""

    k: int  # samples judged
    num_correct: int  # of the k
    avg_at_k: float  # num_correct / k
    pass_at_k: bool  # num_correct > 0
    maj_answer: str | None  # most frequent judged value (raw answer when none was judged); None if no answer
    maj_correct: bool  # whether maj_answer is correct
    verdict_timeouts: int  # verifier timeouts among the k (scored -1)
    verdict_errors: int  # verifier errors among the k (scored -1)


def vote_key(verdict: Verdict) -> str | None:
    """What a sample votes for in maj@k: the judged value, else its whitespace-normalised answer.

    Samples without a judged value (hedged, unparsable, timed out) still vote, with their text.
    """
    if verdict.judged_value is not None:
        return verdict.judged_value
    if verdict.extracted_answer is None:
        return None
    return " ".join(verdict.extracted_answer.split()) or None


def problem_outcome(verdicts: Sequence[Verdict]) -> ProblemOutcome:
    """avg@k, pass@k, maj@k (voting on judged values) and verifier failures for one problem's k verdicts."""
    if not verdicts:
        raise ValueError("a problem needs at least one verdict")
    correct = [v.correct for v in verdicts]
    maj_answer, maj_correct = majority_vote([vote_key(v) for v in verdicts], correct)
    num_correct = sum(correct)
    return ProblemOutcome(
        k=len(verdicts),
        num_correct=num_correct,
        avg_at_k=avg_at_k(correct),
        pass_at_k=num_correct > 0,
        maj_answer=maj_answer,
        maj_correct=maj_correct,
        verdict_timeouts=sum(v.status == "timeout" for v in verdicts),
        verdict_errors=sum(v.status == "error" for v in verdicts),
    )
