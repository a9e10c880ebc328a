"""Tests for the rule reward (eq. 7): answer extraction, math-verify judging, hedging, timeouts, the pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from dapo_core import rewards
from dapo_core.answer_extraction import (
    ANSWER_WINDOW_CHARS,
    extract_answer,
    gold_integer,
    integer_value,
    last_boxed_content,
    looks_hedged,
    strip_thousands_separators,
)
from dapo_core.rewards import (
    REWARD_VERSION,
    Verdict,
    judge_here,
    judge_in_process,
    score_response,
    score_responses,
    summarize_verdicts,
)
from engines.score import verifier_pool
from engines.score.verifier_pool import (
    process_judge,
    shutdown_verifier_pool,
    verifier_pool_stats,
)

# What the pipeline's scoring and evaluation pass (engines/score/verifier_pool.py).
POOL = process_judge()

# Generous: a loaded 2-core CI machine can be slow, and these tests are about verdicts, not speed.
TIMEOUT_S = 20.0
# A deadline that works ends a runaway within ~1-2 s on a quiet machine and 5-11 s at load 10; one
# that does not never ends it (the runaways below spin or sleep for an hour). The timing checks
# only tell those apart, so they allow a loaded CI machine plenty.
LATE_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def _pool_per_module() -> Iterator[None]:
    yield
    shutdown_verifier_pool()


# ---------------------------------------------------------------- extraction (pure functions)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Let me think.\n2 * 17 = 34\nAnswer: 34", "34"),
        ("Answer: 34.", "34"),  # final period dropped
        ("**Answer:** 34", "34"),  # markdown bold around the label
        ("Answer: $\\frac{68}{2}$", "\\frac{68}{2}"),
        ("Answer: \\boxed{34}", "34"),
        ("answer:\n34", "34"),  # value on the next line
        ("Answer: 12\nwait, no.\nAnswer: 13", "13"),  # the last Answer: wins
        ("so \\boxed{\\frac{1}{2}}\nthen \\boxed{\\frac{68}{2}}", "\\frac{68}{2}"),  # last box, nested braces
        ("so \\boxed{\\frac{1}{2}} then \\boxed{\\frac{68}{2}}", "\\frac{1}{2}, \\frac{68}{2}"),  # one line: both
        ("\\boxed{34} and then \\boxed{\\frac{1", "34"),  # truncated last box is skipped
        ("Answer: \u221234", "-34"),  # Unicode minus
        ("", None),
        ("I am not sure.", None),
        ("Answer:", None),
    ],
)
def test_extract_answer(response: str, expected: str | None) -> None:
    assert extract_answer(response) == expected


def test_answer_outside_the_last_300_chars_is_ignored() -> None:
    # "Answer: 34" then 300 filler characters: the label is outside the window, no box -> None.
    early = "Answer: 34\n" + "x" * ANSWER_WINDOW_CHARS
    assert extract_answer(early) is None
    # The boxed fallback reads the same window (as the official scorer does): an early box in a
    # response that ran on (or was truncated) is no final answer.
    assert extract_answer("\\boxed{34}\n" + "x" * ANSWER_WINDOW_CHARS) is None
    assert extract_answer("x" * ANSWER_WINDOW_CHARS + "\\boxed{34}") == "34"


def test_last_boxed_content_handles_fbox_and_unbraced() -> None:
    assert last_boxed_content("\\fbox{7}") == "7"
    assert last_boxed_content("so $\\boxed 5$.") == "5"
    assert last_boxed_content("no box") is None


def test_integer_helpers() -> None:
    assert strip_thousands_separators("1,234,567 and 12,13") == "1234567 and 12,13"
    assert strip_thousands_separators("1{,}234") == "1234"
    assert integer_value("1,234") == 1234
    assert integer_value("-7") == -7
    assert integer_value("12 13") is None  # not 1213
    assert integer_value("34.0") is None  # left to math-verify
    assert gold_integer(34) == 34 and gold_integer(" -3 ") == -3
    assert gold_integer("\\frac{1}{2}") is None and gold_integer(True) is None


@pytest.mark.parametrize(
    ("answer", "hedged"),
    [
        ("12 or 13", True),
        ("12, 13, 14", True),
        ("12 and 13", True),
        ("12 \\text{ or } 13", True),
        ("12 \\lor 13", True),
        ("12 \\pm 1", True),
        ("33 34", True),
        ("34 \\quad 35", True),
        ("12; 13", True),
        ("1,234", False),
        ("1,234,567", False),
        ("\\frac{68}{2}", False),
        ("x = 34", False),
        ("34 \\text{ apples}", False),
    ],
)
def test_looks_hedged(answer: str, hedged: bool) -> None:
    assert looks_hedged(answer) is hedged


# ---------------------------------------------------------------- verdicts


def _check(verdict: Verdict, correct: bool, reason: str, status: str = "ok") -> None:
    assert (verdict.correct, verdict.reason, verdict.status) == (correct, reason, status), verdict
    assert verdict.reward == (1.0 if correct else -1.0)


def test_equivalent_forms_of_34_are_correct() -> None:
    responses = [
        "34 = 2 * 17, so\nAnswer: 34",  # fast path
        "The sum is \\boxed{34}.",  # boxed fallback, fast path
        "After simplifying, the response ends with\nAnswer: 34.0",  # math-verify: 34.0 == 34
        "So the value is \\boxed{34.0}",
        "Answer: \\frac{68}{2}",  # math-verify: 68/2 = 34
        "Therefore \\boxed{\\dfrac{68}{2}}",
        "Answer: x = 34",
    ]
    verdicts = score_responses(responses, [34] * len(responses), timeout_s=TIMEOUT_S, judge=POOL)
    for verdict in verdicts:
        _check(verdict, True, "correct")
    assert [v.extracted_answer for v in verdicts[:3]] == ["34", "34", "34.0"]


def test_wrong_and_missing_answers_are_incorrect() -> None:
    responses = ["Answer: 35", "", "I could not solve it.", "Answer: \\frac{70}{2}", "Answer: thirty-four"]
    verdicts = score_responses(responses, ["34"] * len(responses), timeout_s=TIMEOUT_S, judge=POOL)
    _check(verdicts[0], False, "wrong")
    _check(verdicts[1], False, "no_answer")
    _check(verdicts[2], False, "no_answer")
    _check(verdicts[3], False, "wrong")  # 70/2 = 35
    assert verdicts[4].correct is False and verdicts[4].status == "ok"
    assert verdicts[1].extracted_answer is None


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("12 or 13", 13),  # the gold is one of the offered values: still wrong
        ("12, 13, 14", 13),
        ("12 and 13", 12),
        ("\\{12, 13\\}", 13),
        ("(12, 13)", 13),
        ("12 \\lor 13", 13),
        ("33 34", 34),
        ("34 \\pm 1", 35),
    ],
)
def test_hedging_answers_are_incorrect(answer: str, gold: int) -> None:
    _check(score_response(f"Answer: {answer}", gold, timeout_s=TIMEOUT_S), False, "hedged")


def test_thousands_separator_is_not_a_hedge() -> None:
    for answer in ("1,234", "1{,}234", "$1,234$"):
        _check(score_response(f"Answer: {answer}", 1234, timeout_s=TIMEOUT_S), True, "correct")


def test_non_integer_gold_answers() -> None:
    # 28/6 = 14/3; a tuple gold is itself multi-valued, so a tuple answer is no hedge.
    verdicts = score_responses(
        ["Answer: \\frac{28}{6}", "Answer: (3, \\frac{\\pi}{2})", "Answer: 4.67"],
        ["\\frac{14}{3}", "(3, \\frac{\\pi}{2})", "\\frac{14}{3}"],
        timeout_s=TIMEOUT_S,
    )
    _check(verdicts[0], True, "correct")
    _check(verdicts[1], True, "correct")
    _check(verdicts[2], False, "wrong")


def test_pool_agrees_with_in_process_reference() -> None:
    cases = [
        ("Answer: 34", 34), ("Answer: 34.0", 34), ("\\boxed{\\frac{68}{2}}", 34), ("Answer: 35", 34),
        ("Answer: 12 or 13", 13), ("nothing", 5), ("Answer: 1,234", 1234), ("Answer: -7", -7),
        ("Answer: 2^{5}+2", 34), ("Answer: \\sqrt{1156}", 34), ("Answer: 34 dollars", 34),
        ("Answer: 33 34", 34), ("Answer: 0.5", "\\frac{1}{2}"), ("Answer: x", 3),
        ("Answer: x + 34", 34), ("Answer: 34 \\text{ cm}", 34),
    ]
    pooled = score_responses([c[0] for c in cases], [c[1] for c in cases], timeout_s=TIMEOUT_S, judge=POOL)
    reference = [judge_in_process(response, gold) for response, gold in cases]
    assert pooled == reference
    # Hand-checked: 34, 34.0, 68/2, 1,234, -7, 2^5+2 = 34, sqrt(1156) = 34, "34 dollars", 0.5 = 1/2,
    # "34 cm" -> 10 correct; "x + 34" is not 34.
    assert sum(v.correct for v in pooled) == 10
    assert pooled[-2].correct is False


# ---------------------------------------------------------------- timeouts and failures


def test_exponent_tower_times_out_within_the_limit() -> None:
    score_response("Answer: \\frac{2}{2}", 1, timeout_s=TIMEOUT_S, judge=POOL)  # warm the pool: time only the verdict
    started = time.monotonic()
    verdict = score_response("Clearly \\boxed{9^{9^{9^{9}}}}", 34, timeout_s=1.0, judge=POOL)
    elapsed_s = time.monotonic() - started
    _check(verdict, False, "timeout", status="timeout")
    assert verdict.error is not None and "1 s" in verdict.error
    assert verdict.extracted_answer == "9^{9^{9^{9}}}"
    # Without its deadline the tower never finishes: the bound only has to sit far below "never" and
    # above what a loaded 2-core CI machine adds to the 1 s limit + 0.25 s kill grace (a correctness
    # guard, not a speed target: under load 10 the kill and respawn took 5-11 s).
    assert elapsed_s < LATE_S, elapsed_s


def test_timeouts_are_counted_and_do_not_poison_the_batch(caplog: pytest.LogCaptureFixture) -> None:
    responses = ["Answer: 34", "\\boxed{9^{9^{9^{9}}}}", "Answer: \\frac{68}{2}", "Answer: 35"]
    with caplog.at_level("WARNING", logger="dapo_core.rewards"):
        verdicts = score_responses(responses, [34] * 4, timeout_s=1.0, judge=POOL)
    counts = summarize_verdicts(verdicts)
    # 2 correct (34, 68/2), 1 timeout, 1 wrong; 3 judged ok.
    assert (counts.total, counts.correct, counts.ok, counts.timeout, counts.error) == (4, 2, 3, 1, 0)
    assert "1 of 4 verdicts timed out" in caplog.text


@pytest.fixture()
def fault_injecting_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    shutdown_verifier_pool()  # the next pool's workers inherit the variable
    monkeypatch.setenv(verifier_pool._FAULT_INJECTION_ENV, "1")
    yield
    shutdown_verifier_pool()


def test_uninterruptible_hang_kills_and_replaces_the_worker(fault_injecting_pool: None) -> None:
    # "<hang>" blocks SIGALRM and sleeps, like a long C call: only the kill can end it.
    # One worker, one chunk: the items around the hang must still be judged.
    responses = ["Answer: \\frac{68}{2}", "Answer: <hang>", "Answer: 34.0", "Answer: 35.0"]
    started = time.monotonic()
    verdicts = score_responses(responses, [34] * 4, timeout_s=1.0, judge=process_judge(1))
    elapsed_s = time.monotonic() - started
    _check(verdicts[0], True, "correct")
    _check(verdicts[1], False, "timeout", status="timeout")
    assert verdicts[1].error is not None and "killed" in verdicts[1].error
    _check(verdicts[2], True, "correct")
    _check(verdicts[3], False, "wrong")
    stats = verifier_pool_stats()
    assert stats["killed"] == 1 and stats["started"] == 2  # the first worker, then its replacement
    assert elapsed_s < LATE_S, elapsed_s  # the hang sleeps 3600 s: only the kill ends it this soon


def test_crashed_worker_is_an_error_verdict(fault_injecting_pool: None) -> None:
    verdicts = score_responses(["Answer: <crash>", "Answer: \\frac{68}{2}"], [34, 34], timeout_s=TIMEOUT_S,
                               judge=process_judge(1))
    _check(verdicts[0], False, "error", status="error")
    assert verdicts[0].error is not None and "exit code 70" in verdicts[0].error
    _check(verdicts[1], True, "correct")


def test_in_process_default_interrupts_a_runaway_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    # The default judge (no pool) must give up on a Python-level runaway at its deadline.
    def spin(answer: str, gold_text: str) -> rewards.Outcome:
        while True:
            pass

    monkeypatch.setattr(rewards, "_judge", spin)
    started = time.monotonic()
    verdicts = score_responses(["Answer: \\frac{68}{2}", "Answer: 34"], [34, 34], timeout_s=0.5)
    elapsed_s = time.monotonic() - started
    _check(verdicts[0], False, "timeout", status="timeout")
    _check(verdicts[1], True, "correct")  # the integer fast path never reaches the judge
    assert elapsed_s < LATE_S, elapsed_s  # the spin never ends: only the deadline ends it


def test_in_process_default_refuses_other_threads_with_the_fix_named() -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            score_responses(["Answer: \\frac{68}{2}"], [34])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert "process_judge" in str(errors[0])


def test_a_judge_that_loses_items_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="1 outcomes for 2 items"):
        score_responses(["Answer: \\frac{68}{2}", "Answer: \\frac{2}{2}"], [34, 1],
                        judge=lambda items, timeout_s: judge_here(items[:1], timeout_s))


# ---------------------------------------------------------------- scale and calling contexts


def _mixed_batch(n: int) -> tuple[list[str], list[int], int]:
    """n responses cycling through 4 kinds; returns (responses, golds, expected correct count)."""
    responses: list[str] = []
    golds: list[int] = []
    for i in range(n):
        gold = 100 + i
        kind = i % 4
        if kind == 0:
            responses.append(f"Some work.\nAnswer: {gold}")  # correct, fast path
        elif kind == 1:
            responses.append(f"Some work.\nAnswer: {gold + 1}")  # wrong, fast path
        elif kind == 2:
            responses.append(f"So \\boxed{{\\frac{{{2 * gold}}}{{2}}}}")  # correct, math-verify
        else:
            responses.append(f"Answer: {gold} or {gold + 1}")  # hedged, math-verify
        golds.append(gold)
    expected_correct = sum(1 for i in range(n) if i % 4 in (0, 2))
    return responses, golds, expected_correct


def test_thousand_responses_in_parallel() -> None:
    responses, golds, expected_correct = _mixed_batch(1000)
    assert expected_correct == 500  # kinds 0 and 2 of every 4
    verdicts = score_responses(responses, golds, timeout_s=TIMEOUT_S, judge=process_judge(2))
    counts = summarize_verdicts(verdicts)
    assert (counts.total, counts.correct, counts.ok, counts.hedged) == (1000, 500, 1000, 250)
    assert [v.correct for v in verdicts] == [i % 4 in (0, 2) for i in range(1000)]
    assert verifier_pool_stats()["alive"] == 2


def test_pool_is_reused_across_calls() -> None:
    score_responses(["Answer: \\frac{4}{2}"] * 4, [2] * 4, timeout_s=TIMEOUT_S, judge=process_judge(2))
    started_before = verifier_pool_stats()["started"]
    score_responses(["Answer: \\frac{6}{2}"] * 4, [3] * 4, timeout_s=TIMEOUT_S, judge=process_judge(2))
    assert verifier_pool_stats()["started"] == started_before


def test_a_call_with_fewer_items_than_workers_keeps_the_idle_workers() -> None:
    # A step where one response needs math-verify must not kill the other worker, or the next
    # step pays a fresh interpreter's sympy import (~0.4 s) before its verdicts.
    score_responses(["Answer: \\frac{4}{2}"] * 4, [2] * 4, timeout_s=TIMEOUT_S, judge=process_judge(2))
    assert verifier_pool_stats()["alive"] == 2
    started_before = verifier_pool_stats()["started"]
    score_responses(["Answer: \\frac{6}{2}"], [3], timeout_s=TIMEOUT_S, judge=process_judge(2))
    assert verifier_pool_stats()["alive"] == 2
    score_responses(["Answer: \\frac{8}{2}"] * 4, [4] * 4, timeout_s=TIMEOUT_S, judge=process_judge(2))
    assert verifier_pool_stats()["started"] == started_before


def test_a_pool_started_ahead_serves_the_first_call_without_starting_a_worker() -> None:
    # The driver starts the pool beside curation and the step-0 evaluation (workflows/driver.py):
    # the first step's scoring then finds every worker up instead of waiting ~0.4 s for a fresh
    # interpreter's sympy import (measured: 0.46 s of a first step's scoring).
    shutdown_verifier_pool()
    verifier_pool.start_verifier_pool(2)
    assert verifier_pool_stats() == {"alive": 2, "started": 2, "killed": 0}
    verifier_pool.start_verifier_pool(2)  # a pool already up is left as it is
    assert verifier_pool_stats()["started"] == 2
    verdicts = score_responses(["Answer: \\frac{4}{2}"] * 4, [2] * 4, timeout_s=TIMEOUT_S, judge=process_judge(2))
    assert [v.correct for v in verdicts] == [True] * 4
    assert verifier_pool_stats() == {"alive": 2, "started": 2, "killed": 0}


def test_a_smaller_max_workers_shrinks_the_pool() -> None:
    score_responses(["Answer: \\frac{4}{2}"] * 4, [2] * 4, timeout_s=TIMEOUT_S, judge=process_judge(2))
    score_responses(["Answer: \\frac{6}{2}"] * 4, [3] * 4, timeout_s=TIMEOUT_S, judge=process_judge(1))
    assert verifier_pool_stats()["alive"] == 1


def test_works_from_a_thread_that_also_creates_the_pool() -> None:
    shutdown_verifier_pool()
    responses, golds, expected_correct = _mixed_batch(40)
    results: list[list[Verdict]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(score_responses(responses, golds, timeout_s=TIMEOUT_S, judge=POOL))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and not errors, errors
    assert sum(v.correct for v in results[0]) == expected_correct == 20


def test_works_from_an_asyncio_executor_thread() -> None:
    responses, golds, expected_correct = _mixed_batch(40)

    async def main() -> list[Verdict]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: score_responses(responses, golds, timeout_s=TIMEOUT_S, judge=POOL))

    verdicts = asyncio.run(main())
    assert sum(v.correct for v in verdicts) == expected_correct


# ---------------------------------------------------------------- API contract


def test_bad_input_names_the_row() -> None:
    with pytest.raises(ValueError, match="2 responses, 1 gold"):
        score_responses(["a", "b"], [1])
    with pytest.raises(TypeError, match=r"gold_answers\[1\].*float"):
        score_responses(["a", "b"], [1, 2.5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"responses\[0\]"):
        score_responses([None], [1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"gold_answers\[0\] is an empty"):
        score_responses(["Answer: 1"], [" "])
    with pytest.raises(ValueError, match="timeout_s"):
        score_responses(["Answer: 1"], [1], timeout_s=0)


def test_reward_version_names_code_and_math_verify() -> None:
    assert REWARD_VERSION.startswith("dapo-rule-reward-r")
    assert REWARD_VERSION.endswith("+math-verify-0.9.0")


def test_summarize_verdicts_counts_by_status_and_reason() -> None:
    verdicts = [
        Verdict(1.0, True, "ok", "3", "correct"),
        Verdict(-1.0, False, "ok", None, "no_answer"),
        Verdict(-1.0, False, "ok", "1 or 2", "hedged"),
        Verdict(-1.0, False, "timeout", "9^9", "timeout", "too slow"),
        Verdict(-1.0, False, "error", "x", "error", "boom"),
    ]
    counts = summarize_verdicts(verdicts)
    # 5 total: 1 correct; statuses ok/ok/ok/timeout/error -> 3/1/1; 1 no_answer, 1 hedged.
    assert (counts.total, counts.correct, counts.ok, counts.timeout, counts.error) == (5, 1, 3, 1, 1)
    assert (counts.no_answer, counts.hedged) == (1, 1)
    assert score_responses([], []) == []
