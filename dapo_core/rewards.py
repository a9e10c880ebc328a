"""The DAPO rule reward: +1 if the final answer is equivalent to the gold answer, else -1.

Paper eq. 7 (arXiv 2503.14476, section 3.5): R(y_hat, y) = 1 if is_equivalent(y_hat, y) else -1,
a rule instead of a learned reward model because a learned one is easy to hack. So the final
answer line must state ONE value that parses as one LaTeX expression; equivalence is judged by
math-verify (plain integers take an exact fast path); every verdict has a wall-clock limit, and a
timeout or error scores -1 and is counted (`summarize_verdicts`). Where a verdict runs is the
caller's `Judge`; this module stays pure: no processes, no threads, no I/O.

Version rule: bump `_RULE_REVISION` whenever a change can alter any verdict. `REWARD_VERSION`
also names the installed math-verify version.
Design notes (what counts as one value, judges, timeouts): docs/ALGORITHM.md, "Rewards (dapo_core/rewards.py)".
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import logging
import re
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from dapo_core.answer_extraction import (
    extract_answer,
    gold_integer,
    integer_value,
    looks_hedged,
    stated_values,
    strip_thousands_separators,
)
from dapo_core.answer_text import drop_percent_signs

logger = logging.getLogger(__name__)

_RULE_REVISION: int = 3

try:
    _MATH_VERIFY_VERSION = importlib.metadata.version("math-verify")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - the package is a hard dependency
    _MATH_VERIFY_VERSION = "unknown"

REWARD_VERSION: str = f"dapo-rule-reward-r{_RULE_REVISION}+math-verify-{_MATH_VERIFY_VERSION}"
"""Names this reward code and the math-verify it judges with; stored per row for lineage."""

DEFAULT_TIMEOUT_S: float = 5.0
"""Per-verdict wall-clock limit. Ordinary verdicts take ~1 ms; 5 s matches math-verify's own default."""

CORRECT_REWARD: float = 1.0
INCORRECT_REWARD: float = -1.0

