"""Rewrite non-integer answers into integer-answer problems, as the DAPO data was made.

DAPO trains only on integer answers (paper sec. 3.5, "Dataset Transformation"): the authors
turned an answer such as ``(a+sqrt(b))/c`` into "find a+b+c". This module does that for the
forms where it is sound (``REWRITE_RULES``: fractions, decimals, radicals, multiples of pi,
complex numbers, base-b digits, tuples, lists, intervals), by rule and with exact arithmetic
(sympy, never floats); everything else returns None, so the caller keeps the rejection reason.
LaTeX is read by a small recursive-descent parser (no ``eval``); the same input gives
byte-identical output. Pure functions.

Design notes (each rule and why): docs/ALGORITHM.md, "Answer rewrites (dapo_core/answer_rewrite.py)".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

import sympy

from dapo_core.answer_text import ascii_numerals, balanced, latex_spacing_to_spaces, strip_wrappers

REWRITE_RULES: dict[str, str] = {
    "fraction_sum": "a non-integer rational p/q, written m/n in lowest terms: m+n",
    "decimal_scaled": "a decimal with k written places: the answer times 10^k",
    "radical_simple": "a*sqrt(b), b square-free: |a|+b",
    "radical_fraction": "a*sqrt(b)/c, b square-free, gcd(a,c)=1: |a|+b+c",
    "radical_sum": "(a+b*sqrt(c))/d, c square-free, d>0, gcd(a,b,d)=1: a+b+c (+d when d>1)",
    "pi_multiple": "k*pi, k an integer: k",
    "pi_fraction": "m*pi/n in lowest terms: m+n",
    "pi_linear": "a+b*pi, a and b non-zero integers: a+b",
    "complex_sum": "a+bi, a and b integers: a+b",
    "base_digits": "a numeral in base 2..10: its digits read as a base-10 integer",
    "tuple_sum": "an ordered tuple of integers the problem calls a pair/triple/point: the sum",
    "list_sum": "a comma list of all solutions, distinct integers: the sum",
    "interval_sum": "one bounded interval with integer endpoints: the sum of the endpoints",
}


@dataclass(frozen=True)
class Rewritten:
    """A problem rewritten so that its answer is one integer.

    ``problem`` is the original text plus ``"\\n\\n" + instruction``; ``value`` the integer the
    instruction asks for, derived from the original answer; ``rule`` a key of REWRITE_RULES.
    """

    rule: str
    problem: str
    instruction: str
    value: int


# ----------------------------------------------------------------------------- LaTeX -> sympy


class _ParseError(ValueError):
    pass


_TOKEN_RE = re.compile(r"\\[dt]?frac|\\sqrt|\\pi|\\cdot|\\times|\d+(?:\.\d+)?|[-+*/(){}i]")


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise _ParseError(f"unexpected {text[pos:pos + 10]!r}")
        tokens.append(match.group(0))
        pos = match.end()
    return tokens


class _Parser:
    """expr := term (+|- term)*; term := unary ((*|/|implicit) unary)*; unary := -unary | atom.

    Atoms: numbers, ``\\frac``, ``\\sqrt``, ``\\pi``, ``i``, ``(...)``, ``{...}``. A number right
    before ``\\frac`` is refused (``1\\frac{4}{5}`` is a mixed number, not a product).
    """

    _STARTS = {"\\frac", "\\dfrac", "\\tfrac", "\\sqrt", "\\pi", "i", "(", "{"}

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _ParseError(f"expected {expected or 'a token'}, got {token!r}")
        self.pos += 1
        return token

    def parse(self) -> sympy.Expr:
        value = self.expr()
        if self.peek() is not None:
            raise _ParseError(f"trailing {self.peek()!r}")
        return value

    def expr(self) -> sympy.Expr:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> sympy.Expr:
        value, last = self.unary()
        while True:
            token = self.peek()
            if token in ("*", "\\cdot", "\\times", "/"):
                self.take()
                right, last = self.unary()
                value = value / right if token == "/" else value * right
            elif token is not None and (token in self._STARTS or token[0].isdigit()):
                if token[0].isdigit() or (last[:1].isdigit() and "frac" in token):
                    # "\sqrt{2}3" is unclear and "1\frac{4}{5}" is a mixed number: refuse both
                    raise _ParseError("implicit product with a number or after a number before a fraction")
                right, last = self.unary()
                value = value * right
            else:
                return value

    def unary(self) -> tuple[sympy.Expr, str]:
        if self.peek() == "-":
            self.take()
            value, last = self.unary()
            return -value, last
        token = self.peek() or ""
        return self.atom(), token

    def group(self) -> sympy.Expr:
        """A ``{...}`` argument, or one digit (``\\frac12``, ``\\sqrt3``)."""
        token = self.peek()
        if token == "{":
            self.take()
            value = self.expr()
            self.take("}")
            return value
        if token is not None and token.isdigit():
            # One digit only, as TeX reads it: "\frac12" is 1/2; the rest stays for what follows
            # ("\frac123" leaves "3", an implicit product with a number, which is refused).
            if len(token) > 1:
                self.tokens[self.pos] = token[1:]
            else:
                self.take()
            return sympy.Integer(int(token[0]))
        raise _ParseError(f"bad argument {token!r}")

    def atom(self) -> sympy.Expr:
        token = self.take()
        if token[0].isdigit():
            return sympy.Rational(token)
        if token in ("\\frac", "\\dfrac", "\\tfrac"):
            numerator = self.group()
            denominator = self.group()
            if denominator == 0:
                raise _ParseError("division by zero")
            return numerator / denominator
        if token == "\\sqrt":
            radicand = self.group()
            if not (radicand.is_number and radicand.is_nonnegative):
                raise _ParseError("square root of a negative or symbolic number")
            return sympy.sqrt(radicand)
        if token == "\\pi":
            return sympy.pi
        if token == "i":
            return sympy.I
        if token in ("(", "{"):
            value = self.expr()
            self.take(")" if token == "(" else "}")
            return value
        raise _ParseError(f"unexpected {token!r}")


def latex_value(text: str) -> sympy.Expr | None:
    """The exact value of a small LaTeX number (integers, decimals, \\frac, \\sqrt, \\pi, i,
    + - * /), or None when it uses anything else (variables, \\pm, powers, functions)."""
    try:
        value = _Parser(_tokenize(text.replace(" ", ""))).parse()
    except (_ParseError, ZeroDivisionError):
        return None
    return value


# ----------------------------------------------------------------------------- normalisation

def _clean(raw: str) -> str:
    """Unicode digits as ASCII and LaTeX spacing as spaces, then math delimiters, \\boxed{}, \\text{},
    outer braces and \\left/\\right stripped (dapo_core.answer_text, as the integer parser and the
    reward do), then \\displaystyle and every space removed."""
    text = latex_spacing_to_spaces(ascii_numerals(raw.replace("\\displaystyle", "")))
    return "".join(strip_wrappers(text).split())


# ----------------------------------------------------------------------------- rules

_SQUARE_FREE = "is not divisible by the square of any prime"
_DECIMAL_RE = re.compile(r"-?\d*\.\d+")
_MIXED_RE = re.compile(r"(-?)(\d+)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_BASE_RE = re.compile(r"(\d+)_\{?(\d+)\}?")
_INT_RE = re.compile(r"[+-]?\d+")
_INTERVAL_RE = re.compile(r"(?:[a-z]\\in)?([(\[])([^,]+),([^,]+)([)\]])")
_TUPLE_WORDS = re.compile(r"ordered|\bpoint\b|\bpair\b|\btriple\b|quadruple|coordinates")
_LIST_WORDS = re.compile(r"\ball\b|\broots\b|\bsolutions\b|separated by commas", re.I)
_INTERVAL_WORDS = re.compile(r"interval", re.I)


def _with(problem: str, rule: str, instruction: str, value: int) -> Rewritten:
    return Rewritten(rule, problem.rstrip() + "\n\n" + instruction, instruction, value)


def _fraction(problem: str, value: sympy.Rational) -> Rewritten:
    m, n = abs(int(value.p)), int(value.q)
    form = "-\\frac{m}{n}" if value < 0 else "\\frac{m}{n}"
    return _with(problem, "fraction_sum",
                 f"Write the answer in the form ${form}$, where $m$ and $n$ are relatively prime positive "
                 "integers, and give $m+n$ as the final answer.", m + n)


def _decimal(problem: str, text: str) -> Rewritten:
    places = len(text.split(".")[1])
    scaled = Decimal(text).scaleb(places)
    return _with(problem, "decimal_scaled",
                 f"Give the answer (as a decimal with {places} digit{'s' if places > 1 else ''} after the "
                 f"decimal point) multiplied by $10^{{{places}}}$, as an integer, as the final answer.",
                 int(scaled))


def _surd_parts(value: sympy.Expr) -> tuple[sympy.Rational, sympy.Rational, sympy.Expr] | None:
    """``value == r0 + r1 * unit`` with rationals r0, r1 != 0 and one unit: sqrt(c), pi or I."""
    r0, r1, unit = sympy.Integer(0), sympy.Integer(0), None
    for term in sympy.Add.make_args(sympy.expand(sympy.radsimp(value))):
        coeff, base = term.as_coeff_Mul()
        if not coeff.is_Rational:
            return None
        if base == 1:
            r0 += coeff
            continue
        is_surd = base.is_Pow and base.exp == sympy.Rational(1, 2) and base.base.is_Integer and base.base > 1
        if not (is_surd or base in (sympy.pi, sympy.I)) or (unit is not None and base != unit):
            return None
        unit, r1 = base, r1 + coeff
    if unit is None or r1 == 0:
        return None
    return sympy.Rational(r0), sympy.Rational(r1), unit


def _radical(problem: str, r0: sympy.Rational, r1: sympy.Rational, radicand: int) -> Rewritten:
    if r0 == 0 and r1.q == 1:
        a = abs(int(r1.p))
        form = "-a\\sqrt{b}" if r1 < 0 else "a\\sqrt{b}"
        return _with(problem, "radical_simple",
                     f"Write the answer in the form ${form}$, where $a$ and $b$ are positive integers and $b$ "
                     f"{_SQUARE_FREE}, and give $a+b$ as the final answer.", a + radicand)
    if r0 == 0:
        a, c = abs(int(r1.p)), int(r1.q)
        form = "-\\frac{a\\sqrt{b}}{c}" if r1 < 0 else "\\frac{a\\sqrt{b}}{c}"
        return _with(problem, "radical_fraction",
                     f"Write the answer in the form ${form}$, where $a$, $b$ and $c$ are positive integers, $a$ "
                     f"and $c$ are relatively prime, and $b$ {_SQUARE_FREE}, and give $a+b+c$ as the final "
                     "answer.", a + radicand + c)
    d = math.lcm(int(r0.q), int(r1.q))  # the least d: gcd(a, b, d) = 1 follows
    a, b = int(r0 * d), int(r1 * d)
    if d == 1:
        return _with(problem, "radical_sum",
                     "Write the answer in the form $a+b\\sqrt{c}$, where $a$ and $b$ are integers and $c$ is a "
                     f"positive integer that {_SQUARE_FREE}, and give $a+b+c$ as the final answer.", a + b + radicand)
    return _with(problem, "radical_sum",
                 "Write the answer in the form $\\frac{a+b\\sqrt{c}}{d}$, where $a$, $b$, $c$ and $d$ are integers, "
                 f"$d$ is positive, the greatest common divisor of $a$, $b$ and $d$ is 1, and $c$ is a positive "
                 f"integer that {_SQUARE_FREE}, and give $a+b+c+d$ as the final answer.", a + b + radicand + d)


def _pi(problem: str, r0: sympy.Rational, r1: sympy.Rational) -> Rewritten | None:
    if r0 == 0 and r1.q == 1:
        return _with(problem, "pi_multiple",
                     "The answer is $k\\pi$ for an integer $k$; give $k$ as the final answer.", int(r1.p))
    if r0 == 0:
        m, n = abs(int(r1.p)), int(r1.q)
        form = "-\\frac{m\\pi}{n}" if r1 < 0 else "\\frac{m\\pi}{n}"
        return _with(problem, "pi_fraction",
                     f"Write the answer in the form ${form}$, where $m$ and $n$ are relatively prime positive "
                     "integers, and give $m+n$ as the final answer.", m + n)
    if r0.q == 1 and r1.q == 1:
        return _with(problem, "pi_linear",
                     "Write the answer in the form $a+b\\pi$, where $a$ and $b$ are integers, and give $a+b$ as "
                     "the final answer.", int(r0 + r1))
    return None


def _complex(problem: str, r0: sympy.Rational, r1: sympy.Rational) -> Rewritten | None:
    if r0.q != 1 or r1.q != 1:
        return None
    return _with(problem, "complex_sum",
                 "Write the answer in the form $a+bi$, where $a$ and $b$ are integers, and give $a+b$ as the final "
                 "answer.", int(r0 + r1))


def _base(problem: str, digits: str, base: int) -> Rewritten | None:
    if not 2 <= base <= 10 or any(int(d) >= base for d in digits) or (len(digits) > 1 and digits[0] == "0"):
        return None
    return _with(problem, "base_digits",
                 f"Give the base-{base} digits of the answer without the subscript (for example, $123_{{{base}}}$ "
                 "would be given as 123) as the final answer.", int(digits))


def _sequence(problem: str, text: str) -> Rewritten | None:
    """Tuples, comma lists and intervals whose entries are all integers."""
    interval = _INTERVAL_RE.fullmatch(text)
    if interval is not None:
        opening, low, high, closing = interval.groups()
        is_interval = (opening, closing) != ("(", ")") or _INTERVAL_WORDS.search(problem) is not None
        if is_interval:
            if not (_INT_RE.fullmatch(low) and _INT_RE.fullmatch(high)) or int(low) >= int(high):
                return None
            return _with(problem, "interval_sum",
                         "The answer is an interval; give the sum of its two endpoints as the final answer.",
                         int(low) + int(high))
    if text.startswith("(") and text.endswith(")") and balanced(text[1:-1], "(", ")"):
        entries = text[1:-1].split(",")
        if len(entries) < 2 or not all(_INT_RE.fullmatch(e) for e in entries):
            return None
        if _TUPLE_WORDS.search(problem) is None or _INTERVAL_WORDS.search(problem) is not None:
            return None
        return _with(problem, "tuple_sum",
                     f"The answer is an ordered tuple of {len(entries)} integers; give the sum of its entries as "
                     "the final answer.", sum(int(e) for e in entries))
    entries = text.split(",")
    if len(entries) < 2 or not all(_INT_RE.fullmatch(e) for e in entries):
        return None
    values = [int(e) for e in entries]
    if len(set(values)) != len(values) or _LIST_WORDS.search(problem) is None:
        return None
    return _with(problem, "list_sum",
                 "Instead of listing the values, give the sum of all of them (each distinct value counted once) as "
                 "the final answer.", sum(values))


def rewrite_answer(problem: str, raw_answer: str) -> Rewritten | None:
    """Rewrite (problem, non-integer answer) into an integer-answer problem, or None.

    Call it only for answers that are not integers already. Deterministic: the instruction
    depends only on the rule and the answer.
    """
    text = _clean(raw_answer)
    if not text:
        return None
    if "," in text:
        return _sequence(problem, text)
    if _DECIMAL_RE.fullmatch(text):
        return None if Decimal(text) == Decimal(text).to_integral_value() else _decimal(problem, text)
    base = _BASE_RE.fullmatch(text)
    if base is not None:
        return _base(problem, base.group(1), int(base.group(2)))
    mixed = _MIXED_RE.fullmatch(text)
    if mixed is not None:
        sign, whole, numerator, denominator = mixed.groups()
        if int(denominator) == 0 or int(numerator) >= int(denominator):
            return None  # "2\frac{5}{3}" is not a proper mixed number: do not guess
        value = sympy.Integer(int(whole)) + sympy.Rational(int(numerator), int(denominator))
        return _fraction(problem, -value if sign else value)
    value = latex_value(text)
    if value is None:
        return None
    if value.is_Rational:
        return None if value.is_Integer else _fraction(problem, value)
    parts = _surd_parts(value)
    if parts is None:
        return None
    r0, r1, unit = parts
    if unit == sympy.pi:
        return _pi(problem, r0, r1)
    if unit == sympy.I:
        return _complex(problem, r0, r1)
    return _radical(problem, r0, r1, int(unit.base))
