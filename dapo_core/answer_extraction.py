"""Final-answer extraction from model responses, and the cheap text checks around it.

Pure string functions (stdlib only) used by the rule reward in `dapo_core.rewards`:

- `extract_answer` reads the answer the way the DAPO data asks for it: the prompt tells the
  model to end with a line `Answer: $Answer`, and the official DAPO scorer reads the *last*
  `Answer:` inside the last 300 characters of the response. Responses that never wrote such a
  line but did write `\\boxed{...}` (the habit of most math-tuned models) fall back to the last
  complete `\\boxed{}`.
- `integer_value` / `gold_integer` power the exact integer fast path (no math-verify needed
  when both sides are plain integers).
- `looks_hedged` flags answers that offer several values ("12 or 13", "12, 13", "12 \\lor 13",
  "33 34"), a cheap way to farm a +1 from a rule reward (reward hacking).

Everything here runs on untrusted model output in the trainer process, so every regex is
linear-time (no nested quantifiers over the same characters) and the expensive scans are
bounded by `ANSWER_WINDOW_CHARS`.
"""

from __future__ import annotations

import re

# The official DAPO scorer only looks at the tail of a response: an `Answer:` written early
# (e.g. while restating the task) must not count, and the scan stays O(300) on huge outputs.
ANSWER_WINDOW_CHARS: int = 300

# Python refuses int() on strings longer than this (sys.int_info.default_max_str_digits = 4300);
# longer "integers" are left to math-verify, which runs under a timeout in a worker.
_MAX_FAST_PATH_DIGITS: int = 4000

# `Answer` then `:`; the value may start on the next line ("Answer:\n34"), as the official
# scorer also allows. Case-insensitive so "ANSWER:" / "answer:" count.
_ANSWER_RE = re.compile(r"answer[ \t]*:[ \t]*(?:\n[ \t]*)?([^\n]*)", re.IGNORECASE)

# Decorations models put around the value; removed from both ends only.
_WRAPPERS: tuple[tuple[str, str], ...] = (
    ("$$", "$$"),
    ("\\(", "\\)"),
    ("\\[", "\\]"),
    ("$", "$"),
    ("**", "**"),
    ("`", "`"),
)

_UNICODE_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})

# A number written with thousands separators: `,`, LaTeX `{,}` or thin space `\,`, each
# followed by exactly three digits, and not continued by more digits or another short group
# (so "12,345,67" is a list, not a number). Not preceded by a digit, comma or decimal point.
_THOUSANDS_RE = re.compile(
    r"(?<![\d,.])[+-]?\d{1,3}(?:(?:,|\{,\}|\\,)\d{3})+(?!\d|,\d|\{,\}\d|\\,\d)"
)
_SEPARATOR_RE = re.compile(r",|\{,\}|\\,")

_INTEGER_RE = re.compile(r"[+-]?\d+")
# `\boxed 5`: the value runs to the next space or `$`.
_UNBRACED_TOKEN_RE = re.compile(r"[^\s$]+")

# Connectives and symbols that offer more than one value. `\b` keeps "\lor", "for", "\operatorname"
# from matching the words.
_HEDGE_WORD_RE = re.compile(r"\b(?:or|and)\b", re.IGNORECASE)
_HEDGE_SYMBOL_RE = re.compile(r"\\(?:lor|vee|land|wedge|pm|mp)(?![a-zA-Z])|[;\u00b1\u2213]")
# Two numbers separated only by spacing ("33 34", "34 \quad 35"): math-verify reads these as a
# product or a sum, which a policy could exploit.
_JUXTAPOSED_RE = re.compile(r"\d(?:\s|~|\\[,;:! ]|\\q?quad(?![a-zA-Z]))+[+-]?\.?\d")


def _strip_wrappers(text: str) -> str:
    """Remove surrounding whitespace, markdown/LaTeX delimiters and a final period."""
    previous = None
    while previous != text:
        previous = text
        text = text.strip()
        for left, right in _WRAPPERS:
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left) : len(text) - len(right)]
        # "**Answer:** 34" leaves a stray "**" in front of the value.
        text = text.lstrip("*").rstrip("*")
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1]
    return text


