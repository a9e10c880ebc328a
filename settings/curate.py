"""Settings of the curation stage (paper sec. 3.5: integer-answer problems)."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_core.answers import (
    DAPO_PROMPT_TEMPLATE,
)
from settings.checks import COUNT_MAX, check_fields, in_range


@dataclass(frozen=True)
class CurateConfig:
    """Settings of the curation stage."""

    prompt_template: str = DAPO_PROMPT_TEMPLATE
    """Template rendered into Problem.prompt; ``{problem}`` marks the problem (tiny run: "{problem}=\\n")."""
    test_fraction: float = 0.0
    """Share of problems put in the ``test`` split, by a hash of problem_id, for inputs without ``@train``/``@test``."""
    split_seed: int = 0
    """Salt of that hash: change it to draw a different, still deterministic, split."""
    dedup: bool = True
    """Keep one row per normalised problem text (off: keep every copy, e.g. to mimic the upstream 100x repeats)."""
    rows_per_shard: int = 100_000
    """Maximum rows per Parquet shard."""
    answer_rewrites: tuple[str, ...] = ()
    """``module:function`` hooks tried before the built-in integer conversion (see dapo_core.answers.AnswerRewrite).
    This is also where a model-based rewriter would plug in; none ships, so it is off by default."""
    max_problem_chars: int = 16_000
    """Longer problems are rejected (``problem_too_long``) here, not when a rollout draws them and
    its prompt overflows the model's context. DAPO-Math-17K's longest prompt is 3,398 characters."""
    rewrite_answers: bool = True
    """Rewrite fraction, decimal, radical, pi, complex, base, tuple, list and interval answers into
    integer-answer problems by rule (dapo_core.answer_rewrite, paper sec. 3.5); off: reject them."""

    def __post_init__(self) -> None:
        check_fields(self, {
            "prompt_template": ("{problem}" in self.prompt_template, "must contain {problem}"),
            "test_fraction": (0 <= self.test_fraction < 1, "must be in [0, 1)"),
            "rows_per_shard": (in_range(self.rows_per_shard, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
            "max_problem_chars": (in_range(self.max_problem_chars, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
        })
