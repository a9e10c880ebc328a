"""Rule-based answer rewriting (dapo_core/answer_rewrite.py): hand-worked values per rule, forms that
must stay rejected, determinism, and property tests against independent arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.answer_rewrite import REWRITE_RULES, latex_value, rewrite_answer

PROBLEM = "Find the value."


@pytest.mark.parametrize(("raw", "rule", "value"), [
    ("\\frac{14}{3}", "fraction_sum", 14 + 3),
    ("\\dfrac{6}{4}", "fraction_sum", 3 + 2),  # 6/4 = 3/2 in lowest terms
    ("-\\frac{3}{8}", "fraction_sum", 3 + 8),  # -m/n with m, n positive
    ("\\frac{270}7", "fraction_sum", 270 + 7),
    ("137\\frac{1}{2}", "fraction_sum", 275 + 2),  # mixed number 137 1/2 = 275/2
    ("5/12", "fraction_sum", 17),
    ("5.4", "decimal_scaled", 54),  # 5.4 * 10^1
    ("18.90", "decimal_scaled", 1890),  # written places count: 18.90 * 10^2
    ("-0.0000672", "decimal_scaled", -672),
    ("16\\sqrt{3}", "radical_simple", 16 + 3),
    ("\\sqrt{12}", "radical_simple", 2 + 3),  # sqrt(12) = 2 sqrt(3)
    ("-\\sqrt{3}", "radical_simple", 1 + 3),
    ("\\frac{\\sqrt{3}}{3}", "radical_fraction", 1 + 3 + 3),
    ("\\frac{1}{\\sqrt{3}}", "radical_fraction", 1 + 3 + 3),  # rationalised: sqrt(3)/3
    ("\\frac{3\\sqrt{3}}{4}", "radical_fraction", 3 + 3 + 4),
    ("1+2\\sqrt{3}", "radical_sum", 1 + 2 + 3),
    ("11\\sqrt{5}+11", "radical_sum", 11 + 11 + 5),
    ("\\frac{1-\\sqrt{5}}{2}", "radical_sum", 1 - 1 + 5 + 2),
    ("\\frac{2+\\sqrt{8}}{4}", "radical_sum", 1 + 1 + 2 + 2),  # (2 + 2 sqrt 2)/4 = (1 + sqrt 2)/2
    ("288\\pi", "pi_multiple", 288),
    ("\\pi", "pi_multiple", 1),
    ("-\\frac{\\pi}{6}", "pi_fraction", 1 + 6),
    ("\\frac{5\\pi}{4}", "pi_fraction", 5 + 4),
    ("18+2\\pi", "pi_linear", 20),
    ("1-12i", "complex_sum", 1 - 12),
    ("-2+7i", "complex_sum", 5),
    ("4210_{5}", "base_digits", 4210),
    ("2516_8", "base_digits", 2516),
    ("(3,4]", "interval_sum", 7),
    ("x\\in[-2,7]", "interval_sum", 5),
])
def test_each_rule_by_hand(raw: str, rule: str, value: int) -> None:
    got = rewrite_answer(PROBLEM, raw)
    assert got is not None and (got.rule, got.value) == (rule, value)
    assert got.rule in REWRITE_RULES
    assert got.problem == PROBLEM + "\n\n" + got.instruction
    assert got.instruction.endswith("as the final answer.")


def test_sequences_need_the_problem_to_say_what_they_are() -> None:
    point = "Find the midpoint. Express your answer as an ordered pair, $(x,y)$."
    assert (rewrite_answer(point, "(-1,6)").rule, rewrite_answer(point, "(-1,6)").value) == ("tuple_sum", 5)
    roots = "Find all the integer roots. Enter all the integer roots, separated by commas."
    assert (rewrite_answer(roots, "-2,1").rule, rewrite_answer(roots, "-2,1").value) == ("list_sum", -1)
    interval = "Solve it. Express your answer in interval notation."
    assert (rewrite_answer(interval, "(2,12)").rule, rewrite_answer(interval, "(2,12)").value) == ("interval_sum", 14)
    assert rewrite_answer("Compute it.", "(2,4)") is None  # a tuple of what? not said: stays rejected
    assert rewrite_answer("Compute p and q.", "3,5") is None  # not "all solutions"
    assert rewrite_answer(roots, "2,2") is None  # repeated value: the sum would depend on multiplicity


@pytest.mark.parametrize("raw", [
    "\\text{east}", "Evelyn", "\\text{(B)}", "(C)",  # text, choices
    "\\begin{pmatrix}-7\\\\16\\\\5\\end{pmatrix}",  # matrix
    "3\\pm2\\sqrt{2}", "1\\pm\\sqrt{19}",  # two values
    "2k+2", "-13x+3", "p-q", "6r^2-4r-24",  # variables
    "864^2", "15^2",  # powers (MATH's 864^2 is a known wrong gold answer: never evaluated)
    "\\frac{20000}{\\pi}", "\\sqrt{2}+\\sqrt{3}", "\\sqrt[3]{2}", "\\pi+\\sqrt{2}", "\\frac{1}{2}+\\frac{i}{3}",
    "(2,\\infty)", "(0,9)\\cup(9,36)", "[\\frac{\\pi^2}{8},\\frac{5\\pi^2}{4}]", "(\\frac{3}{5},\\frac{8}{3}]",
    "(3,\\frac{\\pi}{2})", "\\{1\\pm\\sqrt{5},-2\\}", "(5,2]",  # non-integer entries, reversed interval
    "1A_{16}", "19_{8}",  # base above 10, digit not below the base
    "\\frac{1}{0}", "", "34", "34.0",  # undefined; empty; integers are not rewritten
])
def test_forms_that_stay_rejected(raw: str) -> None:
    assert rewrite_answer("Enter the ordered pair; find all solutions.", raw) is None


def test_instruction_is_deterministic_and_depends_on_the_answer_only() -> None:
    first = rewrite_answer("A problem.", "\\frac{\\sqrt{21}}{5}")
    assert first == rewrite_answer("A problem.", "\\frac{\\sqrt{21}}{5}")
    assert first.instruction == rewrite_answer("Another one.", "$\\frac{\\sqrt{21}}{5}$").instruction
    assert first.problem.encode() == rewrite_answer("A problem.  ", "\\frac{\\sqrt{21}}{5}").problem.encode()


def test_parser_is_exact_and_refuses_the_unclear() -> None:
    assert str(latex_value("\\frac12+0.25")) == "3/4"
    assert latex_value("2\\cdot3/4") == Fraction(3, 2)
    assert latex_value("\\sqrt{2}3") is None and latex_value("1\\frac{1}{2}") is None  # product? mixed number?
    assert latex_value("\\frac12") == Fraction(1, 2) and latex_value("\\frac123") is None  # TeX: one digit
    assert latex_value("x+1") is None and latex_value("\\sin2") is None and latex_value("(1+2") is None


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**6, 10**6), st.integers(2, 10**6))
def test_fractions_agree_with_python_fractions(p: int, q: int) -> None:
    exact = Fraction(p, q)
    got = rewrite_answer(PROBLEM, f"\\frac{{{p}}}{{{q}}}")
    if exact.denominator == 1:
        assert got is None  # an integer in disguise is left to the integer conversion
    else:
        assert (got.rule, got.value) == ("fraction_sum", abs(exact.numerator) + exact.denominator)


def _square_free(n: int) -> bool:
    return n > 1 and all(n % (k * k) for k in range(2, math.isqrt(n) + 1))


@settings(max_examples=200, deadline=None)
@given(st.integers(-50, 50), st.integers(1, 50), st.integers(2, 200), st.integers(1, 30))
def test_radicals_agree_with_hand_reduction(a: int, b: int, c: int, d: int) -> None:
    # (a + b sqrt(c)) / d: reduce sqrt(c) = s sqrt(r), r square-free, then divide out gcd(a, b s, d).
    s = max(k for k in range(1, math.isqrt(c) + 1) if c % (k * k) == 0)
    r = c // (s * s)
    got = rewrite_answer(PROBLEM, f"\\frac{{{a}+{b}\\sqrt{{{c}}}}}{{{d}}}")
    if r == 1:  # the root is an integer: a rational answer, the fraction rule (or an integer)
        assert got is None or got.rule == "fraction_sum"
        return
    assert _square_free(r)
    g = math.gcd(a, b * s, d)
    a2, b2, d2 = a // g, b * s // g, d // g
    if a2 == 0 and d2 == 1:
        expected = ("radical_simple", b2 + r)
    elif a2 == 0:
        expected = ("radical_fraction", b2 + r + d2)
    else:
        expected = ("radical_sum", a2 + b2 + r + (d2 if d2 > 1 else 0))
    assert (got.rule, got.value) == expected
