"""Final-answer extraction from model responses, and the cheap text checks around it.

Pure string functions (stdlib only) used by the rule reward in `dapo_core.rewards`:

- `extract_answer` reads the answer the way the DAPO data asks for it: the prompt tells the
  model to end with a line `Answer: $Answer`, and the official DAPO scorer reads the *last*
  `Answer:` inside the last 300 characters of the response. Responses that never wrote such a
  line but did write `\\boxed{...}` (the habit of most math-tuned models) fall back to the last
  complete `\\boxed{}` in that same window; several boxes on that box's line are all kept.
- `stated_values` splits an answer line into the values it states, prose removed. The final
  answer line must state ONE value: "35 otherwise 34" states two, whatever the words between
  them, and is wrong against a single gold value (paper sec. 3.5 chose a rule reward because a
  learned one is hackable; a rule that reads "the last number" is hackable too).
- `integer_value` / `gold_integer` power the exact integer fast path (no math-verify needed
  when both sides are plain integers).
- `looks_hedged` flags a value that offers several values by its math ("12, 13", "12 \\lor 13",
  "12 \\pm 1", "33 34"), a cheap way to farm a +1 from a rule reward (reward hacking).

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
# `\\approx` states a second, approximate value ("34 \\approx 35"); LaTeX parsers keep its left side.
# `\\mod` puts a modulus beside the value; the grammar reads "34 \\mod 1000" as the remainder (34),
# so "g \\mod M" would score for any gold g < M (the official scorer's strict match rejects it too).
_HEDGE_SYMBOL_RE = re.compile(r"\\(?:lor|vee|land|wedge|pm|mp|approx|mod)(?![a-zA-Z])|[;\u00b1\u2213\u2248]")
# Two numbers separated only by spacing or an ellipsis ("33 34", "34 \quad 35", "2 \ldots 0"): no
# operator joins them, so they are two values; the LaTeX grammar reads them as a product or a sum
# (2 \ldots 0 -> 2*0, which is 0), which a policy could exploit.
_JUXTAPOSED_RE = re.compile(
    r"\d(?:\s|~|\\[,;:! ]|\\(?:q?quad|[lcv]?dots|dotsc|dotsb|ldotp|cdotp)(?![a-zA-Z]))+[+-]?\.?\d"
)

_BOX_OPEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Formatting commands whose argument is read as plain text: unwrapped in place by `stated_values`
# so that words inside count as prose and numbers inside as values.
_TEXT_COMMAND_RE = re.compile(
    r"\\(?:text(?:bf|it|rm|sf|tt|normal)?|mbox|math(?:rm|bf|it|sf|tt)|boxed|fbox|overline|emph)\s*\{"
)
_MATH_DELIMITER_RE = re.compile(r"\\[()\[\]]")
# Function names a model may write without their backslash; they are math, not prose.
_MATH_WORDS = r"(?:arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|log|ln|lg|exp|sqrt|pi)"
# Prose: a word of 2+ letters that is not a LaTeX command (no backslash before it) or a math
# function name, with a unit exponent ("cm^2") when one follows; or the article "a" before a
# word, command or signed number ("a 34", "a total of", "a -5"), but not "a + 1" or "a - 5".
_PROSE_RE = re.compile(
    r"(?<![\\A-Za-z])"
    r"(?:(?!" + _MATH_WORDS + r"(?![A-Za-z]))[A-Za-z]{2,}(?:\s*\^\s*(?:\{[^{}]*\}|\d+))?"
    r"|a(?=\s+(?:[A-Za-z0-9\\]|[+-]\d)))"
    r"(?![A-Za-z])"
)
_LATEX_SPACING_RE = re.compile(r"\\(?:q?quad(?![A-Za-z])|[,;:! ])|~")
_LATEX_SPACING_EDGE_RE = re.compile(r"^(?:\s|\\(?:q?quad(?![A-Za-z])|[,;:! ])|~)+|(?:\s|\\(?:q?quad|[,;:! ])|~)+$")
_VALUE_CONTENT_RE = re.compile(r"[0-9A-Za-z]")


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


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every complete `\\boxed{...}` / `\\fbox{...}` in `text`: (start, end, content), in order.

    Nested boxes count once (the outer one); an unclosed box (a truncated response) is skipped.
    """
    found: list[tuple[int, int, str]] = []
    for match in _BOX_OPEN_RE.finditer(text):
        if found and match.start() < found[-1][1]:
            continue  # inside the previous box
        end = _match_braces(text, match.end() - 1)
        if end is not None:
            found.append((match.start(), end, text[match.end() : end - 1]))
    return found


def clean_answer(raw: str) -> str | None:
    """Normalise an extracted answer string; None when nothing is left.

    Removes delimiters (`$`, `\\(`, `**`...), a final period, a `\\boxed{}` that holds the whole
    answer, escaped dollars (`\\$34`, currency) and stray `$`, and maps Unicode minus signs to `-`.
    A box that is only part of the answer ("\\boxed{35} \\boxed{34}") stays, so that
    `stated_values` sees every value the line offers.
    """
    text = _strip_wrappers(raw.translate(_UNICODE_MINUS).replace("\\$", ""))
    boxes = _boxes(text)
    if len(boxes) == 1 and boxes[0][0] == 0 and boxes[0][1] == len(text):
        text = _strip_wrappers(boxes[0][2])
    text = text.replace("$", " ").strip()
    return text or None


