"""Curation and the reward read answers alike, and the reward pays at least what the official scorer pays.

Issue 45. Two properties tie the pieces together:

- Curation's gold is what the reward pays: an answer written in a form curation accepts gets the
  gold curation makes of it, and the reward, reading the same text as a model's "Answer:" line,
  pays exactly that gold (and not its neighbours, nor a reading of the digits joined up). A
  list-like answer ("5, 125", "12 345") is rejected by curation and pays no single integer.
- The official DAPO scorer is the floor: a strict match of the last "Answer:" line in the last 300
  characters. `_official_pays` below restates it from its description (not from its code); every
  single-value line it pays, the reward pays. Lines that state another value, two values, a
  relation to another number or a percent of another number score -1, and one string never pays two
  different golds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo_core.answers import to_integer_answer
from dapo_core.rewards import score_responses
from engines.score.verifier_pool import process_judge, shutdown_verifier_pool

TIMEOUT_S = 20.0  # generous: a loaded 2-core machine; these tests are about verdicts
_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def _pool_per_module() -> Iterator[None]:
    yield
    shutdown_verifier_pool()


def _paid(responses: list[str], golds: list[int]) -> list[bool]:
    verdicts = score_responses(responses, golds, timeout_s=TIMEOUT_S, judge=process_judge(1))
    return [verdict.correct for verdict in verdicts]


# ---------------------------------------------------------------- the official scorer, restated

_OFFICIAL_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)


def _official_normalise(text: str) -> str:
    """The official scorer's normalisation, restated for the forms these tests write.

    The text after the last "="; escaped dollars and spaces removed; when a $...$ pair is present
    only its content counts (prose around it is dropped); \\text{}, \\textbf{} and \\boxed{} unwrapped;
    stray dollars removed; a number grouped by commas read without them.
    """
    text = text.split("=")[-1].replace("\\$", "").replace(" ", "")
    dollars = re.fullmatch(r"(.*?)\$(.*?)\$(.*)", text, re.S)
    if dollars is not None:
        text = dollars.group(2)
    text = re.sub(r"\\text(?:bf)?\{(.*?)\}", r"\1", text)
    text = re.sub(r"\\boxed\{(.*)\}", r"\1", text)
    text = text.replace("$", "")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+", text):
        text = text.replace(",", "")
    return text


def _official_pays(response: str, gold: int) -> bool:
    """+1 iff the last non-empty "Answer:" capture in the last 300 characters normalises to the gold."""
    captures = _OFFICIAL_ANSWER_RE.findall(response[-300:])
    return bool(captures) and _official_normalise(captures[-1]) == _official_normalise(str(gold))


def test_the_restated_official_scorer_pays_the_issues_examples() -> None:
    # The oracle itself: what the issue reports the official scorer pays (and does not).
    for response in ("Answer: $34$ (I think)", "Answer: The final answer is $34$. I hope it is correct.",
                     "Answer: 34\nAnswer:", "Answer:\n\n34", "Answer: 1,234", "Answer: 35 = 34"):
        assert _official_pays(response, 1234 if "1,234" in response else 34), response
    assert not _official_pays("Answer: 34 (I think)", 34)
    assert not _official_pays("Answer: 3400\\%", 34)


# ---------------------------------------------------------------- the floor: single-value lines pay

_VALUES = st.integers(min_value=-10**6, max_value=10**6)
_WRAPPERS = st.sampled_from(["{}", "${}$", "\\boxed{{{}}}", "$\\boxed{{{}}}$", "\\({}\\)", "**{}**"])
_PREFIXES = st.sampled_from(["", "The final answer is ", "the answer is ", "I think it is ", "A total of "])
_SUFFIXES = st.sampled_from(["", ".", " (I think)", ". I hope it is correct.", " I think.", " (final)", " cm"])
# How the "Answer:" line is laid out: the official scorer skips blank lines after "Answer:" and an
# empty "Answer:" line (its regex cannot capture an empty line).
_LAYOUTS = st.sampled_from(["Answer: {}", "Answer:{}", "ANSWER: {}", "Answer:\n\n{}", "Answer: \n  \n{}",
                            "Answer: {}\nAnswer:", "Answer: {}\nAnswer:\n", "Work.\nAnswer: 12\nAnswer: {}"])


@_SETTINGS
@given(gold=_VALUES, grouped=st.booleans(), wrapper=_WRAPPERS, prefix=_PREFIXES, suffix=_SUFFIXES, layout=_LAYOUTS)
def test_property_single_value_lines_the_official_scorer_accepts_score(
    gold: int, grouped: bool, wrapper: str, prefix: str, suffix: str, layout: str
) -> None:
    value = f"{gold:,}" if grouped else str(gold)
    response = layout.format(prefix + wrapper.format(value) + suffix)
    [paid] = _paid([response], [gold])
    assert paid, (response, "official pays" if _official_pays(response, gold) else "official does not pay")


# ---------------------------------------------------------------- and nothing else pays

_RELATIONS = st.sampled_from(["=", "\\equiv", "\\neq", "\\ne", "<", ">", "\\le", "\\leq", "\\ge", "\\geq",
                              "\\approx", "\\mod", "\\pmod", "\\sim", "\\cong", "\\lt", "\\gt", "\\to"])


def _other_value_lines(gold: int, wrong: int, relation: str) -> list[str]:
    """Lines that state another value, two values, a relation to another number, a percent of another."""
    return [
        f"{wrong}",
        f"{wrong} {relation} {gold}",
        f"{gold} {relation} {wrong}",
        f"x = {wrong} {relation} {gold}",
        f"{gold}, {wrong}",
        f"{wrong} (I think {gold})",
        f"{wrong}\\%",
        f"{gold * 100}\\%",
        f"{gold * 100}%",
        f"{wrong} I {gold}",
    ]


@_SETTINGS
@given(gold=_VALUES, wrong=_VALUES, relation=_RELATIONS, wrapper=_WRAPPERS, layout=_LAYOUTS)
def test_property_lines_stating_another_value_or_a_relation_never_score(
    gold: int, wrong: int, relation: str, wrapper: str, layout: str
) -> None:
    # |wrong| >= 2 keeps out 0 and 1, under which "34 \mod 1" or "34 = 1 \cdot 34" could be read as 34;
    # gold 0 is out because 0% of any number is 0 (a percent of its own number pays gold 0 too).
    if wrong == gold or abs(wrong) < 2 or gold == 0:
        return
    responses = [layout.format(wrapper.format(line)) for line in _other_value_lines(gold, wrong, relation)]
    for response, paid in zip(responses, _paid(responses, [gold] * len(responses))):
        assert not paid, response


@_SETTINGS
@given(number=st.integers(min_value=-10**4, max_value=10**4), percent=st.booleans(), latex=st.booleans())
def test_property_one_string_never_pays_two_golds(number: int, percent: bool, latex: bool) -> None:
    sign = ("\\%" if latex else "%") if percent else ""
    response = f"Answer: {number}{sign}"
    candidates = sorted({number, number * 100, number * 10, number + 1, number - 1}
                        | ({number // 100} if number % 100 == 0 else set()))
    paid = [gold for gold, ok in zip(candidates, _paid([response] * len(candidates), candidates)) if ok]
    assert paid == [number], (response, paid)


# ---------------------------------------------------------------- curation's gold is what the reward pays

_DIGIT_SCRIPTS = st.sampled_from(["0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",
                                  "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19",
                                  "\u0966\u0967\u0968\u0969\u096a\u096b\u096c\u096d\u096e\u096f"])
_MINUS_SIGNS = st.sampled_from(["-", "\u2212", "\uff0d"])


def _accepted_forms(n: int, digits: str, minus: str) -> list[str]:
    """Ways a data set writes the integer `n` that curation accepts, in the given digit script."""
    def script(text: str) -> str:
        return text.translate(str.maketrans("0123456789-", digits + minus))

    grouped = f"{n:,}"
    return [script(text) for text in (
        str(n), grouped, grouped.replace(",", "{,}"), grouped.replace(",", ",\\!"), grouped.replace(",", "\\,"),
        f"{n}.0", f"{n}.000", f"\\boxed{{{n}}}", f"${n}$", f"$\\boxed{{{grouped}}}$", f"\\frac{{{2 * n}}}{{2}}",
        f"{n}^\\circ", f"{n}\\%", f"\\text{{{n}}}", f"{{{n}}}", f"**{n}**", f"{n}.",
    )]


@_SETTINGS
@given(n=_VALUES, digits=_DIGIT_SCRIPTS, minus=_MINUS_SIGNS)
def test_property_curations_gold_is_exactly_what_the_reward_pays(n: int, digits: str, minus: str) -> None:
    for raw in _accepted_forms(n, digits, minus):
        verdict = to_integer_answer(raw)
        assert verdict.value == n, (raw, verdict)
        response = f"Answer: {raw}"
        wrong_golds = sorted({n + 1, n - 1, n * 10} - {n})
        assert _paid([response] * (1 + len(wrong_golds)), [n, *wrong_golds]) == [True] + [False] * len(wrong_golds), raw


_GROUPS = st.integers(min_value=0, max_value=999)


@_SETTINGS
@given(head=st.integers(min_value=-999, max_value=999), tail=_GROUPS, layout=st.sampled_from(
    ["{}, {:03d}", "{} {:03d}", "{}\\;{:03d}", "{} ,{:03d}", "{}, {}", "{},{}"]))
def test_property_list_like_answers_are_rejected_and_pay_no_single_integer(head: int, tail: int, layout: str) -> None:
    raw = layout.format(head, tail)
    if layout == "{},{}" and len(str(tail)) == 3:
        return  # "5,125" is a thousands separator: one number
    verdict = to_integer_answer(raw)
    assert verdict.value is None and verdict.reason_code in {"tuple", "spaced_digits"}, (raw, verdict)
    joined = int(f"{head}{tail:03d}") if "03d" in layout else int(f"{head}{tail}")
    candidates = sorted({head, tail, joined})
    assert not any(_paid([f"Answer: {raw}"] * len(candidates), candidates)), (raw, candidates)
