"""The rule reward (eq. 7) must not be gameable: an answer line states ONE value or it is wrong.

A policy trained against a reward that accepts "Answer: 35 otherwise 34" (gold 34) learns to list
candidates. The principle, whatever words or symbols join the candidates: an answer line that
offers more than one value is not correct. Ordinary single-value forms ("34 cm", "x = 34",
`\\boxed{34}`, "$34$", "1,234", an escaped dollar "\\$34") stay correct, and so does everything the
official DAPO scorer (strict match of the last "Answer:" line in the last 300 characters) accepts
for a single value: that scorer is the floor.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo_core.answer_extraction import ANSWER_WINDOW_CHARS, extract_answer
from dapo_core.rewards import score_response, score_responses
from engines.score.verifier_pool import process_judge, shutdown_verifier_pool

TIMEOUT_S = 20.0  # generous: a loaded 2-core machine; these tests are about verdicts


@pytest.fixture(scope="module", autouse=True)
def _pool_per_module() -> Iterator[None]:
    yield
    shutdown_verifier_pool()


# ---------------------------------------------------------------- several candidates: wrong


@pytest.mark.parametrize(
    "response",
    [
        "Answer: 35 otherwise 34",
        "Answer: 35 else 34",
        "Answer: maybe 35 maybe 34",
        "Answer: not 35 but 34",
        "Answer: 35 instead of 34",
        "Answer: 34 instead of 35",
        "Answer: 35 \\text{ otherwise } 34",
        "Answer: 35 otherwise x = 34",
        "Answer: \\boxed{35} \\boxed{34}",
        "Answer: $35$ or $34$",
        "Answer: 35 ? 34",
        "Answer: 35 | 34",
        "Answer: 35 \\mid 34",
        "Answer: 35 \\to 34",
        "Answer: 35 & 34",
        "Answer: 35 # 34",
        "Answer: 35 @ 34",
        "Answer: 35 . 34",
        "Answer: 3'4",  # primes joining digits: math-verify reads 34
        # A modulus beside the value: the LaTeX grammar reads "34 \\mod 1000" as the remainder, 34,
        # so every gold g would score as "g \\mod M" for any M > g (hypothesis found "0\\mod2" for 0).
        "Answer: 34 \\mod 1000",
        "Answer: 34\\mod35",
        "Answer: 34 \\bmod 1000",
        "Answer: 34 \\pmod{1000}",
        "Answer: 34 \\operatorname{mod} 1000",
        "Answer: 34 \\mod{1000}",
        # No "Answer:" line: the line holding the last box offers two boxed values.
        "So the result is \\boxed{35} or maybe \\boxed{34}",
        "Final: \\boxed{35}\\boxed{34}",
    ],
)
def test_an_answer_offering_several_values_is_wrong(response: str) -> None:
    verdict = score_response(response, 34, timeout_s=TIMEOUT_S)
    assert verdict.correct is False and verdict.reward == -1.0, verdict
    assert verdict.status == "ok", verdict


# ---------------------------------------------------------------- one value: correct


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Answer: 34", 34),
        ("Answer: $34$", 34),
        ("Answer: \\$34", 34),  # LaTeX-escaped dollar (currency)
        ("Answer: \\$34.", 34),
        ("Answer: 34 cm", 34),
        ("Answer: 34 \\text{ cm}", 34),
        ("Answer: 34 \\text{cm}^2", 34),
        ("Answer: 34 square units", 34),
        ("Answer: 34 dollars", 34),
        ("Answer: 34^\\circ", 34),
        ("Answer: x = 34", 34),
        ("Answer: 2 \\cdot 17 = 34", 34),
        ("Answer: the answer is 34", 34),
        ("Answer: \\boxed{34}", 34),
        ("Answer: $\\boxed{34}$", 34),
        ("**Answer:** $34$", 34),
        ("Answer: \\textbf{34}", 34),
        ("Answer: \\text{34}", 34),
        ("Answer: a 34", 34),
        ("Answer: \\(34\\)", 34),
        ("Answer: AB = 34", 34),  # a two-letter name is prose; the equation's last side is the value
        ("Answer: a -5", -5),
        ("Answer: 34 \\;", 34),
        ("Answer: $\\boxed{34}$ \\text{ways}.", 34),
        ("Answer: 1,234", 1234),
        ("Answer: 1{,}234", 1234),
        ("Answer: \\$1,234", 1234),
        ("The final answer is $\\boxed{34}$.", 34),
        ("so $x = \\boxed{34}$", 34),
    ],
)
def test_a_single_value_answer_is_correct(response: str, gold: int) -> None:
    verdict = score_response(response, gold, timeout_s=TIMEOUT_S)
    assert verdict.correct is True and verdict.reward == 1.0, verdict


# ---------------------------------------------------------------- the official scorer is the floor
# Right answers the official DAPO scorer (strict match of the last "Answer:" line) pays, which
# scored -1 before issue 45: a lone "I" read as the imaginary unit ("34 I" -> 34*I), an empty last
# "Answer:" line hid the answer above it, and a blank line after "Answer:" hid the value.


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Answer: $34$ (I think)", 34),
        ("Answer: 34 (I think)", 34),
        ("Answer: The final answer is $34$. I hope it is correct.", 34),
        ("Answer: I think it is 34.", 34),
        ("Answer: A total of 34", 34),
        ("Answer: 34\nAnswer:", 34),
        ("Answer: 34\nAnswer:\n", 34),
        ("Answer:\n\n34", 34),
        ("Answer: \n \n$34$", 34),
        ("Answer: 10,\\!000", 10000),  # MATH's thousands separator, which curation also reads
        ("Answer: 3400\\%", 3400),  # a percent is a percent of its own number
        ("Answer: 34\\%", 34),
        ("Answer: 34 \\text{\\%}", 34),
        # Unicode digits read as ASCII, as curation reads them (one rule on both sides).
        ("Answer: \u0663\u0664", 34),
        ("Answer: \u0663\u0664 cm", 34),
        ("Answer: \u0663\u0664.\u0660", 34),
        ("Answer: \uff13\uff14", 34),
    ],
)
def test_what_the_official_scorer_pays_for_one_value_scores(response: str, gold: int) -> None:
    verdict = score_response(response, gold, timeout_s=TIMEOUT_S)
    assert verdict.correct is True and verdict.reward == 1.0, verdict


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Answer: 3400\\%", 34),  # 3400 percent is not 34 (it paid, and paid gold 3400 too)
        ("Answer: 3400%", 34),
        ("Answer: 34\\%", 3400),
        ("Answer: 3400 \\%", 34),
        ("Answer: 35 \\equiv 34", 34),  # \\equiv is a relation, like \\approx and \\mod
        ("Answer: 34 \\equiv 35", 34),
        ("Answer: x \\equiv 34", 34),
        ("Answer: 35 = 34", 34),  # a false equation between two numbers states no value
        ("Answer: 35 \\neq 34", 34),
        ("Answer: 35 > 34", 34),
        ("Answer: 35 \\le 34", 34),
        ("Answer: 35 I 34", 34),  # the pronoun is prose: two values
        ("Answer: 2' '0", 0),  # primes between two numbers: read as a product, 0 (hypothesis found it)
    ],
)
def test_a_relation_or_a_percent_of_another_number_is_wrong(response: str, gold: int) -> None:
    verdict = score_response(response, gold, timeout_s=TIMEOUT_S)
    assert verdict.correct is False and verdict.reward == -1.0, verdict


def test_boxed_fallback_reads_only_the_end_of_the_response() -> None:
    # The official scorer reads the last 300 characters: a response truncated long after an early
    # box has no final answer.
    truncated = "First guess \\boxed{34}.\n" + "and then more work " * (ANSWER_WINDOW_CHARS // 10)
    assert extract_answer(truncated) is None
    verdict = score_response(truncated, 34, timeout_s=TIMEOUT_S)
    assert (verdict.correct, verdict.reason) == (False, "no_answer")
    # The same box at the end counts.
    assert score_response(truncated + "\\boxed{34}", 34, timeout_s=TIMEOUT_S).correct is True


# ---------------------------------------------------------------- properties


_WORDS = st.text(alphabet=st.characters(codec="ascii", categories=["Lu", "Ll"]), min_size=1, max_size=12)
# Punctuation a policy could put between two values. Left out: digits (they would make a third value),
# a newline (it starts a new line, and the last answer line is meant to win), "=" (an equation whose
# left side has an unknown, "35 A = 34", states its last side, as in the official scorer; a false
# one between two numbers, "35 = 34", is tested in test_answer_agreement.py), and arithmetic that
# combines the two numbers into one expression ("+", "-", "*", "/", "^", "_", ".", "!", "\\"), which
# is one value, judged by its value. "%" is in: a percent is a unit of its own number.
_PUNCTUATION = st.sampled_from(list(",;:?|&#@~'\"()[]{}<>`$%"))
_LATEX_CONNECTIVES = st.sampled_from(
    ["\\text{ or }", "\\text{otherwise}", "\\quad", "\\qquad", "\\lor", "\\vee", "\\to", "\\Rightarrow",
     "\\mid", "\\;", "\\,", "\\\\", "\\textbf{not}", "\\mathrm{else}", "\\ne", "\\neq", "\\approx", "\\sim",
     "\\simeq", "\\cong", "\\iff", "\\implies", "\\ldots", "\\cdots", "\\mod", "\\pmod", "\\in", "\\circ",
     "\\lt", "\\le", "\\geq", "\\boxed{}", "\\equiv", "\\%", "I"]
)
_JUNK = st.lists(st.one_of(_WORDS, _PUNCTUATION, _LATEX_CONNECTIVES), min_size=0, max_size=5).map(" ".join)
_VALUES = st.integers(min_value=-10**6, max_value=10**6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gold=_VALUES, wrong=_VALUES, junk=_JUNK, spaced=st.booleans())
def test_property_two_values_on_the_answer_line_never_score(gold: int, wrong: int, junk: str, spaced: bool) -> None:
    # |wrong| >= 2 keeps out the identity elements (0, 1), which would make "34 ... 0" and friends
    # legitimately equal to 34 under some arithmetic reading.
    if wrong == gold or abs(wrong) < 2:
        return
    sep = " " if spaced else ""
    responses = [f"Answer: {wrong}{sep}{junk}{sep}{gold}", f"Answer: {gold}{sep}{junk}{sep}{wrong}"]
    verdicts = score_responses(responses, [gold, gold], timeout_s=TIMEOUT_S, judge=process_judge(1))
    for response, verdict in zip(responses, verdicts):
        assert verdict.correct is False, (response, verdict)


def _ordinary_forms(gold: int) -> list[str]:
    """Single-value ways to state `gold` on a final answer line (or a final box)."""
    text = str(gold)
    grouped = f"{gold:,}"
    return [
        f"Answer: {text}",
        f"Answer: {text}.",
        f"Answer: ${text}$",
        f"Answer: \\({text}\\)",
        f"Answer: \\${text}",
        f"Answer: \\boxed{{{text}}}",
        f"Answer: $\\boxed{{{text}}}$",
        f"**Answer:** {text}",
        f"Answer: **{text}**",
        f"Answer: {grouped}",
        f"Answer: {text} cm",
        f"Answer: {text} \\text{{ apples}}",
        f"Answer: x = {text}",
        f"Answer: the answer is {text}",
        f"Answer: {text}.0",
        f"Answer: \\frac{{{2 * gold}}}{{2}}",
        f"Working.\nAnswer:\n{text}",
        f"So the total is \\boxed{{{text}}}.",
        f"Answer: 12\nOn reflection that is wrong.\nAnswer: {text}",
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gold=_VALUES)
def test_property_ordinary_single_value_forms_always_score(gold: int) -> None:
    responses = _ordinary_forms(gold)
    verdicts = score_responses(responses, [gold] * len(responses), timeout_s=TIMEOUT_S, judge=process_judge(1))
    for response, verdict in zip(responses, verdicts):
        assert verdict.correct is True, (response, verdict)
