"""avg@k, pass@k (unbiased estimator) and maj@k on hand-made samples."""

import math

import pytest

from dapo_core.eval_metrics import avg_at_k, majority_vote, pass_at_k


def test_avg_at_k_is_mean_accuracy() -> None:
    # 3 of 4 correct -> 3/4 = 0.75
    assert avg_at_k([True, False, True, True]) == 0.75
    assert avg_at_k([]) == 0.0


def test_pass_at_k_hand_worked() -> None:
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 reduces to c/n: 2/5 = 0.4
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    # n - c < k: some correct sample is always in the draw -> 1
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0


def test_pass_at_k_matches_combinations() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 - (math.comb(n - c, k) / math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k"):
        pass_at_k(3, 1, 4)


def test_majority_vote_picks_most_frequent_answer() -> None:
    # "12" twice (both right), "13" once -> majority "12", correct
    assert majority_vote(["12", "13", "12"], [True, False, True]) == ("12", True)
    # "7" twice (wrong), "8" once (right) -> majority "7", not correct
    assert majority_vote(["7", "8", " 7 "], [False, True, False]) == ("7", False)


def test_majority_vote_ties_go_to_first_seen_and_missing_answers_are_ignored() -> None:
    # 1 vote each for "5" and "6": "5" came first
    assert majority_vote([None, "5", "6"], [False, False, True]) == ("5", False)
    assert majority_vote([None, ""], [False, False]) == (None, False)
    with pytest.raises(ValueError, match="length"):
        majority_vote(["1"], [True, False])


def test_maj_at_k_votes_on_the_judged_value_not_the_raw_string() -> None:
    from dapo_core.eval_metrics import problem_outcome
    from dapo_core.rewards import score_responses
    from engines.score.verifier_pool import process_judge, shutdown_verifier_pool

    # "34", "34.0" and 68/2 are one value (3 votes, correct); "35" has 2 votes. Voting on the raw
    # strings would split 34 three ways and elect the wrong "35".
    responses = ["Answer: 35", "Answer: 34", "Answer: 34.0", "Answer: \\frac{68}{2}", "Answer: 35"]
    try:
        verdicts = score_responses(responses, [34] * len(responses), timeout_s=20.0, judge=process_judge(1))
    finally:
        shutdown_verifier_pool()
    outcome = problem_outcome(verdicts)
    assert (outcome.maj_answer, outcome.maj_correct) == ("34", True)
    # 3 of 5 correct: avg@5 = 0.6
    assert (outcome.k, outcome.num_correct, outcome.avg_at_k, outcome.pass_at_k) == (5, 3, 0.6, True)


def test_problem_outcome_counts_verifier_timeouts_and_errors() -> None:
    from dapo_core.eval_metrics import problem_outcome
    from dapo_core.rewards import Verdict

    verdicts = [
        Verdict(1.0, True, "ok", "7", "correct", judged_value="7"),
        Verdict(-1.0, False, "timeout", "9^{9^{9}}", "timeout", "too slow"),
        Verdict(-1.0, False, "error", "x", "error", "worker died"),
        Verdict(-1.0, False, "error", "y", "error", "worker died"),
    ]
    outcome = problem_outcome(verdicts)
    # 1 timeout, 2 errors; 1 of 4 correct
    assert (outcome.verdict_timeouts, outcome.verdict_errors) == (1, 2)
    assert (outcome.num_correct, outcome.avg_at_k) == (1, 0.25)
    # Unjudged samples have no judged value and vote with their raw text: four answers with one
    # vote each, and the tie goes to the first seen, "7".
    assert (outcome.maj_answer, outcome.maj_correct) == ("7", True)