# A worker gets this long past `timeout_s` to report its own (signal-based) timeout before it is
VerdictStatus = Literal["ok", "timeout", "error"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The rule reward for one response (eq. 7).

    Attributes:
        reward: +1.0 if correct else -1.0 (timeouts and errors are -1.0).
        correct: Whether the extracted answer is equivalent to the gold answer.
        status: "ok" when judged; "timeout" when judging overran `timeout_s` (worker killed or
            interrupted); "error" when judging raised or the worker died.
        extracted_answer: The final answer read from the response, None if it gave none.
        reason: Why: "correct", "wrong", "no_answer", "hedged" (several values offered),
            "unparsable" (no value, or not one well-formed expression), "timeout", "error".
        error: Human-readable detail when status is "timeout" or "error", else None.
        judged_value: The single value that was judged, in a canonical form ("34" for "34",
            "34.0", "\\frac{68}{2}" and "x = 34"), so that equivalent answers compare equal (maj@k
            votes on it); None when no single value was judged (no answer, hedged, unparsable,
            a false equation such as "35 = 34", timeout, error).
    """

    reward: float
    correct: bool
    status: VerdictStatus
    extracted_answer: str | None
    reason: str
    error: str | None = None
    judged_value: str | None = None


def _verdict(correct: bool, extracted: str | None, reason: str, status: VerdictStatus = "ok",
             error: str | None = None, judged_value: str | None = None) -> Verdict:
    return Verdict(
        reward=CORRECT_REWARD if correct else INCORRECT_REWARD,
        correct=correct,
        status=status,
        extracted_answer=extracted,
        reason=reason,
        error=error,
        judged_value=judged_value,
    )


@dataclasses.dataclass(frozen=True)
class VerdictCounts:
    """Counts over a batch of verdicts, for logs and step metrics."""

    total: int
    correct: int
    ok: int
    timeout: int
    error: int
    no_answer: int
    hedged: int


def summarize_verdicts(verdicts: Sequence[Verdict]) -> VerdictCounts:
    """Count verdicts by outcome and status (timeouts and errors must be visible, not just -1s)."""
    by_status = collections.Counter(v.status for v in verdicts)
    by_reason = collections.Counter(v.reason for v in verdicts)
    return VerdictCounts(
        total=len(verdicts),
        correct=sum(1 for v in verdicts if v.correct),
        ok=by_status["ok"],
        timeout=by_status["timeout"],
        error=by_status["error"],
        no_answer=by_reason["no_answer"],
        hedged=by_reason["hedged"],
    )


# --------------------------------------------------------------------------------------------
# Judging one extracted answer with math-verify. Runs inside worker processes (and in-process in
# `judge_in_process`, the slow obvious reference used by tests).
# --------------------------------------------------------------------------------------------

Outcome = tuple[str, bool, str, "str | None", "str | None"]
"""(status, correct, reason, error, judged_value): one item's verdict as a judge returns it."""

Judge = Callable[[Sequence[tuple[str, str]], float], list[Outcome]]
"""Judges (answer, gold_text) items, each within `timeout_s` seconds; one `Outcome` per item, in order."""


def _as_latex(text: str) -> str:
    """Wrap bare text in `$...$` so math-verify parses it as one LaTeX expression.

    Without delimiters math-verify falls back to regexes that pick the *last number*
    ("2^{5}+2" -> 2, "12 or 13" -> 13), which is both wrong and hackable.
    """
    return text if "$" in text else f"${text}$"


def _is_multi_valued(expr: Any) -> bool:
    """True for a parsed answer holding several values: a set of >1, interval, tuple, matrix, or/and."""
    import sympy
    from sympy.logic.boolalg import BooleanFunction

    if isinstance(expr, sympy.FiniteSet):
        return len(expr) > 1
    return isinstance(expr, (sympy.Set, sympy.Tuple, sympy.MatrixBase, BooleanFunction, list, tuple))


_GOLD_CACHE: dict[str, list[Any]] = {}
_DECIMAL_RE = re.compile(r"[+-]?\d{1,50}(?:\.\d{1,50})?")


def _parse_value(value: str) -> list[Any]:
    """Parse ONE stated value strictly: the whole string as one LaTeX expression, or nothing.

    math-verify's `parse` is an extractor for free text: by default, when the LaTeX grammar
    rejects the text it tries other matches and the plain-number regex, which returns the
    rightmost number ("35 ? 34", "35 \\to 34" -> 34). Here one expression is tried and only it
    (`first_match`, LaTeX only, no string fallback), so a line that is not one expression is
    unparsable, not a number picked out of it.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if _DECIMAL_RE.fullmatch(value):
        # A plain decimal ("34.0") needs no LaTeX grammar: expression mode reads it exactly, ~5x faster.
        config: list[Any] = [ExprExtractionConfig()]
    else:
        config = [LatexExtractionConfig()]
        value = _as_latex(value)
    return parse(value, extraction_config=config, fallback_mode="no_fallback", extraction_mode="first_match",
                 parsing_timeout=None, raise_on_error=True)


def _is_false_equation(expr: Any) -> bool:
    """True for an equation whose left side is a number that its right side does not equal.

    "2 \\cdot 17 = 34" states 34 and "x = 34" states 34, but "35 = 34" states a relation between two
    numbers (the official scorer reads the text after the last "=" and pays it for 34).
    """
    import sympy
    from math_verify import verify

    if not isinstance(expr, sympy.Equality) or _has_unknowns(expr.lhs):
        return False
    return not verify([expr.lhs], [expr.rhs], timeout_seconds=None, raise_on_error=True)


def _has_unknowns(expr: Any) -> bool:
    """True when a parsed value has free symbols; for an equation, in its last side ("x = 34": no)."""
    import sympy

    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    return bool(getattr(expr, "free_symbols", ()))


def _canonical_value(expr: Any) -> str | None:
    """A canonical string for a parsed value, equal for equivalent numbers ("34", "34.0", 68/2).

    An equation's value is its last side ("x = 34" -> "34"). Numbers are evaluated and floats made
    rational, so 34.0 and \\frac{68}{2} both read "34"; other expressions keep sympy's printing.
    """
    import sympy

    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    if isinstance(expr, sympy.Expr) and expr.is_number:
        expr = expr.doit()
        if isinstance(expr, sympy.Float):
            expr = sympy.nsimplify(expr, rational=True)
    if isinstance(expr, str):
        return expr
    return str(expr)


def _parse_gold(gold_text: str) -> list[Any]:
    # G responses share one gold answer; parsing it once per worker saves ~0.3 ms per verdict.
    from math_verify import parse

    parsed = _GOLD_CACHE.get(gold_text)
    if parsed is None:
        text = drop_percent_signs(gold_text).strip()  # "25\\%" is the gold 25, as answers read it
        gold_int = gold_integer(text)
        if gold_int is not None:
            # What parse("34") returns, without the LaTeX grammar's ~1.5 ms per call.
            import sympy

            parsed = [sympy.Integer(gold_int), str(gold_int)]
        else:
            parsed = parse(_as_latex(text), parsing_timeout=None, raise_on_error=True)
        if len(_GOLD_CACHE) > 4096:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[gold_text] = parsed
    return parsed


def _judge(answer: str, gold_text: str) -> Outcome:
    """Judge one extracted answer against one gold answer with math-verify (no timeout here)."""
    from math_verify import verify

    gold = _parse_gold(gold_text)
    if not gold:
        return ("error", False, "error", f"gold answer {gold_text!r} could not be parsed by math-verify", None)
    gold_is_single = not _is_multi_valued(gold[0])
    values = [strip_thousands_separators(value) for value in stated_values(answer)]
    if not values:
        return ("ok", False, "unparsable", None, None)
    if gold_is_single and (len(values) > 1 or looks_hedged(values[0])):
        return ("ok", False, "hedged", None, None)
    # A multi-valued gold (a tuple, a set) may be stated piece by piece ("x = 3 and y = 4").
    predicted = _parse_value(", ".join(values))
    if not predicted:
        return ("ok", False, "unparsable", None, None)
    if gold_is_single and _is_multi_valued(predicted[0]):
        return ("ok", False, "hedged", None, None)
    value = _canonical_value(predicted[0])
    if _has_unknowns(predicted[0]) and not _has_unknowns(gold[0]):
        # A value with unknowns is not a number, even where a zero makes it one ("2 A 0" for 0).
        return ("ok", False, "wrong", None, value)
    if _is_false_equation(predicted[0]):
        return ("ok", False, "wrong", None, None)
    correct = bool(verify(gold, predicted, timeout_seconds=None, raise_on_error=True))
    return ("ok", correct, "correct" if correct else "wrong", None, value)


def judge_answer(answer: str, gold_text: str) -> Outcome:
    try:
        return _judge(answer, gold_text)
    except Exception as exc:  # untrusted input: any failure is a counted "error" verdict
        return ("error", False, "error", f"{type(exc).__name__}: {exc}"[:500], None)


class SoftTimeout(BaseException):
    """Raised by a SIGALRM deadline; a BaseException so library `except Exception` can't eat it."""


def judge_here(items: Sequence[tuple[str, str]], timeout_s: float) -> list[Outcome]:
    """The default `Judge`: each item in this process, in turn, under a SIGALRM deadline.

    Only the main thread can take signals; from any other thread pass
    `judge=engines.score.verifier_pool.process_judge()`. A runaway inside C code (a huge integer power)
    holds the signal until it returns; the process pool kills such a worker instead.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "judging in this process needs the main thread (its deadline is a SIGALRM); from another "
            "thread pass judge=engines.score.verifier_pool.process_judge() to score_responses"
        )

    def on_alarm(signum: int, frame: object) -> None:
        raise SoftTimeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outcomes: list[Outcome] = []
    try:
        for answer, gold_text in items:
            try:
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
                outcome = judge_answer(answer, gold_text)
            except SoftTimeout:
                outcome = ("timeout", False, "timeout", f"verdict exceeded {timeout_s:g} s (interrupted)", None)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcomes.append(outcome)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return outcomes


def _validate(responses: Sequence[str], gold_answers: Sequence[str | int], timeout_s: float) -> None:
    if len(responses) != len(gold_answers):
        raise ValueError(
            f"responses and gold_answers differ in length: {len(responses)} responses, "
            f"{len(gold_answers)} gold answers"
        )
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    for row, (response, gold) in enumerate(zip(responses, gold_answers)):
        if not isinstance(response, str):
            raise TypeError(f"responses[{row}] must be str, got {type(response).__name__}")
        if isinstance(gold, bool) or not isinstance(gold, (str, int)):
            raise TypeError(f"gold_answers[{row}] must be str or int, got {type(gold).__name__}: {gold!r}")
        if isinstance(gold, str) and not gold.strip():
            raise ValueError(f"gold_answers[{row}] is an empty string")


def score_responses(
    responses: Sequence[str],
    gold_answers: Sequence[str | int],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    judge: Judge | None = None,
    integer_fast_path: bool = True,
) -> list[Verdict]:
    """Rule reward (eq. 7) for each response against its gold answer.

    Args:
        responses: N decoded model responses (untrusted text).
        gold_answers: N gold answers, ints or strings (LaTeX allowed, e.g. "\\frac{14}{3}").
        timeout_s: Wall-clock limit per verdict; an overrun is a "timeout" verdict with reward -1.
        judge: Where the verdicts that need math-verify run (see `Judge`); None judges them in
            this process under SIGALRM deadlines (main thread only). The pipeline passes
            `engines.score.verifier_pool.process_judge()` (killable worker processes).
        integer_fast_path: Judge plain-integer answers against integer golds exactly in this
            process ("34" vs 34) instead of through math-verify. Same verdicts, ~100x cheaper;
            off only to measure math-verify itself.

    Returns:
        N verdicts, in input order.

    Raises:
        ValueError / TypeError: mismatched lengths or a malformed row (named by index).
    """
    _validate(responses, gold_answers, timeout_s)
    extracted = [extract_answer(response) for response in responses]
    verdicts: list[Verdict | None] = [None] * len(responses)
    to_judge: list[int] = []
    for row, (answer, gold) in enumerate(zip(extracted, gold_answers)):
        if answer is None:
            verdicts[row] = _verdict(False, None, "no_answer")
            continue
        gold_int = gold_integer(gold) if integer_fast_path else None
        answer_int = integer_value(answer) if gold_int is not None else None
        if gold_int is not None and answer_int is not None:
            correct = answer_int == gold_int
            verdicts[row] = _verdict(correct, answer, "correct" if correct else "wrong", judged_value=str(answer_int))
        else:
            to_judge.append(row)
    if to_judge:
        items = [(extracted[row] or "", str(gold_answers[row]).strip()) for row in to_judge]
        outcomes = (judge or judge_here)(items, timeout_s)
        if len(outcomes) != len(items):
            raise RuntimeError(f"the judge returned {len(outcomes)} outcomes for {len(items)} items")
        for row, (status, correct, reason, error, value) in zip(to_judge, outcomes):
            verdicts[row] = _verdict(correct, extracted[row], reason, status, error, value)  # type: ignore[arg-type]
    final = [v for v in verdicts if v is not None]
    counts = summarize_verdicts(final)
    if counts.timeout or counts.error:
        logger.warning(
            "rule reward: %d of %d verdicts timed out (limit %.3g s) and %d errored; they score -1",
            counts.timeout, counts.total, timeout_s, counts.error,
        )
    return final


def score_response(response: str, gold_answer: str | int, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   judge: Judge | None = None) -> Verdict:
    """Rule reward (eq. 7) for one response; see `score_responses`."""
    return score_responses([response], [gold_answer], timeout_s=timeout_s, judge=judge)[0]


def judge_in_process(response: str, gold_answer: str | int) -> Verdict:
    """Slow, obvious reference: extract and judge with math-verify in this thread, no fast path.

    No timeout protection - for tests on trusted inputs only. `score_responses` must agree
    with it on every input that does not time out.
    """
    answer = extract_answer(response)
    if answer is None:
        return _verdict(False, None, "no_answer")
    status, correct, reason, error, value = judge_answer(answer, str(gold_answer).strip())
    return _verdict(correct, answer, reason, status, error, value)  # type: ignore[arg-type]
