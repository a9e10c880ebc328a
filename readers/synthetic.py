"""Synthetic integer-answer arithmetic problems and their worked solutions.

The tiny default pipeline trains on these instead of downloaded data. A problem is a chain of
signed integer terms ("37+5-18"); its worked solution adds the terms one at a time, one line per
partial result, then ends with the DAPO answer line ("Answer: 24"). The number of terms sets both
the difficulty and the length of the worked solution, so a tight response-length cap really
truncates the long ones (what overlong filtering and soft punishment act on, paper sec. 3.4).

A worked solution may also restate its last line a few times before the answer ("check lines",
as long reasoning re-verifies a result it already has): the count is a hash of the problem text,
so a policy warmed up on them cannot predict it from the problem and samples it, and its
responses vary widely in length at the same difficulty (configs/ablation-checks.yaml).
"""

from __future__ import annotations

import hashlib
import random
import re

# Characters the problems, worked solutions and answer line use; the tiny tokenizer's vocabulary.
ALPHABET = "0123456789+-=\n Answer:"
_TERM_RE = re.compile(r"[+-]?\d+")


def make_problem(rng: random.Random, *, min_terms: int, max_terms: int, max_operand: int) -> tuple[str, int]:
    """Draw one problem text such as ``"37+5-18"`` and its integer answer.

    The first term is positive; each later term is added or subtracted with equal chance.
    """
    if min_terms < 2 or max_terms < min_terms:
        raise ValueError(f"need 2 <= min_terms <= max_terms, got {min_terms}, {max_terms}")
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    n_terms = rng.randint(min_terms, max_terms)
    terms = [rng.randint(1, max_operand)]
    for _ in range(n_terms - 1):
        terms.append(rng.randint(1, max_operand) * (1 if rng.random() < 0.5 else -1))
    text = str(terms[0]) + "".join(f"{t:+d}" for t in terms[1:])
    return text, sum(terms)


def parse_terms(problem_text: str) -> list[int]:
    """Split ``"37+5-18"`` into ``[37, 5, -18]``; raises ValueError on anything else."""
    compact = problem_text.replace(" ", "")
    terms = [int(t) for t in _TERM_RE.findall(compact)]
    if not terms or "".join(_TERM_RE.findall(compact)) != compact:
        raise ValueError(f"not a chain of integer terms: {problem_text!r}")
    return terms


def check_line_count(problem_text: str, max_check_lines: int) -> int:
    """How many check lines ``problem_text``'s worked solution carries: 0..``max_check_lines``,
    uniform over problems, fixed by a hash of the text (not by any random stream)."""
    if max_check_lines < 0:
        raise ValueError(f"max_check_lines must be >= 0, got {max_check_lines}")
    return int(hashlib.sha256(problem_text.encode()).hexdigest()[:8], 16) % (max_check_lines + 1)


def worked_solution(problem_text: str, check_lines: int = 0) -> str:
    """The step-by-step response for a problem, ending with the DAPO answer line.

    ``"37+5-18"`` -> ``"37+5=42\\n42-18=24\\nAnswer: 24"``: one line per partial sum; with
    ``check_lines=2`` the last one is restated twice before the answer line.
    """
    terms = parse_terms(problem_text)
    total = terms[0]
    lines = []
    for term in terms[1:]:
        new_total = total + term
        lines.append(f"{total}{term:+d}={new_total}")
        total = new_total
    lines.extend([lines[-1]] * check_lines)
    lines.append(f"Answer: {total}")
    return "\n".join(lines)