def extract_answer(response: str) -> str | None:
    """The final answer a response commits to, or None if it gives none.

    Only the last `ANSWER_WINDOW_CHARS` characters count, as in the official DAPO scorer: an
    answer written early in a response that then ran on (or was truncated) is no final answer.

    1. The last `Answer:` in that window; the value is the rest of that line (or the next line
       when the line is empty), cleaned by `clean_answer`.
    2. Otherwise the content of the last complete `\\boxed{}` in that window. When the line
       holding it holds other boxes too, all of them are returned, comma-separated
       ("\\boxed{35} or \\boxed{34}" -> "35, 34"): a line of boxes offers every boxed value.
    """
    window = response[-ANSWER_WINDOW_CHARS:]
    matches = _ANSWER_RE.findall(window)
    if matches:
        answer = clean_answer(matches[-1])
        if answer is not None:
            return answer
    boxes = _boxes(window)
    if not boxes:
        unbraced = last_boxed_content(window)  # `\\boxed 5`
        return None if unbraced is None else clean_answer(unbraced)
    line_start = window.rfind("\n", 0, boxes[-1][0]) + 1
    on_line = [content for start, _, content in boxes if start >= line_start]
    values = [value for value in (clean_answer(content) for content in on_line) if value is not None]
    return ", ".join(values) or None


def stated_values(answer: str) -> list[str]:
    """The values an answer line states, in order, with the prose around them removed.

    Words ("the answer is", "cm", "otherwise", "instead of"), `\\text{...}` and its kin are prose:
    they are removed and split the line, so "the answer is x = 34 cm" states one value
    ("x = 34") while "35 otherwise 34" or "\\boxed{35} \\boxed{34}" state two. What the words
    are does not matter, only that values stand on both sides of them. A word is two or more
    letters not preceded by a backslash (LaTeX commands are math), except function names such
    as "sin" or "log"; the article "a" before a word or number is prose too ("a 34").
    Brackets and punctuation left dangling by the split ("34 (in cm)") are trimmed; pieces with no
    letter or digit left are not values. Multi-value math inside one piece ("12, 13", "12 \\lor
    13") is `looks_hedged`'s job, and whether a piece is one well-formed expression is the
    parser's.
    """
    text = _unwrap_text_commands(answer.translate(_UNICODE_MINUS).replace("\\$", "").replace("$", " "))
    text = _MATH_DELIMITER_RE.sub(" ", text)
    values: list[str] = []
    for piece in _PROSE_RE.split(text):
        piece = " ".join(_trim_piece(piece).split())  # one space per run: the parser's regexes expect it
        if _VALUE_CONTENT_RE.search(_LATEX_SPACING_RE.sub(" ", piece)):
            values.append(piece)
    return values


def _unwrap_text_commands(text: str) -> str:
    """Replace `\\text{...}`, `\\textbf{...}`, `\\boxed{...}` (and kin) by their content, spaced."""
    while True:
        match = _TEXT_COMMAND_RE.search(text)
        if match is None:
            return text
        end = _match_braces(text, match.end() - 1)
        if end is None:  # unbalanced: drop the command, keep the rest for the parser to judge
            text = f"{text[: match.start()]} {text[match.end() :]}"
        else:
            text = f"{text[: match.start()]} {text[match.end() : end - 1]} {text[end:]}"


def _trim_piece(piece: str) -> str:
    """Strip spacing, sentence punctuation and brackets left open by a prose split from both ends."""
    previous = None
    while previous != piece:
        previous = piece
        piece = _LATEX_SPACING_EDGE_RE.sub("", piece).strip().strip(",;:?=\"'`")
        if piece.endswith(".") and not piece.endswith(".."):
            piece = piece[:-1]
        if piece.endswith(("(", "[")) or piece.startswith((")", "]")):
            piece = piece[:-1] if piece.endswith(("(", "[")) else piece[1:]
        if piece.startswith(("(", "[")) and not _balanced_brackets(piece):
            piece = piece[1:]
        elif piece.endswith((")", "]")) and not _balanced_brackets(piece):
            piece = piece[:-1]
    return piece


def _balanced_brackets(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count("[") == text.count("]")


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
    a comma, a semicolon, "or"/"and", `\\lor`/`\\vee`/`\\pm`, `\\approx`, `\\mod`, or two numbers
    separated only by spacing or an ellipsis (`\\ldots`) all count as hedging. "1,234" is one
    number and is not a hedge.
    """
    text = strip_thousands_separators(answer.translate(_UNICODE_MINUS))
    return (
        "," in text
        or _HEDGE_WORD_RE.search(text) is not None
        or _HEDGE_SYMBOL_RE.search(text) is not None
        or _JUXTAPOSED_RE.search(text) is not None
    )
