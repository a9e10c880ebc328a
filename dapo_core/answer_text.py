"""Reading a number out of answer text: the one implementation curation and the reward share.

Curation (`dapo_core.answers.to_integer_answer`) turns a data set's raw answer into an integer
gold; the rule reward (`dapo_core.answer_extraction`, `dapo_core.rewards`) reads a model's final
answer. When the two read the same text differently, a right answer scores -1 for ever (the gold
"5, 125" once became 5125, which the answer "5, 125" can never match). So each idea is written once,
here, and both sides call it:

- `ascii_numerals`: Unicode decimal digits (Arabic-Indic, fullwidth, Devanagari, ...) become ASCII
  digits and Unicode minus signs and dashes become "-". The rule for such digits is "normalise, on
  both sides", never "reject": "٣٤" is the gold 34 and the answer 34.
- `strip_wrappers`: math delimiters, markdown emphasis, a final period and a `\\boxed{}` / `\\text{}`
  / brace group holding the whole answer.
- `last_boxed_content`: the last complete `\\boxed{...}` (or `\\fbox{...}`).
- `strip_thousands_separators`: "1,234", "1{,}234", "1\\,234", "10,\\!000" -> plain digits. A
  separator is followed directly by exactly three digits, so "5, 125" stays a list.
- `integer_value`: the integer a text plainly states, or None.
- `drop_percent_signs`: a percent is a percent of its own number ("34\\%" is 34), a unit like cm.

Stdlib only. The reward runs these on untrusted model output, so every regex is linear-time.
"""

from __future__ import annotations

import re
import unicodedata

# Python refuses int() on strings longer than 4300 digits (sys.int_info.default_max_str_digits);
# longer "integers" are left to the slow path (math-verify in the reward, "too_large" in curation).
MAX_INTEGER_DIGITS: int = 4000

_SIGNS: dict[str, str] = {"\u2212": "-", "\u2013": "-", "\u2014": "-", "\ufe63": "-", "\uff0d": "-", "\uff0b": "+"}

# Math delimiters and markdown around an answer, removed in pairs from both ends.
_DELIMITERS: tuple[tuple[str, str], ...] = (("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"), ("`", "`"))
# A formatting command whose argument is the whole answer.
_WHOLE_COMMAND_RE = re.compile(r"\\(?:boxed|fbox|text|textbf|mathrm|mbox)\s*\{(.*)\}", re.S)
# \left( ... \right) size their brackets; nothing else. The lookahead keeps \leftarrow.
_SIZING_RE = re.compile(r"\\(?:left|right)(?![A-Za-z])")

_BOX_RE = re.compile(r"\\(?:boxed|fbox)")
# `\boxed 5`: the value runs to the next space or `$`.
_UNBRACED_TOKEN_RE = re.compile(r"[^\s$]+")

# A thousands separator: `,`, LaTeX `{,}`, thin space `\,` or MATH's `,\!`, each followed by exactly
# three digits, and the whole number not continued by more digits or another group (so "12,345,67" is
# a list, not a number), nor preceded by a digit, comma or decimal point.
_SEPARATOR = r"(?:,\\!|,|\{,\}|\\,)"
_THOUSANDS_RE = re.compile(rf"(?<![\d,.])[+-]?\d{{1,3}}(?:{_SEPARATOR}\d{{3}})+(?!\d|{_SEPARATOR}\d)")
_SEPARATOR_RE = re.compile(_SEPARATOR)

_INTEGER_RE = re.compile(r"[+-]?[0-9]+")
# LaTeX spacing: \quad, \qquad, \, \; \: \! "\ " and ~.
LATEX_SPACING_RE = re.compile(r"\\(?:q?quad(?![A-Za-z])|[,;:! ])|~")
_PERCENT_RE = re.compile(r"\\?%")


def ascii_numerals(text: str) -> str:
    """`text` with Unicode decimal digits as ASCII digits and Unicode minus/plus signs as "-"/"+".

    Only decimal digits (category Nd) are mapped: superscripts such as "²" are exponents, not digits.
    """
    if text.isascii():
        return text
    return "".join(_ascii_char(char) for char in text)


def _ascii_char(char: str) -> str:
    if char in _SIGNS:
        return _SIGNS[char]
    digit = unicodedata.decimal(char, None)
    return char if digit is None or char.isascii() else str(digit)


