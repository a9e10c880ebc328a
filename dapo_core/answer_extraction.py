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
  when both sides are plain integers). How a number is read (wrappers, `\\boxed{}`, thousands
  separators, Unicode digits) is `dapo_core.answer_text`'s, the code curation makes golds with, so
  the reward pays exactly the gold curation made of the same text.
- `looks_hedged` flags a value that offers several values by its math ("12, 13", "12 \\lor 13",
  "12 \\pm 1", "33 34"), a cheap way to farm a +1 from a rule reward (reward hacking).

Everything here runs on untrusted model output in the trainer process, so every regex is
linear-time (no nested quantifiers over the same characters) and the expensive scans are
bounded by `ANSWER_WINDOW_CHARS`.
"""

from __future__ import annotations

import re

from dapo_core.answer_text import (
    LATEX_SPACING_RE,
    MAX_INTEGER_DIGITS,
    ascii_numerals,
    drop_percent_signs,
    last_boxed_content,
    match_braces,
    strip_thousands_separators,
    strip_wrappers,
)
from dapo_core.answer_text import integer_value as integer_value  # re-exported for the reward's fast path

# The official DAPO scorer only looks at the tail of a response: an `Answer:` written early
# (e.g. while restating the task) must not count, and the scan stays O(300) on huge outputs.
ANSWER_WINDOW_CHARS: int = 300

# The official scorer's answer line: `Answer`, `:`, then the rest of the first non-empty line after
# it. `\s*` spans blank lines ("Answer:\n\n34") and a capture is never empty, so an empty last
# "Answer:" line does not hide the answer above it. Case-insensitive: "ANSWER:" counts.
_ANSWER_RE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

_INTEGER_RE = re.compile(r"[+-]?[0-9]+")

# Connectives and symbols that offer more than one value. `\b` keeps "\lor", "for", "\operatorname"
# from matching the words.
_HEDGE_WORD_RE = re.compile(r"\b(?:or|and)\b", re.IGNORECASE)
# `\\approx` states a second, approximate value ("34 \\approx 35"); LaTeX parsers keep its left side.
# `\\mod` puts a modulus beside the value; the grammar reads "34 \\mod 1000" as the remainder (34),
# so "g \\mod M" would score for any gold g < M (the official scorer's strict match rejects it too).
# `\\equiv` is a relation like `\\approx`: "35 \\equiv 34" (read as an equation, 34) states two values and
# "x \\equiv 34" a congruence, not a value.
_HEDGE_SYMBOL_RE = re.compile(
    r"\\(?:lor|vee|land|wedge|pm|mp|approx|mod|equiv)(?![a-zA-Z])|[;\u00b1\u2213\u2248\u2261]"
)
# Two numbers separated only by spacing, an ellipsis or primes ("33 34", "34 \quad 35", "2 \ldots 0",
# "2' '0"): no operator joins them, so they are two values; the LaTeX grammar reads them as a product,
# a sum or one number (2 \ldots 0 -> 2*0, which is 0; 2'0 -> 20), which a policy could exploit.
_JUXTAPOSED_RE = re.compile(
    r"\d(?:\s|~|'|\\[,;:! ]|\\(?:q?quad|[lcv]?dots|dotsc|dotsb|ldotp|cdotp)(?![a-zA-Z]))+[+-]?\.?\d"
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
# function name, with a unit exponent ("cm^2") when one follows; the article "a"/"A" before a
# word, command or signed number ("a 34", "A total of", "a -5"), but not "a + 1" or "a - 5"; or the
# pronoun "I" standing alone ("34 (I think)"; it is not the imaginary unit, which LaTeX writes "i").
# Neither right after a digit: "34A", "2I" are products.
_PROSE_RE = re.compile(
    r"(?<![\\A-Za-z])"
    r"(?:(?!" + _MATH_WORDS + r"(?![A-Za-z]))[A-Za-z]{2,}(?:\s*\^\s*(?:\{[^{}]*\}|\d+))?"
    r"|(?<![0-9])[aA](?=\s+(?:[A-Za-z0-9\\]|[+-]\d))"
    r"|(?<![0-9])I(?![0-9]))"
    r"(?![A-Za-z])"
)
_LATEX_SPACING_EDGE_RE = re.compile(r"^(?:\s|\\(?:q?quad(?![A-Za-z])|[,;:! ])|~)+|(?:\s|\\(?:q?quad|[,;:! ])|~)+$")
_VALUE_CONTENT_RE = re.compile(r"[0-9A-Za-z]")


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every complete `\\boxed{...}` / `\\fbox{...}` in `text`: (start, end, content), in order.

    Nested boxes count once (the outer one); an unclosed box (a truncated response) is skipped.
    """
    found: list[tuple[int, int, str]] = []
    for match in _BOX_OPEN_RE.finditer(text):
        if found and match.start() < found[-1][1]:
            continue  # inside the previous box
        end = match_braces(text, match.end() - 1)
        if end is not None:
            found.append((match.start(), end, text[match.end() : end - 1]))
    return found