def _match_braces(text: str, open_index: int) -> int | None:
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

    A truncated response can end inside an unclosed box; that one is skipped and the previous
    complete box is used. `\\boxed 34` (no braces) yields "34".
    """
    search_end = len(text)
    while True:
        boxed_at = text.rfind("\\boxed", 0, search_end)
        fbox_at = text.rfind("\\fbox", 0, search_end)
        start = max(boxed_at, fbox_at)
        if start < 0:
            return None
        after = start + (len("\\boxed") if start == boxed_at else len("\\fbox"))
        if after < len(text) and text[after] == "{":
            end = _match_braces(text, after)
            if end is not None:
                return text[after + 1 : end - 1]
        elif after < len(text) and text[after] == " ":
            token = _UNBRACED_TOKEN_RE.match(text, after + 1)
            if token is not None:
                return token.group(0).rstrip(".")
        search_end = start


def clean_answer(raw: str) -> str | None:
    """Normalise an extracted answer string; None when nothing is left.

    Removes delimiters (`$`, `\\(`, `**`...), a final period, a whole-answer `\\boxed{}` and
    stray `$` (currency), and maps Unicode minus signs to `-`.
    """
    text = _strip_wrappers(raw.translate(_UNICODE_MINUS))
    if text.startswith("\\boxed") or text.startswith("\\fbox"):
        inner = last_boxed_content(text)
        if inner is not None:
            text = _strip_wrappers(inner)
    text = text.replace("$", "").strip()
    return text or None


def extract_answer(response: str) -> str | None:
    """The final answer a response commits to, or None if it gives none.

    1. The last `Answer:` within the last `ANSWER_WINDOW_CHARS` characters; the value is the
       rest of that line (or the next line when the line is empty), cleaned by `clean_answer`.
    2. Otherwise the content of the last complete `\\boxed{}` anywhere in the response.
    """
    window = response[-ANSWER_WINDOW_CHARS:]
    matches = _ANSWER_RE.findall(window)
    if matches:
        answer = clean_answer(matches[-1])
        if answer is not None:
            return answer
    boxed = last_boxed_content(response)
    if boxed is None:
        return None
    return clean_answer(boxed)


def strip_thousands_separators(answer: str) -> str:
    """Remove thousands separators from numbers in `answer`: "1,234" and "1{,}234" -> "1234".

    A comma is only a separator when every group after it has exactly three digits, so lists
    such as "12,13" or "12, 345" are left alone (and later judged as hedges).
    """
    return _THOUSANDS_RE.sub(lambda match: _SEPARATOR_RE.sub("", match.group(0)), answer)


def integer_value(answer: str) -> int | None:
    """The integer an answer plainly states ("34", "-7", "+12", "1,234"), else None.

    Anything else ("34.0", "\\frac{68}{2}", "x = 34") returns None and is left to math-verify.
    """
    # Internal spaces are NOT removed: "12 13" is a hedge, not 1213.
    text = strip_thousands_separators(answer.strip().translate(_UNICODE_MINUS))
    if len(text) > _MAX_FAST_PATH_DIGITS or _INTEGER_RE.fullmatch(text) is None:
        return None
    return int(text)


def gold_integer(gold: str | int) -> int | None:
    """The gold answer as an int when it is one (an int, or a string of one), else None."""
    if isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return gold
    text = gold.strip().translate(_UNICODE_MINUS)
    if len(text) > _MAX_FAST_PATH_DIGITS or _INTEGER_RE.fullmatch(text) is None:
        return None
    return int(text)


def looks_hedged(answer: str) -> bool:
    """True when the answer text offers more than one value.

    Used only when the gold answer is a single value. After thousands separators are removed,
    a comma, a semicolon, "or"/"and", `\\lor`/`\\vee`/`\\pm`, or two numbers separated only
    by spacing all count as hedging. "1,234" is one number and is not a hedge.
    """
    text = strip_thousands_separators(answer.translate(_UNICODE_MINUS))
    return (
        "," in text
        or _HEDGE_WORD_RE.search(text) is not None
        or _HEDGE_SYMBOL_RE.search(text) is not None
        or _JUXTAPOSED_RE.search(text) is not None
    )
