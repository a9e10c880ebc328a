"""Integer-answer conversion, problem identity, splits and prompt rendering (dapo_core.answers)."""

from __future__ import annotations

import hashlib

import pytest

from dapo_core.answers import (
    DAPO_PROMPT_TEMPLATE,
    REASON_CODES,
    convert_problem_answer,
    extract_boxed,
    extract_gsm8k_answer,
    normalize_problem_text,
    problem_id,
    render_prompt,
    split_for,
    to_integer_answer,
    unwrap_prompt,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("34", 34),
        ("-7", -7),
        ("+5", 5),
        ("1,000", 1000),
        ("11,111,111,100", 11111111100),
        ("10{,}080", 10080),  # LaTeX thousands separator
        ("34.0", 34),
        ("-12.000", -12),
        ("\\boxed{34}", 34),
        ("$-7$", -7),
        ("$$\\boxed{ 12 }$$", 12),
        ("\\frac{68}{2}", 34),  # 68 / 2 = 34 exactly
        ("-\\frac{9}{3}", -3),  # -(9 / 3)
        ("\\dfrac{-10}{5}", -2),
        ("6/3", 2),
        ("{42}", 42),
        ("\\text{17}", 17),
        ("336^\\circ", 336),  # degrees: the number of degrees is the answer
        ("25\\%", 25),
        ("  7. ", 7),
        ("\u22125", -5),  # unicode minus sign
        ("10,\\!000", 10000),  # MATH-style thousands separator
        ("1\\,000", 1000),  # thin-space thousands separator
        ("-2,100", -2100),  # a comma directly followed by three digits is a separator
        ("1,000.0", 1000),
        ("- 7", -7),  # spaces that join no digits are layout
        ("\\frac{68}{ 2}", 34),
        ("**34**", 34),  # markdown emphasis, as the reward strips it
        ("\u0663\u0664", 34),  # Arabic-Indic digits read as ASCII (the reward reads them the same)
        ("\uff13\uff14", 34),  # fullwidth digits
        ("\u0663\u0664.\u0660", 34),
        ("\uff0d\uff17", -7),  # fullwidth minus
    ],
)
def test_integer_forms_convert(raw: str, expected: int) -> None:
    verdict = to_integer_answer(raw)
    assert verdict.reason_code is None, verdict.reason
    assert verdict.value == expected


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("", "empty"),
        ("   ", "empty"),
        (None, "empty"),
        ("\\frac{14}{3}", "not_integer_fraction"),  # 14 / 3 = 4.67
        ("\\frac{270}7", "not_integer_fraction"),
        ("-\\frac{3}{8}", "not_integer_fraction"),
        ("137\\frac{1}{2}", "not_integer_fraction"),  # a mixed number
        ("\\frac{1}{0}", "not_integer_fraction"),
        ("5.4", "not_integer_decimal"),
        ("0.35625", "not_integer_decimal"),
        ("(2,\\infty)", "interval"),
        ("(3,4]", "interval"),
        ("(0,9)\\cup(9,36)", "interval"),
        ("x\\in[-2,7]", "interval"),
        ("(3, \\frac{\\pi}{2})", "tuple"),
        ("(1,-16,-4,43)", "tuple"),
        ("3,5,7", "tuple"),
        ("-2,1", "tuple"),
        # A comma followed by a space separates list entries, never thousands (issue 45: these were
        # the golds 5125 and -2100, which the reward could never pay for the right answer).
        ("5, 125", "tuple"),
        ("-2, 100", "tuple"),
        ("1, 000", "tuple"),
        ("1 ,000", "tuple"),
        # Digit groups separated only by spacing: thousands or a list? Ambiguous, so rejected.
        ("12 345", "spaced_digits"),
        ("1 000 000", "spaced_digits"),
        ("12\\;345", "spaced_digits"),
        ("12\\,5", "spaced_digits"),
        ("2 3/4", "spaced_digits"),  # a mixed number, not 23/4
        ("\\begin{pmatrix}-18\\\\-49\\end{pmatrix}", "matrix"),
        ("40_9", "base"),
        ("4210_{5}", "base"),
        ("{(B)}", "choice"),
        ("{Evelyn}", "text"),
        ("\\text{east}", "text"),
        ("2\\sqrt{5}", "expression"),
        ("\\pi", "expression"),
        ("1+2i", "expression"),
        ("2k+2", "expression"),
        ("p-q", "expression"),
        ("864^2", "expression"),
        ("20000000000000000000000", "too_large"),  # > 2**63 - 1 = 9223372036854775807
    ],
)
def test_non_integer_forms_are_rejected_with_a_reason(raw: str | None, code: str) -> None:
    verdict = to_integer_answer(raw)
    assert verdict.value is None
    assert verdict.reason_code == code
    assert verdict.reason_code in REASON_CODES
    if raw and raw.strip():
        assert repr(raw) in verdict.reason  # the message quotes the offending answer


