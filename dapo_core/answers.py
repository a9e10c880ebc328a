"""Integer answers, problem identity and prompt rendering for the curation stage (stdlib only).

DAPO trains only on problems whose answer is an integer (paper sec. 3.5 / "Dataset
Transformation"): the authors rewrote answers such as ``(a+sqrt(b))/c`` into "find a+b+c" so
that a rule-based reward (eq. 7) can compare one integer, not free-form math. This module
decides whether a raw answer string *is* an integer (``"34"``, ``"1,000"``, ``"34.0"``,
``"\\boxed{34}"``, ``"\\frac{68}{2}"``, ``"$-7$"``) and, when it is not, why (a stable
``reason_code`` plus a human message), so the curation stage can keep or reject each row. Numbers
are read with ``dapo_core.answer_text``, the code the reward reads model answers with, so every gold
is what the reward pays for the same text ("5, 125" is a list, never the gold 5125).

It also owns the identity of a problem (``problem_id``: sha256 of the normalised text, 16 hex
chars), the deterministic hash-based train/test split and prompt rendering. Pure functions: no
file I/O, no third-party imports.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dapo_core.answer_text import (
    MAX_INTEGER_DIGITS,
    ascii_numerals,
    drop_percent_signs,
    integer_value,
    last_boxed_content,
    latex_spacing_to_spaces,
    strip_thousands_separators,
    strip_wrappers,
)
from dapo_core.answer_text import balanced as balanced  # re-exported: it was defined here

# The DAPO prompt template, verbatim from the DAPO-Math-17K data set (the model must end with an
# "Answer: N" line, which the rule-based reward of eq. 7 reads).
DAPO_PROMPT_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
# The tiny CPU pipeline's template (readers/synthetic.py problems such as "37+5-18").
TINY_PROMPT_TEMPLATE = "{problem}=\n"
PROBLEM_PLACEHOLDER = "{problem}"

INT64_MAX = 2**63 - 1

# Every reason a row can be rejected for, with what it means. The curation stage only ever emits
# these codes, so downstream reports can group on them.
REASON_CODES: dict[str, str] = {
    "empty": "missing or blank",
    "not_integer_fraction": "a fraction (or mixed number) whose value is not an integer",
    "not_integer_decimal": "a decimal number with a non-zero fractional part",
    "interval": "an interval or union of intervals",
    "tuple": "a tuple, list or set of several values",
    "matrix": "a matrix or vector",
    "base": "a number written in another base (e.g. 40_9)",
    "choice": "a multiple-choice letter",
    "text": "a word or phrase, not a number",
    "expression": "a symbolic expression (radicals, pi, variables, complex numbers, ...)",
    "too_large": "an integer outside the int64 range",
    "spaced_digits": "digit groups separated only by spaces (e.g. 12 345): a number or a list, ambiguous",
    "missing_problem": "the problem text is missing or blank",
    "problem_too_long": "the problem text is longer than curate.max_problem_chars",
    "missing_answer": "no final answer could be found in the row (no '####' line / no \\boxed{})",
    "bad_encoding": "the row's text is not valid UTF-8",
    "unparseable": "the row could not be parsed (malformed JSON line, wrong cell type, ...)",
    "duplicate": "the same normalised problem was already kept from an earlier row",
    "conflicting_answers": "the same normalised problem appears with different integer answers",
}

# A rewrite hook (the paper's manual "find a+b+c" rewriting, sec. 3.5): given (problem, raw
# answer) it returns (possibly rewritten problem, integer answer), or None to pass.
AnswerRewrite = Callable[[str, str], "tuple[str, int] | None"]


@dataclass(frozen=True)
class AnswerVerdict:
    """Outcome of converting one raw answer.

    ``value`` is the integer when the answer is one, else None and ``reason_code`` (a key of
    ``REASON_CODES``) with ``reason`` (a human message quoting the answer) say why.
    """

    value: int | None
    reason_code: str | None
    reason: str


@dataclass(frozen=True)
class ProblemVerdict:
    """Outcome of converting one (problem, answer) pair, rewrite hooks included.

    ``problem`` is the text to train on (a rewrite hook may have changed it); ``rewritten_by`` is
    the index of the hook that produced the answer, or None when the built-in conversion did.
    """

    problem: str
    value: int | None
    reason_code: str | None
    reason: str
    rewritten_by: int | None


# ----------------------------------------------------------------------------- problem identity


def normalize_problem_text(text: str) -> str:
    """The text two copies of a problem share: NFKC, one space per whitespace run, stripped.

    Case is kept (``$A$`` and ``$a$`` are different variables). Used for deduplication: the
    published DAPO-Math-17K repeats each problem ~100 times with identical text.
    """
    return " ".join(unicodedata.normalize("NFKC", text).split())


def problem_id(text: str) -> str:
    """sha256 of the normalised problem text, first 16 hex chars (the Problem shard key)."""
    return hashlib.sha256(normalize_problem_text(text).encode("utf-8")).hexdigest()[:16]


def hash_fraction(key: str, salt: int) -> float:
    """A uniform number in [0, 1) from ``key`` and ``salt``; stable across runs and machines."""
    digest = hashlib.sha256(f"{salt}|{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_for(problem_key: str, test_fraction: float, salt: int) -> str:
    """``"test"`` for a deterministic ``test_fraction`` of keys, else ``"train"``.

    Hashing the problem id (not the row position) keeps a problem in the same split whatever
    file or order it arrives in.
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    return "test" if hash_fraction(problem_key, salt) < test_fraction else "train"