def clean_answer(raw: str) -> str | None:
    """Normalise an extracted answer string; None when nothing is left.

    Reads Unicode digits and minus signs as ASCII, removes escaped dollars (`\\$34`, currency), then
    what `strip_wrappers` removes (delimiters, a final period, a `\\boxed{}` holding the whole
    answer: the same stripper curation uses), then stray `$`. A box that is only part of the answer
    ("\\boxed{35} \\boxed{34}") stays, so that `stated_values` sees every value the line offers.
    """
    text = strip_wrappers(ascii_numerals(raw).replace("\\$", ""))
    text = text.replace("$", " ").strip()
    return text or None


def extract_answer(response: str) -> str | None:
    """The final answer a response commits to, or None if it gives none.

    Only the last `ANSWER_WINDOW_CHARS` characters count, as in the official DAPO scorer: an
    answer written early in a response that then ran on (or was truncated) is no final answer.

    1. The last `Answer:` in that window with something after it, as the official scorer reads it:
       the rest of its line, or the first non-empty line below when its line is empty; cleaned by
       `clean_answer`.
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

    Words ("the answer is", "cm", "otherwise", "instead of", "I think"), `\\text{...}` and its kin are prose:
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
    # Dollars and markdown bold ("**34** (I think)") are layout; a percent is a unit of its own number.
    text = ascii_numerals(answer).replace("\\$", "").replace("$", " ").replace("**", " ")
    text = drop_percent_signs(_unwrap_text_commands(text))
    text = _MATH_DELIMITER_RE.sub(" ", text)
    values: list[str] = []
    for piece in _PROSE_RE.split(text):
        piece = " ".join(_trim_piece(piece).split())  # one space per run: the parser's regexes expect it
        if _VALUE_CONTENT_RE.search(LATEX_SPACING_RE.sub(" ", piece)):
            values.append(piece)
    return values


def _unwrap_text_commands(text: str) -> str:
    """Replace `\\text{...}`, `\\textbf{...}`, `\\boxed{...}` (and kin) by their content, spaced."""
    while True:
        match = _TEXT_COMMAND_RE.search(text)
        if match is None:
            return text
        end = match_braces(text, match.end() - 1)
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


def gold_integer(gold: str | int) -> int | None:
    """The gold answer as an int when it is one (an int, or a string of one), else None."""
    if isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return gold
    text = ascii_numerals(gold).strip()
    if len(text) > MAX_INTEGER_DIGITS or _INTEGER_RE.fullmatch(text) is None:
        return None
    return int(text)


def looks_hedged(answer: str) -> bool:
    """True when the answer text offers more than one value.

    Used only when the gold answer is a single value. After thousands separators are removed,
    a comma, a semicolon, "or"/"and", `\\lor`/`\\vee`/`\\pm`, `\\approx`, `\\mod`, or two numbers
    separated only by spacing or an ellipsis (`\\ldots`) all count as hedging. "1,234" is one
    number and is not a hedge.
    """
    text = strip_thousands_separators(ascii_numerals(answer))
    return (
        "," in text
        or _HEDGE_WORD_RE.search(text) is not None
        or _HEDGE_SYMBOL_RE.search(text) is not None
        or _JUXTAPOSED_RE.search(text) is not None
    )