def test_a_blank_answers_reason_reads_as_a_sentence() -> None:
    assert to_integer_answer("").reason == "answer '' is missing or blank"


def test_int64_bounds() -> None:
    assert to_integer_answer("9223372036854775807").value == 2**63 - 1
    assert to_integer_answer("9223372036854775808").reason_code == "too_large"
    # More digits than int() reads (4300) is a reason, not a crash (it raised ValueError).
    assert to_integer_answer("1" * 5000).reason_code == "too_large"
    assert to_integer_answer("1" * 5000 + ".0").reason_code == "too_large"


def test_rewrite_hooks_are_tried_first_in_order() -> None:
    # A hook in the spirit of the paper's rewriting: "(a+sqrt(b))/c" -> "find a+b+c".
    def find_sum(problem: str, answer: str) -> tuple[str, int] | None:
        if answer == "\\frac{1+\\sqrt{5}}{2}":
            return problem + " Write it as (a+sqrt(b))/c and find a+b+c.", 1 + 5 + 2  # = 8
        return None

    def never(problem: str, answer: str) -> tuple[str, int] | None:
        return None

    verdict = convert_problem_answer("Find phi.", "\\frac{1+\\sqrt{5}}{2}", [never, find_sum])
    assert (verdict.value, verdict.reason_code, verdict.rewritten_by) == (8, None, 1)
    assert verdict.problem.endswith("find a+b+c.")
    # Without the hook it is an expression.
    plain = convert_problem_answer("Find phi.", "\\frac{1+\\sqrt{5}}{2}")
    assert (plain.value, plain.reason_code, plain.rewritten_by) == (None, "expression", None)
    # Hooks that return junk are a programming error, not a silent reject.
    with pytest.raises(TypeError, match="rewrite #0"):
        convert_problem_answer("p", "1", [lambda p, a: (p, "1")])  # type: ignore[list-item, return-value]


def test_problem_id_is_sha256_of_normalised_text() -> None:
    # "  What is\n 1+1? " normalises to "What is 1+1?" (whitespace runs -> one space, stripped).
    assert normalize_problem_text("  What is\n 1+1? ") == "What is 1+1?"
    expected = hashlib.sha256(b"What is 1+1?").hexdigest()[:16]
    assert problem_id("  What is\n 1+1? ") == expected == problem_id("What is 1+1?")
    assert problem_id("Let $A$ be 1.") != problem_id("Let $a$ be 1.")  # case matters in math
    assert len(expected) == 16


def test_split_is_deterministic_and_roughly_the_fraction() -> None:
    keys = [problem_id(str(i)) for i in range(2000)]
    splits = [split_for(k, 0.25, salt=0) for k in keys]
    # The same split in every process and release (pinned): a held-out problem never moves to train.
    assert splits[:8] == ["train", "test", "train", "train", "test", "train", "train", "train"]
    share = splits.count("test") / len(splits)
    assert 0.22 < share < 0.28  # binomial sd = sqrt(0.25 * 0.75 / 2000) = 0.0097
    assert all(split_for(k, 0.0, 0) == "train" for k in keys[:50])
    assert all(split_for(k, 1.0, 0) == "test" for k in keys[:50])
    assert [split_for(k, 0.25, salt=1) for k in keys] != splits
    with pytest.raises(ValueError, match="test_fraction"):
        split_for(keys[0], 1.5, 0)


def test_render_and_unwrap_prompt() -> None:
    problem = "Find $\\{x\\}$ if {x} = 2."  # braces must survive (no str.format)
    prompt = render_prompt(DAPO_PROMPT_TEMPLATE, problem)
    assert prompt.startswith("Solve the following math problem step by step.")
    assert "\n\nFind $\\{x\\}$ if {x} = 2.\n\nRemember to put your answer" in prompt
    assert prompt.endswith('after "Answer:".')
    assert unwrap_prompt(prompt) == problem
    assert unwrap_prompt("just a problem") is None
    assert render_prompt("{problem}=\n", "37+5-18") == "37+5-18=\n"
    with pytest.raises(ValueError, match="placeholder"):
        render_prompt("no placeholder", "x")


def test_extractors() -> None:
    assert extract_boxed("so $6^3=\\boxed{216}$ cubic inches") == "216"
    assert extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # last, nested braces
    assert extract_boxed("no box") is None
    # One boxed extractor for curation and the reward: the same spellings read the same way.
    assert extract_boxed("\\boxed {34}") == "34"
    assert extract_boxed("\\boxed 5.") == "5"
    assert extract_boxed("\\boxed{7} and \\boxed{8") == "7"  # an unclosed box is skipped
    assert extract_gsm8k_answer("9 * 2 = 18\n#### 1,018") == "1,018"
    assert extract_gsm8k_answer("no marker") is None