def balanced(text: str, open_: str = "{", close: str = "}") -> bool:
    """True when every ``close`` in ``text`` matches an earlier ``open_`` and none is left open."""
    depth = 0
    for char in text:
        depth += 1 if char == open_ else -1 if char == close else 0
        if depth < 0:
            return False
    return depth == 0


def strip_wrappers(text: str) -> str:
    """Remove what surrounds an answer: delimiters, emphasis, a final period, a whole-answer wrapper.

    Repeated until nothing changes: whitespace; a final period (not an ellipsis ".."); `$...$` (any
    number of dollars), `\\(...\\)`, `\\[...\\]`, `**...**`, backticks; `\\boxed{}`, `\\fbox{}`,
    `\\text{}`, `\\textbf{}`, `\\mathrm{}`, `\\mbox{}` or a brace group holding the whole answer;
    stray `*` at the ends ("**Answer:** 34" leaves "** 34"). A wrapper is removed only when the
    braces inside it balance, so "\\boxed{35} \\boxed{34}" keeps both boxes. Also drops `\\left` /
    `\\right` and reads LaTeX's `{,}` as a comma. Digits, spacing and separators are left as they are.
    """
    text = _SIZING_RE.sub("", text).replace("{,}", ",")
    previous = None
    while previous != text:
        previous = text
        text = text.strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].strip()
        text = _strip_one_wrapper(text)
    return text


def _strip_one_wrapper(text: str) -> str:
    if len(text) >= 2 and text.startswith("$") and text.endswith("$") and balanced(text.strip("$")):
        return text.strip("$")
    for left, right in _DELIMITERS:
        inner = text[len(left) : len(text) - len(right)]
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right) and balanced(inner):
            return inner
    whole = _WHOLE_COMMAND_RE.fullmatch(text)
    if whole is not None and balanced(whole.group(1)):
        return whole.group(1)
    if text.startswith("{") and text.endswith("}") and balanced(text[1:-1]):
        return text[1:-1]
    return text.strip("*")


def match_braces(text: str, open_index: int) -> int | None:
    """Index just past the `}` matching the `{` at `open_index`, or None if unbalanced."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def last_boxed_content(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` (or `\\fbox{...}`) in `text`, else None.

    Braces are matched (`\\boxed{\\frac{1}{2}}`), space before the brace is allowed (`\\boxed {34}`),
    and `\\boxed 34` (no braces) yields "34". A truncated text can end inside an unclosed box; that
    one is skipped and the previous complete box is used.
    """
    boxes = list(_BOX_RE.finditer(text))
    for box in reversed(boxes):
        after = box.end()
        brace = after
        while brace < len(text) and text[brace] in " \t":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            end = match_braces(text, brace)
            if end is not None:
                return text[brace + 1 : end - 1]
        elif after < len(text) and text[after] == " ":
            token = _UNBRACED_TOKEN_RE.match(text, brace)
            if token is not None:
                return token.group(0).rstrip(".")
    return None


def strip_thousands_separators(text: str) -> str:
    """Remove thousands separators from the numbers in `text`: "1,234", "1{,}234", "10,\\!000" -> digits.

    A separator is followed directly by exactly three digits and every group of the number has
    three, so lists such as "12,13", "5, 125" or "12,345,67" are left alone.
    """
    return _THOUSANDS_RE.sub(lambda match: _SEPARATOR_RE.sub("", match.group(0)), text)


def integer_value(text: str) -> int | None:
    """The integer `text` plainly states ("34", "-7", "+12", "1,234", "٣٤"), else None.

    Surrounding whitespace is ignored, internal whitespace is not: "12 345" is two numbers (or one
    written ambiguously), never 12345. Anything else ("34.0", "\\frac{68}{2}", "x = 34") is None.
    """
    text = strip_thousands_separators(ascii_numerals(text).strip())
    if len(text) > MAX_INTEGER_DIGITS or _INTEGER_RE.fullmatch(text) is None:
        return None
    return int(text)


def latex_spacing_to_spaces(text: str) -> str:
    """Replace LaTeX spacing commands (`\\,`, `\\;`, `\\!`, `\\quad`, `~`, ...) by plain spaces."""
    return LATEX_SPACING_RE.sub(" ", text)


def drop_percent_signs(text: str) -> str:
    """Replace each percent sign (`\\%` or `%`) by a space: "34\\%" states 34, never 0.34.

    A percent is read as a unit of its own number, so one string pays one gold ("3400\\%" pays 3400,
    not 34). A space, not nothing, so "34%35" stays two numbers.
    """
    return _PERCENT_RE.sub(" ", text)