# ----------------------------------------------------------------------------- prompts


def render_prompt(template: str, problem: str) -> str:
    """Put ``problem`` into ``template`` at ``{problem}``.

    Plain replacement, not ``str.format``: problems are LaTeX and full of braces.
    """
    if PROBLEM_PLACEHOLDER not in template:
        raise ValueError(f"prompt template has no {PROBLEM_PLACEHOLDER} placeholder: {template!r}")
    return template.replace(PROBLEM_PLACEHOLDER, problem)


def unwrap_prompt(prompt: str, template: str = DAPO_PROMPT_TEMPLATE) -> str | None:
    """The bare problem inside a prompt rendered with ``template``, or None if it does not match."""
    head, _, tail = template.partition(PROBLEM_PLACEHOLDER)
    if len(prompt) >= len(head) + len(tail) and prompt.startswith(head) and prompt.endswith(tail):
        return prompt[len(head) : len(prompt) - len(tail)]
    return None


# ----------------------------------------------------------------------------- answer extraction

# One boxed extractor for curation and the reward (dapo_core.answer_text): the name readers use.
extract_boxed = last_boxed_content


def extract_gsm8k_answer(solution: str) -> str | None:
    """The final answer of a GSM8K solution: the text after the last ``####``."""
    if "####" not in solution:
        return None
    return solution.rsplit("####", 1)[1].strip()


# ----------------------------------------------------------------------------- integer conversion
# Wrappers, Unicode digits, thousands separators and plain integers are read by dapo_core.answer_text,
# the code the reward reads model answers with, so a gold is always a value the reward can pay.

_LONG_DIGITS_RE = re.compile(rf"\d{{{MAX_INTEGER_DIGITS + 1}}}")
_DECIMAL_RE = re.compile(r"([+-]?\d*)\.(\d+)")
# \frac{a}{b}, \dfrac{a}{b}, \tfrac{a}{b}, \frac{a}b, \frac ab (single digits), a/b
_FRAC_RES = (
    re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{([+-]?\d+)\}"),
    re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}(\d)"),
    re.compile(r"([+-]?)\\[dt]?frac(\d)(\d)"),
    re.compile(r"([+-]?)(\d+)/(\d+)"),
)
_MIXED_RE = re.compile(r"[+-]?\d+\s*\\[dt]?frac")
_BASE_RE = re.compile(r"\d+_\{?\d+\}?")
_CHOICE_RE = re.compile(r"\(?[A-Ea-e]\)?")
_TEXT_RE = re.compile(r"[A-Za-z][A-Za-z ']*")
# Degrees do not change an integer's value (percent signs are dropped by drop_percent_signs).
_DEGREES_SUFFIX_RE = re.compile(r"(?:\^\s*\{?\\circ\}?|°)$")
# A comma with whitespace beside it separates list entries ("5, 125", "1 ,000"): written ", ".
_LIST_COMMA_RE = re.compile(r"\s*,\s+|\s+,\s*")
# Digit groups separated only by spacing ("12 345", "12\\;345"): thousands or a list? Ambiguous.
_SPACED_DIGITS_RE = re.compile(r"\d\s+\d")
# Whitespace that joins nothing ("- 7", "\\frac{68}{ 2}"); the space after a list comma stays.
_LAYOUT_SPACE_RE = re.compile(r"(?<!,)\s+")


def _checked_int(value: int, raw: str) -> AnswerVerdict:
    if abs(value) > INT64_MAX:
        return AnswerVerdict(None, "too_large", f"answer {raw!r} does not fit in int64")
    return AnswerVerdict(value, None, "integer")


def _reject(code: str, raw: str) -> AnswerVerdict:
    return AnswerVerdict(None, code, f"answer {raw!r} is {REASON_CODES[code]}")


def to_integer_answer(raw: str | None) -> AnswerVerdict:
    """Convert a raw answer string to an integer, or say why it is not one.

    Accepted: ``"34"``, ``"-7"``, ``"1,000"`` / ``"1{,}000"`` / ``"10,\\!000"`` (a separator is
    directly followed by three digits), ``"34.0"``, ``"\\boxed{34}"``, ``"$-7$"``, ``"\\frac{68}{2}"``
    (exact division), ``"34^\\circ"`` / ``"34\\%"`` (unit dropped: a percent is of its own number),
    Unicode digits and minus signs (read as ASCII, as the reward reads them). A comma with a space
    beside it separates a list (``"5, 125"``: ``tuple``); digit groups separated only by spacing
    (``"12 345"``) are ambiguous (``spaced_digits``). Everything else is rejected with a reason code
    from ``REASON_CODES``.
    """
    if raw is None or not raw.strip():
        return _reject("empty", "" if raw is None else raw)
    text = strip_wrappers(drop_percent_signs(ascii_numerals(raw)))
    text = _DEGREES_SUFFIX_RE.sub("", text).strip()
    # Separators first ("1\\,000" is one number), then spacing, lists and layout.
    text = latex_spacing_to_spaces(strip_thousands_separators(text))
    text = _LIST_COMMA_RE.sub(", ", text).strip()
    if _SPACED_DIGITS_RE.search(text):
        return _reject("spaced_digits", raw)
    compact = _LAYOUT_SPACE_RE.sub("", text)
    if not compact:
        return _reject("empty", raw)
    value = integer_value(compact)
    if value is not None:
        return _checked_int(value, raw)
    if _LONG_DIGITS_RE.search(compact):  # more digits than int() reads: certainly beyond int64
        return _reject("too_large", raw)
    decimal = _DECIMAL_RE.fullmatch(compact)
    if decimal:
        whole, fraction = decimal.groups()
        if set(fraction) == {"0"} and whole not in ("", "+", "-"):
            return _checked_int(int(whole), raw)
        return _reject("not_integer_decimal", raw)
    for pattern in _FRAC_RES:
        frac = pattern.fullmatch(compact)
        if frac:
            sign, numerator, denominator = frac.group(1), int(frac.group(2)), int(frac.group(3))
            if denominator != 0 and numerator % denominator == 0:
                value = numerator // denominator
                return _checked_int(-value if sign == "-" else value, raw)
            return _reject("not_integer_fraction", raw)
    return _classify_non_integer(compact, raw)


def _classify_non_integer(compact: str, raw: str) -> AnswerVerdict:
    """Pick the reason code for an answer that is not an integer in any accepted form."""
    if "matrix" in compact:
        return _reject("matrix", raw)
    if "\\cup" in compact or "\\infty" in compact or "\\in" in compact:
        return _reject("interval", raw)
    if len(compact) >= 2 and compact[0] in "([" and compact[-1] in ")]" and "," in compact:
        # "[a,b]", "(a,b]" and "[a,b)" are intervals; "(a,b)" is read as a tuple/point.
        return _reject("tuple" if (compact[0], compact[-1]) == ("(", ")") else "interval", raw)
    if _MIXED_RE.match(compact):
        return _reject("not_integer_fraction", raw)
    if _BASE_RE.fullmatch(compact):
        return _reject("base", raw)
    if _CHOICE_RE.fullmatch(compact) and compact.strip("()").isupper():
        return _reject("choice", raw)
    if "," in compact or compact.startswith("\\{"):
        return _reject("tuple", raw)
    plain = strip_wrappers(compact)
    if _TEXT_RE.fullmatch(plain) and len(plain) > 1:
        return _reject("text", raw)
    return _reject("expression", raw)


def convert_problem_answer(
    problem: str, raw_answer: str | None, rewrites: Sequence[AnswerRewrite] = ()
) -> ProblemVerdict:
    """Convert (problem, raw answer): rewrite hooks first, in order, then ``to_integer_answer``.

    A hook may turn a non-integer answer into an integer one by rewriting the question, as the
    DAPO authors did ("...find a+b+c", sec. 3.5); the first hook returning a pair wins.
    """
    if raw_answer is not None:
        for index, rewrite in enumerate(rewrites):
            rewritten = rewrite(problem, raw_answer)
            if rewritten is not None:
                new_problem, value = rewritten
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError(f"answer rewrite #{index} returned {value!r}, not an int")
                verdict = _checked_int(value, raw_answer)
                return ProblemVerdict(new_problem, verdict.value, verdict.reason_code, verdict.reason, index)
    verdict = to_integer_answer(raw_answer)
    return ProblemVerdict(problem, verdict.value, verdict.reason_code, verdict.reason, None)
